"""Pictures without dependencies: a self-contained SVG timeline of a run.

Traced live device bytes over time (a step line), the observed process-tree device memory and
device used from the launcher's NVML samples (or, without NVML, MemAvailable's drop and the
tree's RSS), the peak marked, the budget as a line, denials and failed allocations marked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from ..units import format_bytes

if TYPE_CHECKING:
    from ..analyze.documents.analysis import Analysis
    from ..analyze.documents.report_types import Report

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
    mag: float = 10 ** math.floor(math.log10(raw))
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
    a: Analysis,
    device: int | None = None,
    report: Report | None = None,
    width: int = W,
    height: int = H,
) -> str:
    """The timeline of Analysis a as SVG text."""
    c = _Chart(a, device, width, height)
    o: list[str] = []
    c.heading(o, report)
    c.axes(o)
    c.series(o)
    c.marks(o)
    c.legend(o)
    o.append("</svg>")
    return "\n".join(o) + "\n"


class _Chart:
    """One timeline: its data (traced, observed, budget, denials, failures, peak) and its scale,
    drawn section by section into a list of SVG lines."""

    def __init__(self, a: Analysis, device: int | None, width: int, height: int) -> None:
        self.a, self.device, self.width, self.height = a, device, width, height
        self.summed = ""  # set by heading() when the run's line adds several devices up
        self.m = m = a.model
        self.start = a.start_ns
        self.pts = m.timeline_points(device) if m.found else []
        self._observed(a, device)
        limits = a.budget_limits()
        self.limit = (
            limits.get(device)
            if device is not None
            else (sum(limits.values()) if len(limits) > 1 else next(iter(limits.values()), None))
        )
        self.denials = [x for x in m.denied if device is None or x.device == device]
        self.fails = [x for x in m.failed if device is None or x.device == device]
        self.peak_b, self.peak_ts = (
            (m.device_peaks[device])
            if device is not None and device in m.device_peaks
            else (m.peak_bytes, m.peak_ts)
        )
        self._scale()

    def _observed(self, a: Analysis, device: int | None) -> None:
        obs = a.observed.series(device)
        self.nvml_tree = obs["tree_device"]
        self.used = obs["device_used"]
        self.no_nvml = not a.observed.nvml_devices(device) and not self.nvml_tree
        self.avail_drop = []
        if self.no_nvml and obs["mem_available"]:
            base = obs["mem_available"][0][1]
            self.avail_drop = [(t, max(0, base - v)) for t, v in obs["mem_available"]]
        self.rss = obs["tree_rss"] if self.no_nvml else []
        self.show_used = bool(self.used) and not self.no_nvml

    def _scale(self) -> None:
        lines = (self.nvml_tree, self.used, self.avail_drop, self.rss)
        t_end = max([self.m.t_end] + [t for s in lines for t, _ in s[-1:]])
        x_max = max((t_end - self.start) / 1e9, 1e-3)
        self.vmax = vmax = max(
            [self.peak_b, self.limit or 0]
            + [v for s in (self.nvml_tree, self.avail_drop, self.rss) for _, v in s]
            + ([v for _, v in self.used] if self.show_used else [])
            + [1]
        )
        self.unit, self.uname = _unit(vmax * 1.05)
        self.ystep = _nice_step(vmax * 1.05 / self.unit)
        self.y_top = math.ceil(vmax * 1.05 / self.unit / self.ystep) * self.ystep
        self.xstep = _nice_step(x_max, 8)
        self.x_top = x_max * 1.02  # the data fills the width; ticks where they fall
        self.pw, self.ph = self.width - ML - MR, self.height - MT - MB

    def X(self, ts: float) -> float:
        return ML + (ts - self.start) / 1e9 / self.x_top * self.pw

    def Y(self, v: float) -> float:
        return MT + self.ph - (v / self.unit) / self.y_top * self.ph

    def secs(self, ts: float) -> float:
        return (ts - self.start) / 1e9

    # ---- sections ----
    def heading(self, o: list[str], report: Report | None) -> None:
        a, m, width, height = self.a, self.m, self.width, self.height
        o.append(
            '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
            'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">'
            % (width, height, width, height)
        )
        # a run whose ordinals name several devices (docs/ranks.md): the line adds them up
        self.summed = (
            "all devices together: " if report and report.get("peak_scope") == "device" else ""
        )
        cmd = " ".join(report["command"]) if report and report.get("command") else str(a.path)
        title = "cudatrace: device memory of %s" % (cmd if len(cmd) < 90 else cmd[:87] + "...")
        if self.device is not None:
            title += " (device %d)" % self.device
        o.append(f"<title>{escape(title)}</title>")
        o.append('<rect width="100%" height="100%" fill="white"/>')
        o.append(
            '<text x="%d" y="22" font-size="15" font-weight="bold" fill="%s">%s</text>'
            % (ML, COL["text"], escape(title))
        )
        sub = (
            f"{self.summed}peak {format_bytes(self.peak_b)} at {self.secs(self.peak_ts):.3f} s"
            if m.found
            else "no device memory traced"
        )
        if self.limit:
            sub += f"; budget {format_bytes(self.limit)}"
        if self.denials:
            n = len(self.denials)
            sub += "; %d denial%s" % (n, "" if n == 1 else "s")
        if self.no_nvml:
            sub += f"; no NVML: {a.observed.why_no_nvml()}"
        room = int((width - ML - 10) / 6.4)
        if len(sub) > room:
            sub = sub[: room - 3].rstrip() + "..."
        o.append('<text x="%d" y="40" fill="#5f6368">%s</text>' % (ML, escape(sub)))

    def _ticks(self, step: float, top: float) -> list[float]:
        out, k = [], 0
        while k * step <= top + 1e-9:
            out.append(k * step)
            k += 1
        return out

    def axes(self, o: list[str]) -> None:
        """The grid, the tick labels, the axis titles and the frame."""
        pw, ph, unit = self.pw, self.ph, self.unit
        yt = self._ticks(self.ystep, self.y_top)
        xt = self._ticks(self.xstep, self.x_top)
        o.append('<g stroke="{}" stroke-width="1">'.format(COL["grid"]))
        for v in yt:
            y = self.Y(v * unit)
            o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>' % (ML, y, ML + pw, y))
        for t in xt:
            x = ML + t / self.x_top * pw
            o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>' % (x, MT, x, MT + ph))
        o.append("</g>")
        o.append('<g fill="{}">'.format(COL["text"]))
        for v in yt:
            o.append(
                '<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                % (ML - 8, self.Y(v * unit) + 4, _fmt(v))
            )
        for t in xt:
            o.append(
                '<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                % (ML + t / self.x_top * pw, MT + ph + 18, _fmt(t))
            )
        o.append("</g>")
        o.append(
            '<text x="%d" y="%d" text-anchor="middle" fill="%s">time since start (seconds)</text>'
            % (ML + pw // 2, MT + ph + 38, COL["text"])
        )
        o.append(
            '<text transform="translate(20 %d) rotate(-90)" text-anchor="middle" fill="%s">'
            "device memory (%s)</text>" % (MT + ph // 2, COL["text"], self.uname)
        )
        o.append(
            '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="%s"/>'
            % (ML, MT, pw, ph, COL["axis"])
        )

    def series(self, o: list[str]) -> None:
        """The traced step line (with a light area under it), the observed lines, the budget."""
        X, Y = self.X, self.Y
        if self.pts:
            d = _step_path(self.pts, X, Y, X(self.m.t_end))
            o.append(
                '<path d="{} V {:.1f} H {:.1f} Z" fill="{}" fill-opacity="0.10" stroke="none"/>'.format(
                    d, Y(0), X(self.pts[0][0]), COL["traced_fill"]
                )
            )
            o.append(
                '<path d="{}" fill="none" stroke="{}" stroke-width="1.6" stroke-linejoin="round"/>'.format(
                    d, COL["traced"]
                )
            )
        if self.show_used:
            o.append(_polyline(self.used, X, Y, COL["used"], dash="5,4", width=1.3))
        if self.nvml_tree:
            o.append(_polyline(self.nvml_tree, X, Y, COL["tree"], width=1.8))
        if self.avail_drop:
            o.append(_polyline(self.avail_drop, X, Y, COL["avail"], width=1.6))
        if self.rss:
            o.append(_polyline(self.rss, X, Y, COL["rss"], dash="3,3", width=1.3))
        if self.limit:
            y = Y(self.limit)
            o.append(
                '<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="1.4" '
                'stroke-dasharray="8,4"/>' % (ML, y, ML + self.pw, y, COL["budget"])
            )
            o.append(
                '<text x="%d" y="%.1f" text-anchor="end" fill="%s">budget %s</text>'
                % (ML + self.pw - 6, y - 5, COL["budget"], escape(format_bytes(self.limit)))
            )

    def marks(self, o: list[str]) -> None:
        """Denials (triangles), failures (crosses) and the peak (a circle with its label)."""
        X, Y, m = self.X, self.Y, self.m
        for x in self.denials[:2000]:
            cx, cy = X(x.ts), Y(min(x.event[4], self.vmax * 1.04))  # AUX2: in use when denied
            o.append(
                '<path d="M {:.1f} {:.1f} l -4 -7 h 8 Z" fill="{}"><title>denied {} at {:.3f} s</title></path>'.format(
                    cx, cy, COL["deny"], escape(format_bytes(x.size)), self.secs(x.ts)
                )
            )
        live_at: dict[int, int] = {}  # time -> bytes live then
        for x in self.fails[:2000]:
            if x.ts not in live_at:
                few = len(self.fails) <= 200
                live_at[x.ts] = m.live_bytes_at(x.ts, self.device)[0] if few else 0
            cx, cy = X(x.ts), Y(live_at[x.ts])
            o.append(
                '<path d="M {:.1f} {:.1f} m -4 -4 l 8 8 m 0 -8 l -8 8" stroke="{}" stroke-width="2">'
                "<title>failed {} at {:.3f} s</title></path>".format(
                    cx, cy, COL["fail"], escape(format_bytes(x.size)), self.secs(x.ts)
                )
            )
        if m.found:
            self._peak(o)

    def _peak(self, o: list[str]) -> None:
        px, py = self.X(self.peak_ts), self.Y(self.peak_b)
        o.append(
            '<circle cx="{:.1f}" cy="{:.1f}" r="4.5" fill="white" stroke="{}" stroke-width="2"/>'.format(
                px, py, COL["traced"]
            )
        )
        label = f"{self.summed}peak {format_bytes(self.peak_b)} at {self.secs(self.peak_ts):.3f} s"
        anchor = "start" if px < ML + self.pw * 0.7 else "end"
        o.append(
            '<text x="{:.1f}" y="{:.1f}" text-anchor="{}" font-weight="bold" fill="{}">{}</text>'.format(
                px + (8 if anchor == "start" else -8),
                max(py - 8, MT + 12),
                anchor,
                COL["traced"],
                escape(label),
            )
        )

    def legend(self, o: list[str]) -> None:
        """The legend, under the plot: one entry per line drawn, then the marks."""
        summed = ", all devices summed" if self.summed else ""
        # (text, colour, dash pattern or None for a solid line)
        items: list[tuple[str, str, str | None]] = [
            (f"traced live (hooked allocations{summed})", COL["traced"], None)
        ]
        if self.nvml_tree:
            items.append(("NVML: process tree", COL["tree"], None))
        if self.show_used:
            items.append(("NVML: device used (all processes)", COL["used"], "5,4"))
        if self.avail_drop:
            items.append(("MemAvailable drop since start", COL["avail"], None))
        if self.rss:
            items.append(("process tree RSS", COL["rss"], "3,3"))
        if self.limit:
            items.append(("budget", COL["budget"], "8,4"))
        x = ML
        y = self.height - 16
        for text, col, dash in items:
            o.append(
                '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2.5"%s/>'
                % (x, y - 4, x + 22, y - 4, col, f' stroke-dasharray="{dash}"' if dash else "")
            )
            o.append(
                '<text x="%d" y="%d" fill="%s">%s</text>' % (x + 28, y, COL["text"], escape(text))
            )
            x += 28 + int(len(text) * 6.6) + 22
        if self.denials:
            o.append(
                '<path d="M %d %d l -4 -7 h 8 Z" fill="%s"/><text x="%d" y="%d" fill="%s">denied</text>'
                % (x + 6, y, COL["deny"], x + 16, y, COL["text"])
            )
            x += 70
        if self.fails:
            o.append(
                '<path d="M %d %d m -4 -4 l 8 8 m 0 -8 l -8 8" stroke="%s" stroke-width="2"/>'
                '<text x="%d" y="%d" fill="%s">failed</text>'
                % (x + 6, y - 4, COL["fail"], x + 16, y, COL["text"])
            )


def _step_path(
    pts: Sequence[tuple[int, int]],
    X: Callable[[float], float],
    Y: Callable[[float], float],
    x_end: float,
) -> str:
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


def _polyline(
    series: Sequence[tuple[int, int]],
    X: Callable[[float], float],
    Y: Callable[[float], float],
    color: str,
    dash: str | None = None,
    width: float = 1.5,
) -> str:
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


def write_svg(
    a: Analysis, path: str | Path, device: int | None = None, report: Report | None = None
) -> Path:
    from ..outputs import write_output
    from ..units import lossless

    write_output(path, lossless(render_svg(a, device, report)))
    return Path(path)
