"""The text report's sections of the run: what was run, the peak and each device's, the ranks,
the run's processes, trace settings, budget and events, traced versus observed, the processes'
table, the memory queries (analyze/documents/report/run.py makes their data)."""

from __future__ import annotations

import os
from collections.abc import Callable

from ...analyze.documents.report_types import Report, ReportPython
from ...units import printable, shell_quote
from ..observed import render_observed
from ..text import end_label, plural, secs_text, size_text, table
from .lines import Lines
from .words import limits_text, status_text, versions_text


def text_title(r: Report, o: Lines) -> None:
    """What was run, and how it was traced where that changes what the report can say."""
    w = o.L.append
    w("cudatrace report: {}".format(r["path"]))
    o.mark("title")
    if r["command"]:
        w("  command     {}".format(shell_quote(r["command"])))
    sim = (r.get("versions") or {}).get("simulated")
    if sim:
        w(
            f"  driver      cudatrace's simulated CUDA driver (--simulated: one device of {size_text(sim)}): "
            "no GPU was used"
        )
    if r.get("aggregate"):
        w(
            "  aggregate   an --aggregate trace: exact at each peak and at the end, without the "
            "timeline between them (docs/aggregate.md)"
        )
    w("")


def text_run(r: Report, o: Lines) -> None:
    """The run: processes, trace settings, budget, events, Python."""
    w = o.L.append
    w("The run:")
    o.mark("heading")
    procs = r["processes"]
    w(
        "  processes   %d traced%s"
        % (len(procs), ", %d truncated" % len(r["truncated_files"]) if r["truncated_files"] else "")
    )
    for p in procs:
        w(
            "    pid %-7d ppid %-7d %-24s %s  [%s]"
            % (
                p["pid"],
                p["ppid"],
                printable(os.path.basename(p["exe"])) or "?",
                status_text(p, r),
                p["file"],
            )
        )
    w("  trace       {}".format(versions_text(r["versions"])))
    b = r["budget"]
    if b:
        spec = b.get("spec")
        if isinstance(spec, dict):  # run.json's budget record: its spec, if any
            spec = spec.get("spec")
        lim = limits_text(b["limits"]) or (f"spec {spec}" if spec else "no limit set")
        w(
            "  budget      {} (over budget: {}{}{}{})".format(
                lim,
                b.get("on_exceed") or "?",
                "; group {}".format(b["group"]) if b.get("group") else "",
                "; share of {}".format(b["share"]) if b.get("share") else "",
                "; the run was aborted" if b.get("aborted") else "",
            )
        )
        if b.get("contexts"):
            w(
                "  contexts    {} of CUDA context counted by the budget beside the allocations".format(
                    limits_text(b["contexts"])
                )
            )
    else:
        w("  budget      none")
    c = r["counts"]
    w(
        "  events      {:,} over {}; {:,} device allocations, {:,} frees, {:,} failed, {:,} denied".format(
            c.get("events", 0),
            secs_text(r["duration"]),
            c.get("allocs", 0),
            c.get("frees", 0),
            c.get("failed", 0),
            c.get("denied", 0),
        )
    )
    _render_python(r.get("python"), w)
    w("")


def text_peak(r: Report, o: Lines) -> None:
    """The peak, per device, and what was live at exit."""
    w = o.L.append
    n = len(o.L)
    dev_note = " on device %d" % r["device"] if r["device"] is not None else ""
    budget = r.get("budget")
    beyond = budget.get("beyond_traces") if budget else None
    beyond_peak = beyond["peak_bytes"] if beyond else 0
    if r["peak_time"] is None and any(p.get("stopped") for p in r["processes"]):
        w(f"No device memory allocation was recorded{dev_note}: a trace stopped (see below).")
    elif r["peak_time"] is None and beyond_peak:
        w(
            f"No device memory allocation was recorded{dev_note}: a process could not record its trace, "
            f"and the budget ledger saw {size_text(beyond_peak)} in use at its peak (see the notes)."
        )
    elif r["peak_time"] is None:
        w(f"No device memory was allocated through the hooked driver API{dev_note}.")
    else:
        w(
            "Peak{}: {} of device memory live at {}".format(
                dev_note, size_text(r["peak_bytes"]), secs_text(r["peak_time"])
            )
        )
        if r.get("peak_scope") == "device":
            w(
                "  (the most one device held: in this run a device ordinal names several "
                "devices, so peaks are per device)"
            )
        if len(r["devices"]) > 1 or r["device"] is None:
            for d in r["devices"]:
                w(
                    "  device %-3s peak %10s at %-12s at exit %10s  %s%s"
                    % (
                        ("%s:%s" % (d["host"], d["label"]))
                        if "host" in d
                        else (d["device"] if d["device"] >= 0 else "?"),
                        size_text(d["peak_bytes"]),
                        secs_text(d["peak_time"]),
                        size_text(d["end_bytes"]),
                        plural(d["allocs"], "allocation"),
                        "  budget {}".format(size_text(d["budget"])) if d.get("budget") else "",
                    )
                )
        w(
            "  {}: {}; pinned host memory peak {}".format(
                end_label(sum(1 for p in r["processes"] if p["allocs"])),
                size_text(r["end_bytes"]),
                size_text(r["host_pinned"]["peak_bytes"]),
            )
        )
    o.styles[n] = "title"
    w("")


def text_ranks(r: Report, o: Lines) -> None:
    """Many ranks (docs/ranks.md): per-rank peaks, the rank that stands out, sites across ranks."""
    ranks = r.get("ranks")
    if ranks:
        from ..ranks import render_ranks

        o.L.extend(render_ranks(ranks, o.width))
        o.L.append("")


def text_observed(r: Report, o: Lines) -> None:
    """Traced versus observed (NVML, MemAvailable, RSS)."""
    w = o.L.append
    o.styles[len(o.L)] = "heading"
    render_observed(r, w)
    w("")


def text_processes(r: Report, o: Lines) -> None:
    """One row per process when there are several or one did not end cleanly."""
    w = o.L.append
    L = o.L
    procs = r["processes"]
    at = r["at"]
    if len(procs) > 1 or any(p["status"] != "complete" for p in procs):
        w("Processes:")
        o.mark("heading")
        rows = [
            [
                "pid",
                "ppid",
                "exe",
                "allocs",
                "peak",
                "at {}".format(at["kind"]),
                "at exit",
                "failed",
                "denied",
                "status",
            ]
        ]
        for p in procs:
            rows.append(
                [
                    str(p["pid"]),
                    str(p["ppid"]),
                    printable(os.path.basename(p["exe"])) or "?",
                    str(p["allocs"]),
                    size_text(p["peak_bytes"]),
                    size_text(p["at_bytes"]),
                    size_text(p["end_bytes"]),
                    str(p["failed"]),
                    str(p["denied"]),
                    p["status"],
                ]
            )
        L.extend(table(rows, {0, 1, 3, 4, 5, 6, 7, 8}))
        w("")


def text_queries(r: Report, o: Lines) -> None:
    """The memory queries (cuMemGetInfo, NVML) and whether the budget answered them."""
    w = o.L.append
    mq = r["memory_queries"]
    if mq["count"]:
        w(
            "Memory queries seen: %d (%s)"
            % (mq["count"], ", ".join("%s x%d" % kv for kv in mq["by_api"].items()))
        )
        o.mark("heading")
        last = mq["last"]
        if last:
            s = "  last: {} at {} told free {} of {}".format(
                last["api"],
                secs_text(last["time"]),
                size_text(last["free"]),
                size_text(last["total"]),
            )
            if last["virtualized"]:
                s += " (virtualized by the budget; the device said free {} of {})".format(
                    size_text(last["device_free"]),
                    size_text(last["device_total"]),
                )
            w(s)
        if mq["virtualized"]:
            w(
                "  %d of them answered with the budget instead of the device's figures"
                % mq["virtualized"]
            )
        else:
            w("  none was virtualized: callers saw the device's own figures")
    else:
        w("Memory queries seen: none (no cuMemGetInfo / NVML memory query was traced)")
    w("")


def _render_python(py: ReportPython | None, w: Callable[[str], object]) -> None:
    if not py:
        return
    vers = sorted({"{} ({})".format(p["version"], p["status"]) for p in py["processes"]})
    w("  python      CPython {}; {} view".format(", ".join(vers), py["view"]))
    w("              {:,} device allocations with Python frames".format(py["allocs_with_frames"]))
    for why, n in sorted(py["allocs_without_frames"].items(), key=lambda x: -x[1]):
        w(f"              {n:,} without: {why}")
