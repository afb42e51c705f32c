"""`cudatrace report` as text: rendered from the report's data (analyze/analysis.py
build_report, the JSON of --json), so text and JSON never disagree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from ..analyze.analysis import CONTEXT_FRAMES
from ..analyze.documents import (
    Report,
    ReportDenied,
    ReportFailed,
    ReportFrame,
    ReportProcess,
    ReportPython,
    ReportSite,
)
from ..analyze.names import fit, on_terminal
from ..analyze.sites import SFrame, folded
from ..units import printable, shell_quote, wrap_line
from .observed import render_observed
from .text import (
    end_label,
    percent,
    plural,
    secs_text,
    size_text,
    styled,
    table,
    term_width,
)

CONTEXT_SITES = 5  # sites whose call stacks are listed


# ---- text ----------------------------------------------------------------------------------


def driver_text(v: object) -> str:
    if isinstance(v, int) and v >= 1000:
        return "CUDA %d.%d (%d)" % (v // 1000, (v % 1000) // 10, v)
    return str(v)


def _sframe(d: ReportFrame) -> SFrame:
    return SFrame(
        d["module"],
        d["function"],
        d["file"],
        d["line"],
        d["address"],
        d.get("offset", 0),
        d.get("inlined", False),
    )


def _frame_label(d: ReportFrame, with_module: bool = True, full: bool = False) -> str:
    f = _sframe(d)
    lab = f.long_label(full) if with_module else f.label(full)
    return lab + ("  (inlined)" if f.inlined else "")


def via_text(site: ReportSite | ReportFailed | ReportDenied, full: bool = False) -> str:
    """The folded layers, outermost first, then the API: `tensor_new > backend > cuMemAlloc_v2`."""
    chain = [_sframe(f).name(full) for f in reversed(site.get("via") or [])]
    return " > ".join(chain)


def status_text(p: ReportProcess, r: Report) -> str:
    """How a process's trace ended, in words that never contradict each other (the text report
    and the HTML page say it alike)."""
    st, code = p["status"], p["exit_code"]
    if st == "exec":
        return "replaced by exec (complete up to it)"
    if st == "complete":
        if code not in (None, -1):
            return f"complete, exit {code}"
        pids = {q["pid"] for q in r["processes"]}
        if (
            p["ppid"] not in pids
            and p.get("exec_index", 0) == 0
            and r.get("exit_status") is not None
        ):
            return "complete, exit {} (as the launcher saw it)".format(r["exit_status"])
        return "complete (its exit status was not seen: no hooked call came after main began)"
    if p.get("stopped"):
        if code is not None:
            return "trace stopped ({}); the process exited with status {}".format(
                p["stopped"], code
            )
        return "trace stopped ({}); no exit record".format(p["stopped"])
    sig = p.get("signal")
    if sig:
        name = _signal_name(sig)
        when = (
            " at {}".format(secs_text(p["ended_time"])) if p.get("ended_time") is not None else ""
        )
        return f"killed by signal {sig}{name}{when}, as the launcher saw it (no exit record)"
    if p.get("ended_time") is not None:
        return "killed or crashed (no exit record); ended at {} as the launcher saw it".format(
            secs_text(p["ended_time"])
        )
    return "truncated (no clean exit record: killed, crashed or still running)"


def _signal_name(sig: int) -> str:
    """' (SIGKILL)', or nothing for a number Python does not name."""
    import signal

    try:
        return f" ({signal.Signals(sig).name})"
    except ValueError:
        return ""


def limits_text(limits: Mapping[str, int]) -> str:
    """'12.0 GiB on each of devices 0-15', '8.00 GiB on device 0, 4.00 GiB on device 1'"""
    by: dict[int, list[int]] = {}
    for d, v in limits.items():
        by.setdefault(v, []).append(int(d))
    parts = []
    if len(by) == 1 and len(limits) >= 16:  # a bare size: the ledger holds it for every index
        return f"{size_text(next(iter(by)))} on every device"
    for v, devs in sorted(by.items(), key=lambda kv: min(kv[1])):
        devs.sort()
        if len(devs) == 1:
            parts.append("%s on device %d" % (size_text(v), devs[0]))
        elif devs == list(range(devs[0], devs[-1] + 1)):
            parts.append("%s on each of devices %d-%d" % (size_text(v), devs[0], devs[-1]))
        else:
            parts.append("{} on each of devices {}".format(size_text(v), ",".join(map(str, devs))))
    return ", ".join(parts)


def _requests_text(f: ReportFailed | ReportDenied) -> str:
    """'2 x 40.00 MiB requested', or '3 requested (1.00 MiB .. 4.00 MiB, 6.00 MiB in all)':
    bytes is the site's total, never one request's size."""
    z = f.get("sizes") or {}
    if f["count"] == 1 or (z and z.get("min") == z.get("max")):
        each = z.get("min") if z else f["bytes"] // max(1, f["count"])
        return "%d x %s requested" % (f["count"], size_text(each))
    return "%d requested (%s .. %s, %s in all)" % (
        f["count"],
        size_text(z.get("min")),
        size_text(z.get("max")),
        size_text(f["bytes"]),
    )


def _trim_context(frames: list[ReportFrame]) -> list[ReportFrame]:
    """Frames up to main (what lies beyond it is the C runtime starting the program)."""
    for i, f in enumerate(frames):
        if f.get("function") == "main":
            return frames[: i + 1]
    return frames


def _is_cuda(d: ReportFrame) -> bool:
    return folded(
        SFrame(
            d["module"],
            d["function"],
            d["file"],
            d["line"],
            d["address"],
            d.get("offset", 0),
            d.get("inlined", False),
        )
    )


def render_text(
    r: Report,
    top_context: int = CONTEXT_SITES,
    width: int | None = None,
    colour: bool = False,
    terminal: bool | None = None,
) -> str:
    """The text report from its dict (build_report), section by section: the answer first
    (the peak, the sites live then, failures, what was never freed, their call stacks), the
    run's details after. colour: ANSI styles for a terminal (text.use_colour); on a terminal
    (None: stdout is one) its prose is wrapped at the width (text.wrap_prose)."""
    o = _Lines(width or term_width(), bool((r.get("attribution") or {}).get("full_names")))
    o.top_context = top_context
    for section in SECTIONS:
        section(r, o)
    while o.L and not o.L[-1]:
        o.L.pop()
    wrap = on_terminal() if terminal is None else terminal
    # whatever a trace held (argv, paths, names) reaches the terminal escaped, then styled
    return (
        "\n".join(
            styled(piece, o.styles.get(i), colour)
            for i, x in enumerate(o.L)
            for piece in (wrap_line(printable(x), o.width) if wrap else [printable(x)])
        )
        + "\n"
    )


class _Lines:
    """The lines of a text report being written, and how: the width, full names or not, and
    the style of the lines that carry the answer (shown on a terminal only)."""

    def __init__(self, width: int, full: bool):
        self.L: list[str] = []
        self.width = width
        self.full = full
        self.top_context = CONTEXT_SITES
        self.styles: dict[int, str] = {}  # line index -> style (text.STYLES)

    def wf(self, line: str) -> None:  # a line that names code: cut to the terminal, never wrapped
        self.L.append(fit(line, self.width))

    def mark(self, style: str) -> None:
        """Style the last line written."""
        self.styles[len(self.L) - 1] = style


def _text_title(r: Report, o: _Lines) -> None:
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


def _text_run(r: Report, o: _Lines) -> None:
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
    v = r["versions"]
    parts = ["{} frames per event".format("/".join(str(d) for d in v["stack_depth"]))]
    if v["driver"]:
        parts.append("driver {}".format(", ".join(driver_text(d) for d in v["driver"])))
    if v.get("nvml_driver"):
        parts.append("NVML driver {}".format(v["nvml_driver"]))
    if v["shim"]:
        parts.append("shim {}".format(", ".join(v["shim"])))
    w("  trace       {}".format("; ".join(parts)))
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


def _text_peak(r: Report, o: _Lines) -> None:
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


def _text_ranks(r: Report, o: _Lines) -> None:
    """Many ranks (docs/ranks.md): per-rank peaks, the rank that stands out, sites across ranks."""
    ranks = r.get("ranks")
    if ranks:
        from .ranks import render_ranks

        o.L.extend(render_ranks(ranks, o.width))
        o.L.append("")


def _text_observed(r: Report, o: _Lines) -> None:
    """Traced versus observed (NVML, MemAvailable, RSS)."""
    w = o.L.append
    o.styles[len(o.L)] = "heading"
    render_observed(r, w)
    w("")


def _text_sites(r: Report, o: _Lines) -> None:
    """The sites (or APIs, libraries, processes) live at the moment, with their routes."""
    w = o.L.append
    wf = o.wf
    L = o.L
    width = o.width
    full = o.full
    procs = r["processes"]
    at = r["at"]
    when = {
        "peak": "at the peak ({})".format(secs_text(at["time"])),
        "end": "at the end ({})".format(secs_text(at["time"])),
        "time": "at {}".format(secs_text(at["time"])),
    }[at["kind"]]
    if r.get("peak_scope") == "device" and at["kind"] == "peak":
        when = "when all ranks together held the most ({}; summed over {} devices)".format(
            secs_text(at["time"]), len(r["devices"])
        )
    if (
        at["kind"] == "time"
        and at["time"] is not None
        and r["duration"] is not None
        and at["time"] > r["duration"]
    ):
        when += " (after the last event, at {}: what was live then)".format(
            secs_text(r["duration"])
        )
    by = {
        "site": "call site",
        "api": "API",
        "library": "library",
        "process": "process",
        "rank": "rank",
    }[r["by"]]
    w(
        "Device memory live {} by {}: {} in {}".format(
            when, by, size_text(r["total_live_bytes"]), plural(r["total_live_count"], "allocation")
        )
    )
    o.mark("heading")
    if not r["sites"]:
        w("  (nothing live)")
    rows = [["bytes", "share", "count", "min / median / max", by]]
    for s in r["sites"]:
        z = s["sizes"]
        rows.append(
            [
                size_text(s["bytes"]),
                percent(s["share"]),
                "{:,}".format(s["count"]),
                "{} / {} / {}".format(
                    size_text(z.get("min")), size_text(z.get("median")), size_text(z.get("max"))
                ),
                "#%d %s" % (s["rank"], s["label"]),
            ]
        )
    if r["sites"]:
        for i, line in enumerate(table(rows, {0, 1, 2}, width=width)):
            L.append(line)
            if i == 1:
                o.mark("top")
            if i:
                s = r["sites"][i - 1]
                extra = ", ".join(s["api"][:3]) + (" ..." if len(s["api"]) > 3 else "")
                layers = via_text(s, full)
                if layers:
                    extra = f"{layers} > {extra}"
                more = []
                if len(procs) > 1:
                    more.append("pid {}".format(",".join(str(p) for p in s["pids"])))
                if len(r["devices"]) > 1 or (s["devices"] and s["devices"] != [0]):
                    # the physical devices, as the ranks table names them (--by rank: each
                    # rank's own GPU, not the ordinal 0 every rank sees)
                    devs = s.get("device_labels") or [str(d) for d in s["devices"]]
                    more.append("device {}".format(",".join(devs)))
                wf("        via {}{}".format(extra, ("; " + "; ".join(more)) if more else ""))
                o.mark("dim")
    if r["more_sites"]:
        w("  ... and %d more (--top)" % r["more_sites"])
    w("")


def _text_stacks(r: Report, o: _Lines) -> None:
    """The call stacks of the top sites."""
    w = o.L.append
    wf = o.wf
    full = o.full
    top_context = o.top_context
    ctx = [s for s in r["sites"][:top_context] if s["context"]]
    if ctx and r["by"] in ("site", "library"):
        folded = not any(_is_cuda(f) for s in ctx for f in s["context"])
        w(
            "Call stacks of the top sites (innermost first%s):"
            % ("; CUDA's own frames folded" if folded else "")
        )
        o.mark("heading")
        for s in ctx:
            w(
                "  #%d  %s in %s"
                % (s["rank"], size_text(s["bytes"]), plural(s["count"], "allocation"))
            )
            ctxf = _trim_context(s["context"])
            nvia = len(s.get("via") or [])
            shown = CONTEXT_FRAMES + nvia
            for k, f in enumerate(ctxf[:shown]):
                mark = "  [layer]" if k < nvia else ("  <- the site" if k == nvia and nvia else "")
                wf(
                    "      {} {}{}".format(
                        "at  " if k == 0 else "from", _frame_label(f, full=full), mark
                    )
                )
            if len(ctxf) > shown:
                w("      ...")
        w("")


def _text_never_freed(r: Report, o: _Lines) -> None:
    """What was never freed by exit."""
    w = o.L.append
    L = o.L
    width = o.width
    nf = r["never_freed"]
    if nf["count"]:
        trunc = (
            (
                " ({} of it in truncated traces: live when their writing stopped)".format(
                    size_text(nf["in_truncated_bytes"])
                )
            )
            if nf.get("in_truncated_bytes")
            else ""
        )
        w(
            "Never freed by exit: {} in {}{}".format(
                size_text(nf["bytes"]), plural(nf["count"], "allocation"), trunc
            )
        )
        o.mark("warn")
        rows = [["bytes", "count", "site"]]
        for s in nf["sites"]:
            rows.append(
                [
                    size_text(s["bytes"]),
                    "{:,}".format(s["count"]),
                    "#%d %s" % (s["rank"], s["label"]),
                ]
            )
        L.extend(table(rows, {0, 1}, width=width))
        if nf["more_sites"]:
            w("  ... and %d more sites" % nf["more_sites"])
    else:
        w("Never freed by exit: nothing (every traced allocation was freed)")
    w("")


def _text_failures(r: Report, o: _Lines) -> None:
    """Failed allocations and budget denials, each at its site."""
    w = o.L.append
    wf = o.wf
    full = o.full
    if r["failed"]:
        w("Failed allocations: %d" % sum(f["count"] for f in r["failed"]))
        o.mark("alert")
        for f in r["failed"]:
            errs = ", ".join("%s x%d" % (e["name"], e["count"]) for e in f["errors"])
            w("  {}, first at {}: {}".format(_requests_text(f), secs_text(f["first_time"]), errs))
            wf(
                "      at {} via {}".format(
                    f["label"], " > ".join(x for x in (via_text(f, full), ", ".join(f["api"])) if x)
                )
            )
        w("")
    if r["denied"]:
        w("Budget denials: %d" % sum(d["count"] for d in r["denied"]))
        o.mark("alert")
        for d in r["denied"]:
            w(
                "  {}, first at {} (last: in use {} of a {} budget)".format(
                    _requests_text(d),
                    secs_text(d["first_time"]),
                    size_text(d["in_use"]),
                    size_text(d["limit"]),
                )
            )
            wf(
                "      at {} via {}".format(
                    d["label"], " > ".join(x for x in (via_text(d, full), ", ".join(d["api"])) if x)
                )
            )
        w("")


def _text_processes(r: Report, o: _Lines) -> None:
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


def _text_queries(r: Report, o: _Lines) -> None:
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


def _text_trailer(r: Report, o: _Lines) -> None:
    """Truncated, lost and unreadable files; notes."""
    w = o.L.append
    if r["truncated_files"]:
        w("Truncated trace files:")
        o.mark("alert")
        for t in r["truncated_files"]:
            w("  %s (pid %d, %d events): %s" % (t["file"], t["pid"], t["events"], t["reason"]))
        w("")
    if r.get("lost"):
        w("Events lost (the trace could not be written; the program ran on untraced):")
        o.mark("alert")
        for x in r["lost"]:
            w(
                "  pid %d from %s on: %s  [%s]"
                % (x["pid"], secs_text(x["from_time"]), x["why"], x["file"])
            )
        w("")
    if r.get("lost_chunks"):
        w("Trace data lost (sealed chunks in neither the trace nor its sidecar; in no figure):")
        for lc in r["lost_chunks"]:
            w(
                "  pid %d: %d chunk(s), %s (chunks %s)  [%s]"
                % (
                    lc["pid"],
                    len(lc["chunks"]),
                    size_text(lc["bytes"]),
                    ", ".join(map(str, lc["chunks"])),
                    lc["file"],
                )
            )
        w("")
    if r["unreadable_files"]:
        w("Unreadable files:")
        o.mark("alert")
        for e in r["unreadable_files"]:
            w(f"  {e}")
        w("")
    if r["warnings"]:
        w("Notes:")
        o.mark("heading")
        for note in r["warnings"]:
            w(f"  - {note}")


# the report's sections in order (each pairs with a part of build_report's dict): the answer
# (the peak, who held it, what failed, what stayed), then how it came about and the details
SECTIONS = (
    _text_title,
    _text_peak,
    _text_sites,
    _text_failures,
    _text_never_freed,
    _text_stacks,
    _text_ranks,
    _text_run,
    _text_observed,
    _text_processes,
    _text_queries,
    _text_trailer,
)


def _render_python(py: ReportPython | None, w: Callable[[str], object]) -> None:
    if not py:
        return
    vers = sorted({"{} ({})".format(p["version"], p["status"]) for p in py["processes"]})
    w("  python      CPython {}; {} view".format(", ".join(vers), py["view"]))
    w("              {:,} device allocations with Python frames".format(py["allocs_with_frames"]))
    for why, n in sorted(py["allocs_without_frames"].items(), key=lambda x: -x[1]):
        w(f"              {n:,} without: {why}")
