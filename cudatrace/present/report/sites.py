"""The text report's sections of its sites: those live at the moment with their routes, failed
allocations and budget denials, what was never freed, the call stacks of the top sites
(analyze/documents/report/sites.py makes their data)."""

from __future__ import annotations

from ...analyze.documents.analysis import CONTEXT_FRAMES
from ...analyze.documents.report_types import Report
from ..text import percent, plural, secs_text, size_text, table
from .lines import Lines
from .words import frame_label, is_cuda, requests_text, trim_context, via_text


def text_sites(r: Report, o: Lines) -> None:
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


def text_stacks(r: Report, o: Lines) -> None:
    """The call stacks of the top sites."""
    w = o.L.append
    wf = o.wf
    full = o.full
    top_context = o.top_context
    ctx = [s for s in r["sites"][:top_context] if s["context"]]
    if ctx and r["by"] in ("site", "library"):
        folded = not any(is_cuda(f) for s in ctx for f in s["context"])
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
            ctxf = trim_context(s["context"])
            nvia = len(s.get("via") or [])
            shown = CONTEXT_FRAMES + nvia
            for k, f in enumerate(ctxf[:shown]):
                mark = "  [layer]" if k < nvia else ("  <- the site" if k == nvia and nvia else "")
                wf(
                    "      {} {}{}".format(
                        "at  " if k == 0 else "from", frame_label(f, full=full), mark
                    )
                )
            if len(ctxf) > shown:
                w("      ...")
        w("")


def text_never_freed(r: Report, o: Lines) -> None:
    """What was never freed by exit."""
    w = o.L.append
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
        o.L.extend(table(rows, {0, 1}, width=o.width))
        if nf["more_sites"]:
            w("  ... and %d more sites" % nf["more_sites"])
    else:
        w("Never freed by exit: nothing (every traced allocation was freed)")
    w("")


def text_failures(r: Report, o: Lines) -> None:
    """Failed allocations and budget denials, each at its site."""
    w = o.L.append
    wf = o.wf
    full = o.full
    if r["failed"]:
        w("Failed allocations: %d" % sum(f["count"] for f in r["failed"]))
        o.mark("alert")
        for f in r["failed"]:
            errs = ", ".join("%s x%d" % (e["name"], e["count"]) for e in f["errors"])
            w("  {}, first at {}: {}".format(requests_text(f), secs_text(f["first_time"]), errs))
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
                    requests_text(d),
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
