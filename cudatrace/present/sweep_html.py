"""`cudatrace sweep --html FILE`: one self-contained page of the sweep's laws, rendered from the
dict of --json (cudatrace.sweep/1), like the text (present/sweep.py).

For the peak and each site: a chart of the bytes live at each run's peak against the knob (inline
SVG, no script, no font or file fetched), the fitted line where the law is affine or flat, the
points joined otherwise (the page says which), the law in the words of the text (law.text, written by present/sweep.py), the bytes of each
run in a table, and the --expect verdict. On a grid, each chart has one series per value of the
other knobs. Every text that comes from the trace or the command is escaped.
"""

from __future__ import annotations

from html import escape
from typing import cast

from ..analyze.documents.sweep_types import Sweep, SweepKnob, SweepSeries
from ..units import format_bytes

W, H = 520, 240  # the chart
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 12, 40
COLORS = ("#1f6fb4", "#d9622b", "#2f9a46", "#8a4fc0", "#b8860b", "#c2185b", "#00838f", "#555")

CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;
color:#1d1d1f;background:#fff;max-width:1100px}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:0 0 4px;word-break:break-all}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
section.series{border:1px solid #ddd;border-radius:6px;padding:12px;margin:14px 0}
section.flagged{border-color:#c62828;background:#fff5f5}
p.law{margin:4px 0}p.how{margin:2px 0;color:#666;font-size:12px}
p.verdict{margin:6px 0;padding:4px 8px;border-radius:4px}
p.verdict.bad{background:#c62828;color:#fff;font-weight:600}
p.verdict.good{background:#e8f5e9;color:#1b5e20}
.row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
table{border-collapse:collapse;font-size:12px}td,th{padding:2px 8px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#f6f6f6}
svg text{font-size:11px;fill:#333}svg .axis{stroke:#888}svg .grid{stroke:#eee}
ul.left li{margin:2px 0}
"""


def _label(k: SweepKnob) -> str:
    return k["flag"] or k["placeholder"]


def _xtext(k: SweepKnob, x: float) -> str:
    """A knob value as the user wrote it, else in readable units."""
    if x in k["numbers"]:
        return k["values"][k["numbers"].index(x)]
    return format_bytes(x) if k["unit"] == "bytes" else f"{x:g}"


def _ticks(hi: float) -> list[float]:
    """0 and about four round steps up to hi: 1, 2, 2.5 or 5 x a power of ten of the largest
    binary unit below hi (bytes read as '256.0 MiB', not '268.4 MB')."""
    if hi <= 0:
        return [0]
    unit = 1
    while unit * 1024 <= hi:
        unit *= 1024
    raw = hi / unit / 4
    mag = 1.0
    while mag * 10 <= raw:
        mag *= 10
    while mag > raw:
        mag /= 10
    step = next(mag * m for m in (1, 2, 2.5, 5, 10) if mag * m >= raw) * unit
    n = int(hi // step) + 1
    return [step * i for i in range(n + 1)]


def _series_points(doc: Sweep, s: SweepSeries) -> list[tuple[str, float, int, int]]:
    """[(group, x, bytes, run index)] of the included runs; group: the other knobs' values."""
    knobs = doc["knobs"]
    out: list[tuple[str, float, int, int]] = []
    for i, r in enumerate(doc["runs"]):
        y = s["bytes"][i]
        if y is None or not r["included"]:
            continue
        v = r["value"]
        if len(knobs) == 1 or not isinstance(v, dict):
            out.append(("", cast(float, v), y, i))  # one knob: its value is a number
        else:
            other = ", ".join(
                f"{_label(k)}={_xtext(k, v[k['name']])}" for k in knobs[1:] if k["name"] in v
            )
            out.append((other, v[knobs[0]["name"]], y, i))
    return out


def chart(doc: Sweep, s: SweepSeries) -> str:
    """The SVG of one series (the peak or a site)."""
    k = doc["knobs"][0]
    pts = _series_points(doc, s)
    xs = sorted({x for _, x, _, _ in pts}) or k["numbers"]
    x0, x1 = min(xs), max(xs)
    fit = s["fit"]
    affine = len(doc["knobs"]) == 1 and fit is not None and s["law"]["kind"] in ("affine", "flat")
    line = None
    if affine and fit is not None:
        line = [(x, fit["intercept"] + fit["slope"] * x) for x in (x0, x1)]
    ys = [y for _, _, y, _ in pts] + ([y for _, y in line] if line else [])
    yt = _ticks(max(ys) if ys else 0)
    ymax = yt[-1] or 1
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (pw * (x - x0) / (x1 - x0) if x1 > x0 else pw / 2)

    def py(y: float) -> float:
        return TOP + ph - ph * max(0.0, y) / ymax

    groups: dict[str, list[tuple[float, int, int]]] = {}
    for g, x, b, i in pts:
        groups.setdefault(g, []).append((x, b, i))
    legend = 14 * len(groups) if len(groups) > 1 or "" not in groups else 0
    o = [f'<svg width="{W}" height="{H + legend}" viewBox="0 0 {W} {H + legend}" role="img">']
    for t in yt:
        y = py(t)
        o.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        o.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(format_bytes(t))}</text>'
        )
    for x in xs:
        o.append(
            f'<text x="{px(x):.1f}" y="{TOP + ph + 16}" text-anchor="middle">'
            f"{escape(_xtext(k, x))}</text>"
        )
    o.append(
        f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + ph}"/>'
        f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{TOP + ph}" y2="{TOP + ph}"/>'
        f'<text x="{LEFT + pw / 2:.1f}" y="{H - 4}" text-anchor="middle">{escape(_label(k))}</text>'
    )
    for n, (g, gp) in enumerate(groups.items()):
        color = COLORS[n % len(COLORS)]
        gp.sort()
        if line is not None:
            (ax, ay), (bx, by) = line
            o.append(
                f'<line class="fit" x1="{px(ax):.1f}" y1="{py(ay):.1f}" x2="{px(bx):.1f}" '
                f'y2="{py(by):.1f}" stroke="{color}" stroke-width="1.5" stroke-dasharray="5 3"/>'
            )
        elif len(gp) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in gp)
            o.append(
                f'<polyline class="joined" points="{path}" fill="none" stroke="{color}" '
                'stroke-width="1.5"/>'
            )
        for x, y, i in gp:
            tip = "{}{}: {} ({} bytes)".format(
                f"{g}, " if g else "", _xtext(k, x), format_bytes(y), y
            )
            o.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}" '
                f'data-run="{i}" data-bytes="{y}"><title>{escape(tip)}</title></circle>'
            )
        if g:
            o.append(
                f'<text x="{LEFT}" y="{H + 10 + 14 * n}" style="fill:{color}">'
                f"&#9679; {escape(g)}</text>"
            )
    o.append("</svg>")
    return "".join(o)


def _how_drawn(doc: Sweep, s: SweepSeries) -> str:
    kind = s["law"]["kind"]
    if len(doc["knobs"]) > 1:
        return "points of each value of the other knobs joined; the law is fitted over the grid"
    if s["fit"] is not None and kind in ("affine", "flat"):
        return "points: the runs; dashed line: the fitted law"
    if kind in ("none", "one_point"):
        return "points: the runs; no law to draw"
    return "points joined, not a fitted line: the law is {}".format(kind.replace("_", " "))


def _table(doc: Sweep, s: SweepSeries) -> str:
    rows = ["<table><tr><th>value</th><th>bytes live at the peak</th></tr>"]
    for i, r in enumerate(doc["runs"]):
        y = s["bytes"][i]
        cell = (
            f'<td class="num" data-bytes="{y}" title="{y} bytes">{escape(format_bytes(y))}</td>'
            if y is not None
            else '<td class="num">left out</td>'
        )
        rows.append(f"<tr><td>{escape(r['text'])}</td>{cell}</tr>")
    rows.append("</table>")
    return "".join(rows)


def _section(doc: Sweep, s: SweepSeries) -> str:
    bad = s["contradicts_expectation"]
    name = "the peak (all sites)" if s["label"] == "peak" and s["key"] is None else s["label"]
    o = [f'<section class="series{" flagged" if bad else ""}">']
    o.append(f"<h2>{escape(name)}</h2>")
    o.append(f'<p class="law mono">{escape(s["law"]["text"])}</p>')
    o.append(f'<p class="how">{escape(_how_drawn(doc, s))}</p>')
    if bad:
        o.append(f'<p class="verdict bad">! {escape(s["expectation"] or "")}</p>')
    elif doc["expect"] is not None:
        o.append('<p class="verdict good">within --expect</p>')
    o.append(f'<div class="row">{chart(doc, s)}{_table(doc, s)}</div></section>')
    return "".join(o)


def render(doc: Sweep) -> str:
    """The whole page, one string."""
    knobs = doc["knobs"]
    o = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>cudatrace sweep: {}</title>".format(escape(" ".join(doc["command"]))),
        f"<style>{CSS}</style></head>",
        '<body data-ready="1">',
        "<h1>cudatrace sweep</h1>",
        '<p class="mono">{}</p>'.format(escape(" ".join(doc["command"]))),
        "<ul>",
    ]
    for k in knobs:
        o.append(
            "<li>knob <code>{}</code>: {}</li>".format(
                escape(_label(k)), escape(", ".join(k["values"]))
            )
        )
    inc = sum(1 for r in doc["runs"] if r["included"])
    o.append(
        "<li>{} of {} runs fitted; traces in <code>{}</code></li></ul>".format(
            inc, len(doc["runs"]), escape(doc["directory"])
        )
    )
    left = [r for r in doc["runs"] if not r["included"]]
    if left:
        o.append('<h2>Runs left out of the laws</h2><ul class="left">')
        for r in left:
            msg = r["ended"].get("message")
            o.append(
                "<li><b>{}</b>: {}{}</li>".format(
                    escape(r["text"]),
                    escape(r["ended"]["text"]),
                    f"<br><code>{escape(msg)}</code>" if msg else "",
                )
            )
        o.append("</ul>")
    series = [doc["peak"], *doc["sites"]]
    if doc["expect"] is not None:
        flagged = [s for s in series if s["contradicts_expectation"]]
        o.append(
            "<h2>Against --expect {}</h2>".format(
                escape(str(doc.get("expect_text") or doc["expect"]))
            )
        )
        if flagged:
            o.append("<ul>")
            o.extend(f'<li class="bad">! {escape(s["expectation"] or "")}</li>' for s in flagged)
            o.append("</ul>")
        else:
            o.append("<p>nothing grows more than 10% faster than expected</p>")
    o.append("<h2>Bytes live at each run's peak, and their laws</h2>")
    o.extend(_section(doc, s) for s in series)
    if doc["more_sites"]:
        o.append("<p>... and %d more sites (--top)</p>" % doc["more_sites"])
    p = doc.get("prediction")
    if p is not None and p.get("peak") is not None and p.get("budget") is not None:
        o.append(
            "<h2>Predicted at {}</h2><p>peak {} ({}); budget for a co-tenant box: "
            "<code>--budget {}</code>: {}</p>".format(
                escape(p["at"]),
                escape(format_bytes(p["peak"]["bytes"])),
                escape(p["peak"]["how"]),
                escape(p["budget"]["spec"]),
                escape(p["budget"]["reason"]),
            )
        )
    for n in doc["notes"]:
        o.append(f"<p>note: {escape(n)}</p>")
    o.append("</body></html>")
    return "\n".join(o) + "\n"
