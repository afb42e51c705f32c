"""The ranks card of the HTML report (docs/ranks.md): one timeline per rank (inline SVG, every
rank on the same time and byte axes so they compare at a glance), the per-rank peak table with
the ranks that stand out marked, the peaks per device, and the sites across ranks. Drawn here,
in Python, from the report's `ranks` section and the ranks' allocation lifetimes; the page's
script is not needed for it."""

from __future__ import annotations

import html

from ...analyze.documents.analysis import Analysis
from ...analyze.documents.diff_types import Diff
from ...analyze.documents.ranks import rank_series
from ...analyze.documents.report_types import Report, ReportRank, ReportRanks
from ...analyze.read.tags import RankGroup
from ...units import format_bytes
from ..ranks import site_line
from ..text import secs_text
from .data import thin

W, H = 640, 34  # one rank's timeline, in SVG units
POINTS = 600  # points kept per rank (each slice's extremes: the peak is always drawn)


def _line(a: Analysis, pts: list[tuple[int, int]], t0: float, t1: float, top: int) -> str:
    span = max(t1 - t0, 1e-9)
    xy = ["0,%d" % H]
    prev = 0
    for ts, v in thin(pts, POINTS):
        x = ((a.seconds(ts) or 0.0) - t0) / span * W
        xy.append("%.1f,%.1f" % (x, H - prev / top * (H - 2)))  # a step: across, then up/down
        xy.append("%.1f,%.1f" % (x, H - v / top * (H - 2)))
        prev = v
    xy.append("%.1f,%.1f" % (W, H - prev / top * (H - 2)))
    return " ".join(xy)


def ranks_card(a: Analysis, r: Report) -> str:
    """The card's HTML, or '' when the run has no ranks section: the ranks' table with each
    one's timeline, the outliers, the peak per device, the sites across ranks."""
    rk = r.get("ranks")
    if not rk:
        return ""
    e = html.escape
    series = rank_series(a)
    ts_all = [ts for _, pts in series for ts, _ in pts]
    t0 = (a.seconds(min(ts_all)) or 0.0) if ts_all else 0.0
    t1 = (a.seconds(max(ts_all)) or 0.0) if ts_all else 1.0
    top = max([v for _, pts in series for _, v in pts] + [1])
    info = {x["label"]: x for x in rk["ranks"]}
    rows = [_rank_row(a, g, pts, info.get(g.label), (t0, t1, top)) for g, pts in series]
    outl = "".join(
        "<li>%s stands out: peak %s, the ranks' median %s</li>"
        % (e(o["label"]), e(format_bytes(o["bytes"])), e(format_bytes(int(o["median_bytes"]))))
        for o in rk["outliers"]
    )
    sites = "".join(
        "<li><code>%s</code>: %s</li>" % (e(s["label"]), e(site_line(s))) for s in rk["sites"]
    )
    return """<section class="card" id="ranks-card">
  <div class="card-head"><h2>Ranks: %d on %d host%s</h2></div>
  <p class="hint">Each rank's live device memory over time, all on one time axis (%s to %s) and
  one byte scale (%s at the top). A rank's peak is its own processes' bytes at their highest; a
  device's peak is what that one device held. Only the timeline's "all devices together" adds
  different devices up.</p>
  <table class="grid ranks"><tr><th>rank</th><th>host</th><th>devices</th><th>peak</th>
  <th>at</th><th>timeline</th><th></th></tr>%s</table>
  %s
  <h3>Peak per device</h3>
  <table class="grid"><tr><th>host</th><th>device</th><th>peak</th><th>at</th><th>ranks</th></tr>
  %s</table>
  <h3>Sites across ranks (each rank at its own peak)</h3>
  <ul class="rank-sites">%s</ul>
  <p class="hint">A rank stands out by the rule of docs/ranks.md: %s.</p>
</section>
""" % (
        len(rk["ranks"]),
        len(rk["hosts"]),
        "" if len(rk["hosts"]) == 1 else "s",
        e(secs_text(t0)),
        e(secs_text(t1)),
        e(format_bytes(top)),
        "".join(rows),
        "<ul>%s</ul>" % outl if outl else "",
        _device_rows(rk),
        sites or "<li>none</li>",
        e(rk["rule"]),
    )


def _rank_row(
    a: Analysis,
    g: RankGroup,
    pts: list[tuple[int, int]],
    x: ReportRank | None,
    scale: tuple[float, float, int],
) -> str:
    """One rank's row: its figures and its timeline on the card's scale (t0, t1, top bytes)."""
    e = html.escape
    t0, t1, top = scale
    odd = bool(x and x["outlier"])
    svg = (
        '<svg class="rank-line" data-rank="%s" viewBox="0 0 %d %d" width="%d" height="%d" '
        'preserveAspectRatio="none" role="img" aria-label="%s over time">'
        '<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/></svg>'
        % (
            e(g.label),
            W,
            H,
            W,
            H,
            e(g.label),
            "#b42318" if odd else "#1f6feb",
            _line(a, pts, t0, t1, top) if pts else "0,%d %d,%d" % (H, W, H),
        )
    )
    return (
        '<tr%s><td>%s</td><td>%s</td><td>%s</td><td class="n">%s</td><td class="n">%s'
        "</td><td>%s</td><td>%s</td></tr>"
        % (
            ' class="alert"' if odd else "",
            e(g.label),
            e(g.host),
            e(",".join(x["devices"] if x else []) or "-"),
            e(format_bytes(x["peak_bytes"] if x else 0)),
            e(secs_text(x["peak_time"] if x else None)),
            svg,
            "stands out" if odd else "",
        )
    )


def _device_rows(rk: ReportRanks) -> str:
    """The peak per physical device: a row each."""
    e = html.escape
    return "".join(
        '<tr><td>%s</td><td>%s</td><td class="n">%s</td><td class="n">%s</td><td>%s</td></tr>'
        % (
            e(d["host"]),
            e(d["device"]),
            e(format_bytes(d["peak_bytes"])),
            e(secs_text(d["peak_time"])),
            e(", ".join(d["ranks"])),
        )
        for d in rk["devices"]
    )


def ranks_diff_card(d: Diff) -> str:
    """The diff page's card of each rank's peak in A and B ('' when neither run has ranks)."""
    rows = d.get("ranks")
    if not rows:
        return ""
    e = html.escape

    def size(v: int | None) -> str:
        return "-" if v is None else format_bytes(v)

    body = "".join(
        '<tr class="%s"><td>%s</td><td>%s</td><td class="n">%s</td><td class="n">%s</td>'
        '<td class="n">%s%s</td></tr>'
        % (
            "grown" if x["delta_bytes"] > 0 else "shrunk" if x["delta_bytes"] < 0 else "",
            e(x["label"]),
            e(x["host"]),
            e(size(x["a_peak_bytes"])),
            e(size(x["b_peak_bytes"])),
            "+" if x["delta_bytes"] > 0 else "-" if x["delta_bytes"] < 0 else "",
            e(format_bytes(abs(x["delta_bytes"]))),
        )
        for x in rows
    )
    return (
        """<section class="card" id="ranks-card">
  <div class="card-head"><h2>Ranks: each one's own peak in A and B</h2></div>
  <table class="grid ranks"><tr><th>rank</th><th>host</th><th>peak A</th><th>peak B</th>
  <th>change</th></tr>%s</table>
</section>
"""
        % body
    )
