"""`cudatrace report` as text: rendered from the report's data (analyze/analysis.py
build_report, the JSON of --json), so text and JSON never disagree.
"""
from __future__ import annotations

import os


from ..analyze.analysis import CONTEXT_FRAMES
from ..analyze.sites import SFrame, folded
from ..analyze.names import fit
from ..units import printable, shell_quote
from .text import percent, plural, secs_text, size_text, table, term_width

CONTEXT_SITES = 5          # sites whose call stacks are listed


# ---- text ----------------------------------------------------------------------------------

def driver_text(v) -> str:
    if isinstance(v, int) and v >= 1000:
        return "CUDA %d.%d (%d)" % (v // 1000, (v % 1000) // 10, v)
    return str(v)


def _sframe(d: dict) -> SFrame:
    return SFrame(d["module"], d["function"], d["file"], d["line"], d["address"],
                  d.get("offset", 0), d.get("inlined", False))


def _frame_label(d: dict, with_module: bool = True, full: bool = False) -> str:
    f = _sframe(d)
    lab = f.long_label(full) if with_module else f.label(full)
    return lab + ("  (inlined)" if f.inlined else "")


def via_text(site: dict, full: bool = False) -> str:
    """The folded layers, outermost first, then the API: `tensor_new > backend > cuMemAlloc_v2`."""
    chain = [_sframe(f).name(full) for f in reversed(site.get("via") or [])]
    return " > ".join(chain)


def _limits_text(limits: dict) -> str:
    """'12.0 GiB on each of devices 0-15', '8.00 GiB on device 0, 4.00 GiB on device 1'"""
    by: dict[int, list[int]] = {}
    for d, v in limits.items():
        by.setdefault(v, []).append(int(d))
    parts = []
    if len(by) == 1 and len(limits) >= 16:      # a bare size: the ledger holds it for every index
        return "%s on every device" % size_text(next(iter(by)))
    for v, devs in sorted(by.items(), key=lambda kv: min(kv[1])):
        devs.sort()
        if len(devs) == 1:
            parts.append("%s on device %d" % (size_text(v), devs[0]))
        elif devs == list(range(devs[0], devs[-1] + 1)):
            parts.append("%s on each of devices %d-%d" % (size_text(v), devs[0], devs[-1]))
        else:
            parts.append("%s on each of devices %s" % (size_text(v), ",".join(map(str, devs))))
    return ", ".join(parts)


def _requests_text(f: dict) -> str:
    """'2 x 40.00 MiB requested', or '3 requested (1.00 MiB .. 4.00 MiB, 6.00 MiB in all)':
    bytes is the site's total, never one request's size."""
    z = f.get("sizes") or {}
    if f["count"] == 1 or (z and z.get("min") == z.get("max")):
        each = z.get("min") if z else f["bytes"] // max(1, f["count"])
        return "%d x %s requested" % (f["count"], size_text(each))
    return "%d requested (%s .. %s, %s in all)" % (f["count"], size_text(z.get("min")),
                                                    size_text(z.get("max")), size_text(f["bytes"]))


def _trim_context(frames: list[dict]) -> list[dict]:
    """Frames up to main (what lies beyond it is the C runtime starting the program)."""
    for i, f in enumerate(frames):
        if f.get("function") == "main":
            return frames[:i + 1]
    return frames


def _is_cuda(d: dict) -> bool:
    return folded(SFrame(d["module"], d["function"], d["file"], d["line"], d["address"],
                         d.get("offset", 0), d.get("inlined", False)))


def render_text(r: dict, top_context: int = CONTEXT_SITES, width: int | None = None) -> str:
    L: list[str] = []
    width = width or term_width()
    full = bool((r.get("attribution") or {}).get("full_names"))

    w = L.append

    def wf(line: str) -> None:  # a line that names code: cut to the terminal, never wrapped
        L.append(fit(line, width))
    w("cudatrace report: %s" % r["path"])
    if r["command"]:
        w("  command     %s" % shell_quote(r["command"]))
    procs = r["processes"]
    w("  processes   %d traced%s" % (len(procs), ", %d truncated" % len(r["truncated_files"])
                                     if r["truncated_files"] else ""))
    for p in procs:
        st = p["status"]
        if p["status"] == "complete":
            st += ", exit %s" % p["exit_code"] if p["exit_code"] not in (None, -1) else \
                " (exit status not recorded)"
        else:
            st += " (no clean exit record: killed, crashed or still running)"
        w("    pid %-7d ppid %-7d %-24s %s  [%s]" % (p["pid"], p["ppid"], printable(os.path.basename(p["exe"])) or "?",
                                                      st, p["file"]))
    v = r["versions"]
    parts = ["%s frames per event" % "/".join(str(d) for d in v["stack_depth"])]
    if v["driver"]:
        parts.append("driver %s" % ", ".join(driver_text(d) for d in v["driver"]))
    if v.get("nvml_driver"):
        parts.append("NVML driver %s" % v["nvml_driver"])
    if v["shim"]:
        parts.append("shim %s" % ", ".join(v["shim"]))
    w("  trace       %s" % "; ".join(parts))
    b = r["budget"]
    if b:
        spec = b.get("spec")
        if isinstance(spec, dict):          # run.json's budget record: its spec, if any
            spec = spec.get("spec")
        lim = _limits_text(b["limits"]) or ("spec %s" % spec if spec else "no limit set")
        w("  budget      %s (over budget: %s%s%s)" % (lim, b.get("on_exceed") or "?",
                                                    "; group %s" % b["group"] if b.get("group") else "",
                                                    "; the run was aborted" if b.get("aborted") else ""))
        if b.get("contexts"):
            w("  contexts    %s of CUDA context counted by the budget beside the allocations"
              % _limits_text(b["contexts"]))
    else:
        w("  budget      none")
    c = r["counts"]
    w("  events      {:,} over {}; {:,} device allocations, {:,} frees, {:,} failed, {:,} denied".format(
        c.get("events", 0), secs_text(r["duration"]), c.get("allocs", 0), c.get("frees", 0),
        c.get("failed", 0), c.get("denied", 0)))
    _render_python(r.get("python"), w)
    w("")

    # peak
    dev_note = " on device %d" % r["device"] if r["device"] is not None else ""
    if r["peak_time"] is None:
        w("No device memory was allocated through the hooked driver API%s." % dev_note)
    else:
        w("Peak%s: %s of device memory live at %s" % (dev_note, size_text(r["peak_bytes"]), secs_text(r["peak_time"])))
        if len(r["devices"]) > 1 or r["device"] is None:
            for d in r["devices"]:
                w("  device %-3s peak %10s at %-12s at exit %10s  %s%s"
                  % (d["device"] if d["device"] >= 0 else "?", size_text(d["peak_bytes"]), secs_text(d["peak_time"]),
                     size_text(d["end_bytes"]), plural(d["allocs"], "allocation"),
                     "  budget %s" % size_text(d["budget"]) if d.get("budget") else ""))
        w("  live at exit: %s; pinned host memory peak %s" % (size_text(r["end_bytes"]),
                                                            size_text(r["host_pinned"]["peak_bytes"])))
    w("")

    # traced versus observed
    _render_observed(r, w)
    w("")

    # sites
    at = r["at"]
    when = {"peak": "at the peak (%s)" % secs_text(at["time"]), "end": "at the end (%s)" % secs_text(at["time"]),
            "time": "at %s" % secs_text(at["time"])}[at["kind"]]
    if at["kind"] == "time" and at["time"] is not None and r["duration"] is not None and \
            at["time"] > r["duration"]:
        when += " (after the last event, at %s: what was live then)" % secs_text(r["duration"])
    by = {"site": "call site", "api": "API", "library": "library", "process": "process"}[r["by"]]
    w("Device memory live %s by %s: %s in %s" % (when, by, size_text(r["total_live_bytes"]),
                                                plural(r["total_live_count"], "allocation")))
    if not r["sites"]:
        w("  (nothing live)")
    rows = [["bytes", "share", "count", "min / median / max", by]]
    for s in r["sites"]:
        z = s["sizes"]
        rows.append([size_text(s["bytes"]), percent(s["share"]), "{:,}".format(s["count"]),
                     "%s / %s / %s" % (size_text(z.get("min")), size_text(z.get("median")), size_text(z.get("max"))),
                     "#%d %s" % (s["rank"], s["label"])])
    if r["sites"]:
        for i, line in enumerate(table(rows, {0, 1, 2}, width=width)):
            L.append(line)
            if i:
                s = r["sites"][i - 1]
                extra = ", ".join(s["api"][:3]) + (" ..." if len(s["api"]) > 3 else "")
                layers = via_text(s, full)
                if layers:
                    extra = "%s > %s" % (layers, extra)
                more = []
                if len(procs) > 1:
                    more.append("pid %s" % ",".join(str(p) for p in s["pids"]))
                if len(r["devices"]) > 1 or (s["devices"] and s["devices"] != [0]):
                    more.append("device %s" % ",".join(str(d) for d in s["devices"]))
                wf("        via %s%s" % (extra, ("; " + "; ".join(more)) if more else ""))
    if r["more_sites"]:
        w("  ... and %d more (--top)" % r["more_sites"])
    w("")

    # call stacks
    ctx = [s for s in r["sites"][:top_context] if s["context"]]
    if ctx and r["by"] in ("site", "library"):
        folded = not any(_is_cuda(f) for s in ctx for f in s["context"])
        w("Call stacks of the top sites (innermost first%s):"
          % ("; CUDA's own frames folded" if folded else ""))
        for s in ctx:
            w("  #%d  %s in %s" % (s["rank"], size_text(s["bytes"]), plural(s["count"], "allocation")))
            ctxf = _trim_context(s["context"])
            nvia = len(s.get("via") or [])
            shown = CONTEXT_FRAMES + nvia
            for k, f in enumerate(ctxf[:shown]):
                mark = "  [layer]" if k < nvia else ("  <- the site" if k == nvia and nvia else "")
                wf("      %s %s%s" % ("at  " if k == 0 else "from", _frame_label(f, full=full), mark))
            if len(ctxf) > shown:
                w("      ...")
        w("")

    # never freed
    nf = r["never_freed"]
    if nf["count"]:
        trunc = (" (%s of it in truncated traces: live when their writing stopped)"
                 % size_text(nf["in_truncated_bytes"])) if nf.get("in_truncated_bytes") else ""
        w("Never freed by exit: %s in %s%s" % (size_text(nf["bytes"]), plural(nf["count"], "allocation"), trunc))
        rows = [["bytes", "count", "site"]]
        for s in nf["sites"]:
            rows.append([size_text(s["bytes"]), "{:,}".format(s["count"]), "#%d %s" % (s["rank"], s["label"])])
        L.extend(table(rows, {0, 1}, width=width))
        if nf["more_sites"]:
            w("  ... and %d more sites" % nf["more_sites"])
    else:
        w("Never freed by exit: nothing (every traced allocation was freed)")
    w("")

    # failures
    if r["failed"]:
        w("Failed allocations: %d" % sum(f["count"] for f in r["failed"]))
        for f in r["failed"]:
            errs = ", ".join("%s x%d" % (e["name"], e["count"]) for e in f["errors"])
            w("  %s, first at %s: %s" % (_requests_text(f), secs_text(f["first_time"]), errs))
            wf("      at %s via %s" % (f["label"], " > ".join(x for x in (via_text(f, full), ", ".join(f["api"])) if x)))
        w("")
    if r["denied"]:
        w("Budget denials: %d" % sum(d["count"] for d in r["denied"]))
        for d in r["denied"]:
            w("  %s, first at %s (last: in use %s of a %s budget)" % (
                _requests_text(d), secs_text(d["first_time"]), size_text(d["in_use"]), size_text(d["limit"])))
            wf("      at %s via %s" % (d["label"], " > ".join(x for x in (via_text(d, full), ", ".join(d["api"])) if x)))
        w("")

    # processes
    if len(procs) > 1 or any(p["status"] != "complete" for p in procs):
        w("Processes:")
        rows = [["pid", "ppid", "exe", "allocs", "peak", "at %s" % at["kind"], "at exit", "failed",
                 "denied", "status"]]
        for p in procs:
            rows.append([str(p["pid"]), str(p["ppid"]), printable(os.path.basename(p["exe"])) or "?",
                         str(p["allocs"]), size_text(p["peak_bytes"]), size_text(p["at_bytes"]), size_text(p["end_bytes"]),
                         str(p["failed"]), str(p["denied"]), p["status"]])
        L.extend(table(rows, {0, 1, 3, 4, 5, 6, 7, 8}))
        w("")

    # memory queries
    mq = r["memory_queries"]
    if mq["count"]:
        w("Memory queries seen: %d (%s)" % (mq["count"], ", ".join("%s x%d" % kv for kv in mq["by_api"].items())))
        last = mq["last"]
        if last:
            s = "  last: %s at %s told free %s of %s" % (last["api"], secs_text(last["time"]), size_text(last["free"]),
                                                          size_text(last["total"]))
            if last["virtualized"]:
                s += " (virtualized by the budget; the device said free %s of %s)" % (
                    size_text(last["device_free"]), size_text(last["device_total"]))
            w(s)
        if mq["virtualized"]:
            w("  %d of them answered with the budget instead of the device's figures" % mq["virtualized"])
        else:
            w("  none was virtualized: callers saw the device's own figures")
    else:
        w("Memory queries seen: none (no cuMemGetInfo / NVML memory query was traced)")
    w("")

    if r["truncated_files"]:
        w("Truncated trace files:")
        for t in r["truncated_files"]:
            w("  %s (pid %d, %d events): %s" % (t["file"], t["pid"], t["events"], t["reason"]))
        w("")
    if r.get("lost"):
        w("Events lost (the trace could not be written; the program ran on untraced):")
        for x in r["lost"]:
            w("  pid %d from %s on: %s  [%s]" % (x["pid"], secs_text(x["from_time"]), x["why"],
                                                x["file"]))
        w("")
    if r["unreadable_files"]:
        w("Unreadable files:")
        for e in r["unreadable_files"]:
            w("  %s" % e)
        w("")
    if r["warnings"]:
        w("Notes:")
        for x in r["warnings"]:
            w("  - %s" % x)
    while L and not L[-1]:
        L.pop()
    # whatever a trace held (argv, paths, names) reaches the terminal escaped
    return "\n".join(printable(x) for x in L) + "\n"


def _render_python(py: dict | None, w) -> None:
    if not py:
        return
    vers = sorted({"%s (%s)" % (p["version"], p["status"]) for p in py["processes"]})
    w("  python      CPython %s; %s view" % (", ".join(vers), py["view"]))
    w("              {:,} device allocations with Python frames".format(py["allocs_with_frames"]))
    for why, n in sorted(py["allocs_without_frames"].items(), key=lambda x: -x[1]):
        w("              {:,} without: {}".format(n, why))


def _render_observed(r: dict, w) -> None:
    o = r["observed"]
    traced_peak = o.get("traced_peak_bytes", r["peak_bytes"])
    if not o["samples"]:
        w("Traced versus observed: not measured (%s)" % (o["nvml_why"] or "no samples"))
        return
    iv = o.get("interval_ms")
    n = "%d sample%s%s" % (o["samples"], "" if o["samples"] == 1 else "s",
                           " every ~%d ms" % round(iv) if iv else "")
    near, mx, base = o["near_peak"], o["max"] or {}, o["baseline"] or {}
    source = ("NVML" if o["per_process"] else "NVML device totals only") if o["nvml"] else \
        "no NVML: %s" % o["nvml_why"]
    if not o["overlap"]:
        w("Traced versus observed (%s; %s):" % (source, n))
        w("  no sample fell while traced memory was live (the run's allocations came and went "
          "between samples): nothing to compare. Traced peak %s." % size_text(traced_peak))
        return
    note = ("  (%s)" % near["note"]) if near.get("note") else None
    if o["nvml"] and o["per_process"]:
        w("Traced versus observed (NVML, %s):" % n)
        if note:
            w(note)
        rows = [["", "traced live", "NVML: process tree", "untraced"]]
        rows.append(["nearest sample to the peak (%+.0f ms)" % near["offset_ms"], size_text(near["traced_bytes"]),
                     size_text(near["tree_device_bytes"]), size_text(near["untraced_bytes"])])
        if mx.get("tree_device_bytes") is not None:
            rows.append(["NVML's highest (at %s)" % secs_text(mx["tree_device_time"]), size_text(mx["traced_bytes_then"]),
                         size_text(mx["tree_device_bytes"]), size_text(mx["untraced_bytes"])])
        for line in table(rows, {1, 2, 3}, "    "):
            w(line)
        w("  traced peak %s. untraced = what NVML counts for the tree that no hook saw: CUDA "
          "contexts, module images, allocator paths not hooked; at most %s (at %s)."
          % (size_text(traced_peak), size_text(mx.get("untraced_max_bytes")), secs_text(mx.get("untraced_max_time"))))
        if any(x is not None and x < 0 for x in (near["untraced_bytes"], mx.get("untraced_bytes"))):
            w("  negative: the trace holds more than NVML showed for the tree (managed memory not "
              "resident yet, NVML's per-process figures lagging or missing a process).")
        if near["device_used"] is not None:
            w("  device used by everyone: %s of %s near the peak; highest %s" % (
                size_text(near["device_used"]), size_text(near["device_total"]), size_text(mx.get("device_used"))))
    elif o["nvml"]:
        w("Traced versus observed (NVML device totals only, %s):" % n)
        if note:
            w(note)
        w("  no per-process figures: %s" % o["per_process_why"])
        w("  traced live %s at the sample nearest the peak (%+.0f ms); device used by everyone %s of "
          "%s there, %s more than at the first sample (other processes count too); highest %s"
          % (size_text(near["traced_bytes"]), near["offset_ms"], size_text(near["device_used"]),
             size_text(near["device_total"]), size_text(near["device_used_rise"]), size_text(mx.get("device_used"))))
    else:
        w("Traced versus observed: no NVML (%s); what the host shows instead (%s):"
          % (o["nvml_why"], n))
        if note:
            w(note)
        w("  traced live %s at the sample nearest the peak (%+.0f ms); traced peak %s"
          % (size_text(near["traced_bytes"]), near["offset_ms"], size_text(traced_peak)))
        if near["mem_available"] is not None:
            w("  MemAvailable %s there, %s at the first sample: a drop of %s (largest drop %s)"
              % (size_text(near["mem_available"]), size_text(base.get("mem_available")), size_text(near["mem_available_drop"]),
                 size_text(mx.get("mem_available_drop"))))
        if near.get("mem_free") is not None:
            w("  MemFree %s there (a drop of %s): what cuMemGetInfo calls free on a unified-memory "
              "device" % (size_text(near["mem_free"]), size_text(near.get("mem_free_drop"))))
        if near["tree_rss"] is not None:
            w("  process tree RSS %s there; highest %s" % (size_text(near["tree_rss"]), size_text(mx.get("tree_rss"))))
        if near.get("tree_pss") is not None:
            w("  process tree PSS %s there; highest %s" % (size_text(near["tree_pss"]),
                                                         size_text(mx.get("tree_pss"))))
        w("  on a unified-memory device (Jetson) device allocations come out of this RAM")


# ---- the command ---------------------------------------------------------------------------
