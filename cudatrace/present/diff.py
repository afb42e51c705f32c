"""The text of `cudatrace diff A B` (the data: analyze/documents/diff.py)."""

from __future__ import annotations

from ..analyze.documents.diff_types import Diff
from ..units import format_bytes, printable
from .text import secs_text, size_text, table, term_width, wrap_prose


def _signed(n: int) -> str:
    if n == 0:
        return "0"
    return ("+" if n > 0 else "-") + format_bytes(abs(n))


def _pct(a: int, b: int) -> str:
    if a == 0:
        return "" if b == 0 else " (new)"
    return " (%+.1f%%)" % (100.0 * (b - a) / a)


def render_text(d: Diff) -> str:
    L: list[str] = []
    w = L.append
    A, B, T = d["a"], d["b"], d["totals"]
    w("cudatrace diff")
    w(
        "  A  {}  ({})".format(
            ", ".join(A.get("paths") or [A["path"]]), " ".join(A["command"]) or "?"
        )
    )
    w(
        "  B  {}  ({})".format(
            ", ".join(B.get("paths") or [B["path"]]), " ".join(B["command"]) or "?"
        )
    )
    rows = [
        ["", "A", "B", "change"],
        [
            "peak",
            "{} at {}".format(size_text(A["peak_bytes"]), secs_text(A["peak_time"])),
            "{} at {}".format(size_text(B["peak_bytes"]), secs_text(B["peak_time"])),
            _signed(T["peak_bytes"]["delta"]) + _pct(A["peak_bytes"], B["peak_bytes"]),
        ],
        [
            "live at exit",
            size_text(A["end_bytes"]),
            size_text(B["end_bytes"]),
            _signed(T["end_bytes"]["delta"]) + _pct(A["end_bytes"], B["end_bytes"]),
        ],
        ["allocations", str(A["allocs"]), str(B["allocs"]), "%+d" % T["allocs"]["delta"]],
        ["failed", str(A["failed"]), str(B["failed"]), "%+d" % T["failed"]["delta"]],
        ["denied", str(A["denied"]), str(B["denied"]), "%+d" % T["denied"]["delta"]],
    ]
    L.extend(table(rows, {1, 2, 3}))
    for side, s in (("A", A), ("B", B)):
        if s["truncated_files"]:
            w("  {} has truncated trace files: {}".format(side, ", ".join(s["truncated_files"])))
    c = d["status_counts"]
    w("")
    w(
        "Sites by largest change (live at each run's own peak, and at exit): {}".format(
            ", ".join(
                "%d %s" % (c[k], k) for k in ("grown", "shrunk", "new", "gone", "same") if c[k]
            )
        )
    )
    if len(A.get("paths") or ()) > 1 or len(B.get("paths") or ()) > 1:
        w(
            "  (a run over several directories: a site's bytes are summed over its ranks' "
            "devices; per rank below)"
        )
    L.extend(_site_rows(d))
    if d["more_sites"]:
        w("  ... and %d more (--top)" % d["more_sites"])
    ranks = d.get("ranks")
    if ranks:
        w("")
        w("Ranks (each one's own peak):")
        rows = [["rank", "host", "peak A", "peak B", "change"]]
        for x in ranks:
            rows.append(
                [
                    x["label"],
                    x["host"],
                    size_text(x["a_peak_bytes"]),
                    size_text(x["b_peak_bytes"]),
                    _signed(x["delta_bytes"]),
                ]
            )
        L.extend(table(rows, {2, 3, 4}))
    # whatever a trace held (argv, paths, names) reaches the terminal escaped
    return wrap_prose("\n".join(printable(x) for x in L)) + "\n"


SITE_COLUMNS = [
    "status",
    "peak A",
    "peak B",
    "peak change",
    "allocs change",  # allocations live at the peak, B minus A
    "exit A",
    "exit B",
    "exit change",
    "site",
]


def _site_rows(d: Diff) -> list[str]:
    """The table of the sites' changes (one name per column), or the line saying there is none."""
    if not d["sites"]:
        return ["  (no device allocation in either run)"]
    rows = [SITE_COLUMNS]
    for s in d["sites"]:
        p, e = s["peak"], s["end"]
        rows.append(
            [
                s["status"],
                size_text(p["a_bytes"]),
                size_text(p["b_bytes"]),
                _signed(p["delta_bytes"]),
                "%+d" % p["delta_count"] if p["delta_count"] else "0",
                size_text(e["a_bytes"]),
                size_text(e["b_bytes"]),
                _signed(e["delta_bytes"]),
                s["label"],
            ]
        )
    return table(rows, {1, 2, 3, 4, 5, 6, 7}, width=term_width())
