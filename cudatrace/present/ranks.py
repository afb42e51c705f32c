"""The ranks of a run as text (docs/ranks.md): the per-rank peak table, the outliers, the sites
merged across ranks. Rendered from the report's `ranks` section, like the rest of the report."""

from __future__ import annotations

from ..analyze.documents.report_types import ReportRanks, ReportRanksSite
from ..analyze.sites.names import fit
from .text import plural, ranges, secs_text, size_text, table


def _opt(v: object) -> str:
    return "-" if v is None else str(v)


def site_line(s: ReportRanksSite) -> str:
    """'8 ranks x 12.0 GiB', '7 ranks x 12.0 GiB, rank 5: 20.0 GiB (stands out; ...)',
    '1 of 8 ranks x 2.00 GiB'."""
    odd = {o["label"]: o for o in s["outliers"]}
    rest = [v for k, v in s["per_rank"].items() if k not in odd]
    n, of = s["ranks"], s["of_ranks"]
    who = plural(n, "rank") if n == of else "%d of %s" % (n, plural(of, "rank"))
    each = ""
    if rest:
        lo, hi = min(rest), max(rest)
        each = size_text(lo) if lo == hi else "%s .. %s" % (size_text(lo), size_text(hi))
    if not odd:
        return "%s x %s" % (who, each)
    parts = ["%s x %s" % (len(rest), each)] if rest else []
    for o in s["outliers"]:
        parts.append(
            "%s: %s (stands out; median %s)"
            % (o["label"], size_text(o["bytes"]), size_text(int(o["median_bytes"])))
        )
    return "%s: %s" % (who, ", ".join(parts))


def render_ranks(rk: ReportRanks, width: int) -> list[str]:
    L: list[str] = []
    w = L.append
    ranks = rk["ranks"]
    src = " (from %s)" % ", ".join(rk["sources"]) if rk["sources"] else ""
    w(
        "Ranks: %s on %s%s; each rank's peak is its own processes' bytes at their own "
        "highest moment" % (plural(len(ranks), "rank"), plural(len(rk["hosts"]), "host"), src)
    )
    rows = [
        [
            "rank",
            "host",
            "local",
            "pids",
            "devices",
            "peak",
            "at",
            "at exit",
            "allocs",
            "failed",
            "denied",
            "",
        ]
    ]
    for x in ranks:
        rows.append(
            [
                x["label"],
                x["host"],
                _opt(x["local_rank"]),
                ",".join(str(p) for p in x["pids"]),
                ",".join(x["devices"]) or "-",
                size_text(x["peak_bytes"]),
                secs_text(x["peak_time"]),
                size_text(x["end_bytes"]),
                str(x["allocs"]),
                str(x["failed"]),
                str(x["denied"]),
                "<- stands out" if x["outlier"] else "",
            ]
        )
    L.extend(table(rows, {2, 5, 6, 7, 8, 9, 10}))
    gone = rk.get("missing")
    if gone:
        nums = gone["ranks"]
        which = "rank" if len(nums) == 1 else "ranks"
        w(
            "  missing: %s %s of %d (%s) left no trace: not started, or never reached CUDA under "
            "cudatrace" % (which, ranges(nums), gone["world_size"], gone["variable"] or "?")
        )
    for o in rk["outliers"]:
        w(
            "  %s stands out: peak %s, the ranks' median %s"
            % (o["label"], size_text(o["bytes"]), size_text(int(o["median_bytes"])))
        )
    if len(ranks) >= 3:
        w(
            "  (a rank stands out when farther from the median than 3 scaled MADs, 10% of the "
            "median and 1 MiB: docs/ranks.md)"
        )
    if rk["sites"]:
        w("")
        w("Sites across ranks (each rank at its own peak):")
        for s in rk["sites"]:
            L.append(fit("  %s: %s" % (s["label"], site_line(s)), width))
        if rk["more_sites"]:
            w("  ... and %d more (--top)" % rk["more_sites"])
    return L
