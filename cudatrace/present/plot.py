"""Pictures without dependencies: a self-contained SVG timeline of a run.

Traced live device bytes over time (a step line), the observed process-tree device memory and
device used from the launcher's NVML samples (or, without NVML, MemAvailable's drop and the
tree's RSS), the peak marked, the budget as a line, denials and failed allocations marked.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

from ..units import format_bytes

W, H = 1000, 460
ML, MR, MT, MB = 84, 24, 58, 80  # margins: room for axis labels, title, legend

COL = {
    "traced": "#1f5fbf",
    "traced_fill": "#1f5fbf",
    "tree": "#e8710a",
    "used": "#7a7a7a",
    "avail": "#188038",
    "rss": "#9334e6",
    "budget": "#d93025",
    "deny": "#d93025",
    "fail": "#b06000",
    "grid": "#e6e6e6",
    "axis": "#333333",
    "text": "#202124",
}


def _nice_step(span: float, target: int = 6) -> float:
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _unit(vmax: float) -> tuple[float, str]:
    if vmax >= (1 << 30):
        return float(1 << 30), "GiB"
    if vmax >= (1 << 20):
        return float(1 << 20), "MiB"
    if vmax >= (1 << 10):
        return float(1 << 10), "KiB"
    return 1.0, "bytes"


def _fmt(v: float) -> str:
    s = (f"{v:.3f}").rstrip("0").rstrip(".")
    return s if s not in ("", "-0") else "0"


def render_svg(
    a, device: int | None = None, report: dict | None = None, width: int = W, height: int = H
) -> str:
    """The timeline of Analysis a as SVG text."""
    m = a.model
    start = a.start_ns
    pts = m.timeline_points(device) if m.found else []
    obs = a.observed.series(device)
    nvml_tree = obs["tree_device"]
    used = obs["device_used"]
    no_nvml = not a.observed.nvml_devices(device) and not nvml_tree
    avail_drop = []
    if no_nvml and obs["mem_available"]:
        base = obs["mem_available"][0][1]
        avail_drop = [(t, max(0, base - v)) for t, v in obs["mem_available"]]
    rss = obs["tree_rss"] if no_nvml else []
    limits = a.budget_limits()
    limit = (
        limits.get(device)
        if device is not None
        else (sum(limits.values()) if len(limits) > 1 else next(iter(limits.values()), None))
    )
    denials = [x for x in m.denied if device is None or x.device == device]
    fails = [x for x in m.failed if device is None or x.device == device]
    peak_b, peak_ts = (
        (m.device_peaks[device])
        if device is not None and device in m.device_peaks
        else (m.peak_bytes, m.peak_ts)
    )

    t_end = max([m.t_end] + [t for s in (nvml_tree, used, avail_drop, rss) for t, _ in s[-1:]])
    x_max = max((t_end - start) / 1e9, 1e-3)
    show_used = bool(used) and not no_nvml
    vmax = max(
        [peak_b, limit or 0]
        + [v for s in (nvml_tree, avail_drop, rss) for _, v in s]
        + ([v for _, v in used] if show_used else [])
        + [1]
    )
    unit, uname = _unit(vmax * 1.05)
    ystep = _nice_step(vmax * 1.05 / unit)
    y_top = math.ceil(vmax * 1.05 / unit / ystep) * ystep
    xstep = _nice_step(x_max, 8)
    x_top = x_max * 1.02  # the data fills the width; ticks where they fall
    pw, ph = width - ML - MR, height - MT - MB

    def X(ts):
        return ML + (ts - start) / 1e9 / x_top * pw

    def Y(v):
        return MT + ph - (v / unit) / y_top * ph

    o: list[str] = []
    add = o.append
    add(
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
        'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">'
        % (width, height, width, height)
    )
    cmd = " ".join(report["command"]) if report and report.get("command") else str(a.path)
    title = "cudatrace: device memory of %s" % (cmd if len(cmd) < 90 else cmd[:87] + "...")
    if device is not None:
        title += " (device %d)" % device
    add(f"<title>{escape(title)}</title>")
    add('<rect width="100%" height="100%" fill="white"/>')
    add(
        '<text x="%d" y="22" font-size="15" font-weight="bold" fill="%s">%s</text>'
        % (ML, COL["text"], escape(title))
    )
    # a run whose ordinals name several devices (docs/ranks.md): the line adds them up
    summed = "all devices together: " if report and report.get("peak_scope") == "device" else ""
    sub = (
        f"{summed}peak {format_bytes(peak_b)} at {(peak_ts - start) / 1e9:.3f} s"
        if m.found
        else "no device memory traced"
    )
    if limit:
        sub += f"; budget {format_bytes(limit)}"
    if denials:
        sub += "; %d denial%s" % (len(denials), "" if len(denials) == 1 else "s")
    if no_nvml:
        sub += f"; no NVML: {a.observed.why_no_nvml()}"
    room = int((width - ML - 10) / 6.4)
    if len(sub) > room:
        sub = sub[: room - 3].rstrip() + "..."
    add('<text x="%d" y="40" fill="#5f6368">%s</text>' % (ML, escape(sub)))

    # grid and axes
    add('<g stroke="{}" stroke-width="1">'.format(COL["grid"]))
    k = 0
    while k * ystep <= y_top + 1e-9:
        y = Y(k * ystep * unit)
        add('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>' % (ML, y, ML + pw, y))
        k += 1
    k = 0
    while k * xstep <= x_top + 1e-9:
        x = ML + k * xstep / x_top * pw
        add('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>' % (x, MT, x, MT + ph))
        k += 1
    add("</g>")
    add('<g fill="{}">'.format(COL["text"]))
    k = 0
    while k * ystep <= y_top + 1e-9:
        add(
            '<text x="%d" y="%.1f" text-anchor="end">%s</text>'
            % (ML - 8, Y(k * ystep * unit) + 4, _fmt(k * ystep))
        )
        k += 1
    k = 0
    while k * xstep <= x_top + 1e-9:
        add(
            '<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
            % (ML + k * xstep / x_top * pw, MT + ph + 18, _fmt(k * xstep))
        )
        k += 1
    add("</g>")
    add(
        '<text x="%d" y="%d" text-anchor="middle" fill="%s">time since start (seconds)</text>'
        % (ML + pw // 2, MT + ph + 38, COL["text"])
    )
    add(
        '<text transform="translate(20 %d) rotate(-90)" text-anchor="middle" fill="%s">'
        "device memory (%s)</text>" % (MT + ph // 2, COL["text"], uname)
    )
    add(
        '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="%s"/>'
        % (ML, MT, pw, ph, COL["axis"])
    )

    # traced: step line and a light area under it
    if pts:
        d = _step_path(pts, X, Y, X(m.t_end))
        add(
            '<path d="{} V {:.1f} H {:.1f} Z" fill="{}" fill-opacity="0.10" stroke="none"/>'.format(
                d, Y(0), X(pts[0][0]), COL["traced_fill"]
            )
        )
        add(
            '<path d="{}" fill="none" stroke="{}" stroke-width="1.6" stroke-linejoin="round"/>'.format(
                d, COL["traced"]
            )
        )
    # observed
    if show_used:
        add(_polyline(used, X, Y, COL["used"], dash="5,4", width=1.3))
    if nvml_tree:
        add(_polyline(nvml_tree, X, Y, COL["tree"], width=1.8))
    if avail_drop:
        add(_polyline(avail_drop, X, Y, COL["avail"], width=1.6))
    if rss:
        add(_polyline(rss, X, Y, COL["rss"], dash="3,3", width=1.3))
    # budget
    if limit:
        y = Y(limit)
        add(
            '<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="1.4" '
            'stroke-dasharray="8,4"/>' % (ML, y, ML + pw, y, COL["budget"])
        )
        add(
            '<text x="%d" y="%.1f" text-anchor="end" fill="%s">budget %s</text>'
            % (ML + pw - 6, y - 5, COL["budget"], escape(format_bytes(limit)))
        )
    # denials and failures
    for x in denials[:2000]:
        cx, cy = X(x.ts), Y(min(x.event[4], vmax * 1.04))  # AUX2: in use when denied
        add(
            '<path d="M {:.1f} {:.1f} l -4 -7 h 8 Z" fill="{}"><title>denied {} at {:.3f} s</title></path>'.format(
                cx, cy, COL["deny"], escape(format_bytes(x.size)), (x.ts - start) / 1e9
            )
        )
    if fails:
        live_at = {}
        for x in fails[:2000]:
            if x.ts not in live_at:
                live_at[x.ts] = m.live_bytes_at(x.ts, device)[0] if len(fails) <= 200 else 0
            cx, cy = X(x.ts), Y(live_at[x.ts])
            add(
                '<path d="M {:.1f} {:.1f} m -4 -4 l 8 8 m 0 -8 l -8 8" stroke="{}" stroke-width="2">'
                "<title>failed {} at {:.3f} s</title></path>".format(
                    cx, cy, COL["fail"], escape(format_bytes(x.size)), (x.ts - start) / 1e9
                )
            )
    # peak
    if m.found:
        px, py = X(peak_ts), Y(peak_b)
        add(
            '<circle cx="{:.1f}" cy="{:.1f}" r="4.5" fill="white" stroke="{}" stroke-width="2"/>'.format(
                px, py, COL["traced"]
            )
        )
        label = f"{summed}peak {format_bytes(peak_b)} at {(peak_ts - start) / 1e9:.3f} s"
        anchor = "start" if px < ML + pw * 0.7 else "end"
        add(
            '<text x="{:.1f}" y="{:.1f}" text-anchor="{}" font-weight="bold" fill="{}">{}</text>'.format(
                px + (8 if anchor == "start" else -8),
                max(py - 8, MT + 12),
                anchor,
                COL["traced"],
                escape(label),
            )
        )

    # legend, under the plot
    items = [
        (
            "traced live (hooked allocations%s)" % (", all devices summed" if summed else ""),
            COL["traced"],
            None,
        )
    ]
    if nvml_tree:
        items.append(("NVML: process tree", COL["tree"], None))
    if show_used:
        items.append(("NVML: device used (all processes)", COL["used"], "5,4"))
    if avail_drop:
        items.append(("MemAvailable drop since start", COL["avail"], None))
    if rss:
        items.append(("process tree RSS", COL["rss"], "3,3"))
    if limit:
        items.append(("budget", COL["budget"], "8,4"))
    x = ML
    y = height - 16
    for text, col, dash in items:
        add(
            '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2.5"%s/>'
            % (x, y - 4, x + 22, y - 4, col, f' stroke-dasharray="{dash}"' if dash else "")
        )
        add('<text x="%d" y="%d" fill="%s">%s</text>' % (x + 28, y, COL["text"], escape(text)))
        x += 28 + int(len(text) * 6.6) + 22
    if denials:
        add(
            '<path d="M %d %d l -4 -7 h 8 Z" fill="%s"/><text x="%d" y="%d" fill="%s">denied</text>'
            % (x + 6, y, COL["deny"], x + 16, y, COL["text"])
        )
        x += 70
    if fails:
        add(
            '<path d="M %d %d m -4 -4 l 8 8 m 0 -8 l -8 8" stroke="%s" stroke-width="2"/>'
            '<text x="%d" y="%d" fill="%s">failed</text>'
            % (x + 6, y - 4, COL["fail"], x + 16, y, COL["text"])
        )
    add("</svg>")
    return "\n".join(o) + "\n"


def _step_path(pts, X, Y, x_end) -> str:
    out = []
    last_x = last_y = None
    for i, (t, v) in enumerate(pts):
        x, y = round(X(t), 1), round(Y(v), 1)
        if i == 0:
            out.append(f"M {x:.1f} {y:.1f}")
        else:
            if x != last_x:
                out.append(f"H {x:.1f}")
            if y != last_y:
                out.append(f"V {y:.1f}")
        last_x, last_y = x, y
    if last_x is not None and x_end > last_x:
        out.append(f"H {x_end:.1f}")
    return " ".join(out)


def _polyline(series, X, Y, color, dash=None, width=1.5) -> str:
    coords = " ".join(f"{X(t):.1f},{Y(v):.1f}" for t, v in series)
    out = '<polyline points="{}" fill="none" stroke="{}" stroke-width="{:.1f}"{}/>'.format(
        coords,
        color,
        width,
        f' stroke-dasharray="{dash}"' if dash else "",
    )
    if len(series) <= 60:  # few samples: show each one
        out += "".join(
            f'<circle cx="{X(t):.1f}" cy="{Y(v):.1f}" r="2.5" fill="{color}"/>' for t, v in series
        )
    return out


def write_svg(a, path, device: int | None = None, report: dict | None = None) -> Path:
    p = Path(path)
    p.write_text(render_svg(a, device, report))
    return p
