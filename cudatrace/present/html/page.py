"""`report --html` and `diff --html`: one self-contained HTML file (inline script and style, no
network, no external fonts) that opens from disk or from an e-mail attachment.

The page shows a timeline of live device memory (stacked by process or by site at chosen
moments, the exact traced total as a line, the peak, the budget, denials, failed allocations and
what NVML / MemAvailable observed), an icicle flame graph of what was live at the chosen moment
(zoom, search), the site table and the run's facts; for a diff, a differential flame graph and the
site changes.

Everything is attributed through the functions `report` uses (Analysis.stacks.frames, sites.site_of,
Site.label, SFrame.label), so the views follow the report. The file stays small on big traces:
stacks are stored once (a table of frames and one of stacks), and the live set is kept at a
bounded number of moments (at most MAX_MOMENTS, picked where the live total changes, always with
the peak and the end); the page says what was aggregated.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...analyze.documents.analysis import Analysis
from ...analyze.documents.diff_types import Diff
from ...analyze.documents.report import build_report
from ...analyze.documents.report_types import Report, ReportAt, ReportDenied
from ...analyze.replay.lives import NONE64
from ...symbols.symbolizer import ProgressFactory
from ...units import format_bytes
from ..report import render_text
from ..report.words import status_text, via_text
from .data import (
    ASSETS,
    MAX_SITE_CHANGES,
    Moment,
    RunData,
    Tables,
    aggregation_note,
    first_allocation,
    pick_moments,
    run_data,
    tables_json,
)
from .ranks import ranks_card, ranks_diff_card


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _json_for_script(doc: object) -> str:
    """JSON safe inside <script>: no '<' at all (so no '</script>' or '<!--')."""
    return (
        json.dumps(doc, separators=(",", ":"), allow_nan=False)
        .replace("<", "\\u003c")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def page(title: str, data: Mapping[str, object], body: str) -> str:
    e = html.escape
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n",
            '<meta name="generator" content="cudatrace {}">\n'.format(
                e(str(data.get("version", "")))
            ),
            "<title>{}</title>\n<style>\n{}</style>\n</head>\n<body>\n".format(
                e(title), _asset("page.css")
            ),
            body,
            f'\n<script type="application/json" id="ct-data">{_json_for_script(data)}</script>\n',
            "<script>\n{}</script>\n</body>\n</html>\n".format(_asset("page.js")),
        ]
    )


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _cmd(argv: Sequence[str] | None) -> str:
    return " ".join(argv) if argv else "?"


def _fact(k: str, v: str, raw: bool = False) -> str:
    return f"<tr><th>{html.escape(k)}</th><td>{v if raw else html.escape(v)}</td></tr>"


def _facts_html(r: Report) -> str:
    """The run's facts as static HTML (readable even where scripts are off)."""
    from ..report.words import limits_text, versions_text

    e = html.escape
    rows = [
        _fact("command", "<code>{}</code>".format(e(_cmd(r["command"]))), raw=True),
        _fact("trace", r["path"]),
    ]
    started = r.get("start_time")
    if started:
        rows.append(
            _fact(
                "started",
                _dt.datetime.fromtimestamp(started, _dt.timezone.utc).strftime(
                    "%Y-%m-%d %H:%M:%S UTC"
                ),
            )
        )
    rows.append(
        _fact(
            "exit status", "not recorded" if r.get("exit_status") is None else str(r["exit_status"])
        )
    )
    rows.append(_fact("duration", _when(r.get("duration") or 0)))
    b = r.get("budget")
    if b:
        lim = limits_text(b["limits"]) or "spec {}".format(b.get("spec"))
        rows.append(
            _fact(
                "budget",
                "{} (over budget: {}{}{})".format(
                    lim,
                    b.get("on_exceed") or "?",
                    "; group {}".format(b["group"]) if b.get("group") else "",
                    "; the run was aborted" if b.get("aborted") else "",
                ),
            )
        )
    else:
        rows.append(_fact("budget", "none"))
    c = r["counts"]
    rows.append(
        _fact(
            "events",
            "{:,} events; {:,} device allocations, {:,} frees, {:,} failed, "
            "{:,} denied; pinned host peak {}".format(
                c.get("events", 0),
                c.get("allocs", 0),
                c.get("frees", 0),
                c.get("failed", 0),
                c.get("denied", 0),
                format_bytes(r["host_pinned"]["peak_bytes"]),
            ),
        )
    )
    rows.append(_fact("recorded with", versions_text(r["versions"])))
    from ..observed import render_observed

    obs: list[str] = []
    render_observed(r, obs.append)
    rows.append(
        _fact(
            "observed",
            '<pre class="obs">{}</pre>'.format(e("\n".join(x for x in obs if x.strip()))),
            raw=True,
        )
    )
    return "".join(
        [
            '<table class="facts">{}</table>'.format("".join(rows)),
            _processes_html(r),
            _notes_html(r),
        ]
    )


def _processes_html(r: Report) -> str:
    """The table of the run's processes."""
    e = html.escape
    procs = [
        '<tr><th>pid</th><th>ppid</th><th>program</th><th class="n">allocations</th>'
        '<th class="n">peak</th><th class="n">at exit</th><th class="n">failed</th>'
        '<th class="n">denied</th><th>status</th><th>file</th></tr>'
    ]
    for p in r["processes"]:
        st: str = p["status"]
        if st == "complete":
            st = (
                "exit {}".format(p["exit_code"]) if p["exit_code"] not in (None, -1) else "complete"
            )
            cls = ""
        else:
            st = status_text(p, r)  # the text report's words
            cls = ' class="warn"'
        procs.append(
            '<tr%s><td>%d</td><td>%d</td><td title="%s">%s</td><td class="n">%s</td>'
            '<td class="n">%s</td><td class="n">%s</td><td class="n">%s</td>'
            '<td class="n">%s</td><td>%s</td><td><code>%s</code></td></tr>'
            % (
                cls,
                p["pid"],
                p["ppid"],
                e(_cmd(p.get("argv") or [p["exe"]])),
                e(os.path.basename(p["exe"]) or "?"),
                "{:,}".format(p["allocs"]),
                format_bytes(p["peak_bytes"]),
                format_bytes(p["end_bytes"]),
                p["failed"],
                p["denied"],
                e(st),
                e(p["file"]),
            )
        )
    return '<h3>Processes</h3><div class="facts-wrap"><table class="grid">{}</table></div>'.format(
        "".join(procs)
    )


def _notes_html(r: Report) -> str:
    """Truncated and unreadable files, and the report's notes ('' when there are none)."""
    notes = []
    for t in r["truncated_files"]:
        notes.append(
            "truncated: %s (pid %d, %d events): %s"
            % (t["file"], t["pid"], t["events"], t["reason"])
        )
    for u in r["unreadable_files"]:
        notes.append(f"unreadable: {u}")
    notes.extend(r["warnings"])
    if not notes:
        return ""
    return '<h3>Notes</h3><ul class="notes">{}</ul>'.format(
        "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    )


def _when(t: float) -> str:
    """Seconds since the start as the page's charts write them."""
    return "%.3f ms" % (t * 1e3) if abs(t) < 1 else f"{t:.3f} s"


def _stat(label: str, value: str, sub: str = "", cls: str = "") -> str:
    return (
        '<div class="stat{}"><div class="k">{}</div><div class="v">{}</div>'
        '<div class="s">{}</div></div>'.format(
            " " + cls if cls else "", html.escape(label), html.escape(value), html.escape(sub)
        )
    )


def _peak_stats(a: Analysis, r: Report) -> list[str]:
    """One peak figure per scope, each labelled with it (the timeline's markers say the same):
    the run's on one device; with several devices, all of them together, and where the report's
    peak is one device's (ranks: an ordinal names several devices), that one's as well."""
    if r["peak_time"] is None:
        return [_stat("peak", "none", "nothing allocated")]
    m = a.model
    if len(r["devices"]) <= 1:
        return [_stat("peak", format_bytes(r["peak_bytes"]), "at " + _when(r["peak_time"]))]
    together = _stat(
        "peak, all devices together",
        format_bytes(m.peak_bytes),
        "their sum at its highest, at " + _when(a.seconds(m.peak_ts) or 0.0),
    )
    if r.get("peak_scope") != "device":
        return [together]
    top = max(r["devices"], key=lambda d: d["peak_bytes"])
    name = f"{top['host']}:{top['label']}" if "host" in top else f"device {top['device']}"
    one = _stat(
        "peak of one device",
        format_bytes(r["peak_bytes"]),
        f"the most any one held: {name}, at {_when(r['peak_time'])}",
    )
    return [one, together]


def _report_stats(a: Analysis, r: Report, at: ReportAt) -> list[str]:
    """The figures at the head of a report's page: peak, never freed, allocations, the top
    site, the budget, failures and denials, truncated files."""
    stats = [
        *_peak_stats(a, r),
        _stat(
            "live at exit",
            format_bytes(r["end_bytes"]),
            "never freed" if r["end_bytes"] else "everything freed",
        ),
    ]
    c = r["counts"]
    stats.append(
        _stat(
            "allocations",
            "{:,}".format(c.get("allocs", 0)),
            "{:,} process{}".format(len(r["processes"]), "" if len(r["processes"]) == 1 else "es"),
        )
    )
    if r["sites"]:
        s0 = r["sites"][0]
        stats.append(
            _stat(
                "top site at the %s" % (at.get("kind") or "peak"),
                s0["label"],
                "%s in %d allocation%s (%.1f%%)"
                % (
                    format_bytes(s0["bytes"]),
                    s0["count"],
                    "" if s0["count"] == 1 else "s",
                    100 * s0["share"],
                ),
                "wide",
            )
        )
    budget = r.get("budget")
    if budget:
        lim = [v for d, v in budget["limits"].items() if int(d) in a.model.device_peaks]
        stats.append(
            _stat(
                "budget",
                format_bytes(sum(lim)) if lim else "set",
                "on_exceed {}".format(budget.get("on_exceed")),
            )
        )
    bad = c.get("failed", 0) + c.get("denied", 0)
    stats.append(
        _stat(
            "failed / denied",
            "%d / %d" % (c.get("failed", 0), c.get("denied", 0)),
            "allocations refused" if bad else "none",
            "alert" if bad else "",
        )
    )
    stats.extend(_denied_stat(d) for d in r["denied"][:2])
    if r["truncated_files"]:
        stats.append(_stat("truncated", str(len(r["truncated_files"])), "trace files", "alert"))
    return stats


def _denied_stat(d: ReportDenied) -> str:
    """A site the budget refused, named as the report and the denial line name it: the code
    that asked, the request, the budget and what was in use then."""
    via, limit, in_use = via_text(d), d.get("limit"), d.get("in_use")
    sub = "{}{}; budget {}, in use {}".format(
        "%d x %s requested" % (d["count"], format_bytes(d["bytes"] // max(1, d["count"]))),
        f" via {via}" if via else "",
        format_bytes(limit) if limit is not None else "?",
        format_bytes(in_use) if in_use is not None else "?",
    )
    return _stat("denied by the budget at", d["label"], sub, "wide alert")


def render_report_html(
    a: Analysis, r: Report | None = None, depth: int = 1, progress: ProgressFactory | None = None
) -> str:
    """The HTML page of one run; r: the report dict (built here at the peak when not given)."""
    if r is None:
        r = build_report(a, depth=depth)
    tables = Tables(depth=r.get("depth", depth))
    at = r["at"]
    moments = pick_moments(a, at=at)
    bar = progress("building the HTML report", len(moments)) if progress else None
    try:
        run = run_data(a, tables, moments, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    initial = 0
    at_time = at["time"]
    for i, mo in enumerate(run["moments"]):
        if mo["kind"] == at.get("kind", "peak") and (
            at.get("kind") != "time"
            or (at_time is not None and mo["t"] == round(min(at_time, run["span"][1]), 6))
        ):
            initial = i
            break
    else:
        initial = max(0, len(run["moments"]) - 1)
    version, generated = r.get("cudatrace_version", ""), _now()
    aggregation = aggregation_note([run], tables)
    data = {
        "kind": "report",
        "version": version,
        "generated": generated,
        "report": r,
        "run": run,
        "initial": initial,
        "aggregation": aggregation,
        **tables_json(tables),
    }
    e = html.escape
    cmd = _cmd(r["command"])
    title = "cudatrace: %s" % (os.path.basename(r["command"][0]) if r["command"] else r["path"])
    stats = _report_stats(a, r, at)
    body = _BODY_REPORT.format(
        title=e(title),
        cmd=e(cmd),
        generated=e(generated),
        version=e(version),
        stats="".join(stats),
        facts=_facts_html(r),
        text=e(render_text(r)),
        aggregation=e(aggregation),
        ranks=ranks_card(a, r),
    )
    return page(title + " — device memory report", data, body)


_HEADER = """<header class="top">
  <div class="brand">cudatrace<span>{what}</span></div>
  <h1>{title}</h1>
  <div class="cmd"><code>{cmd}</code></div>
</header>"""

# the flame graph's card and the footer, the same on both pages
_FLAME_CARD = """<section class="card" id="flame-card">
  <div class="card-head"><h2 id="flame-title">{flame_title}</h2>
    <div class="controls" id="flame-controls"></div></div>
  <div id="flame-sub" class="sub"></div>
  <div id="flame" class="flame"></div>
  <div id="flame-status" class="status"></div>
</section>
"""
_FOOTER = """<footer><p id="aggregation">{aggregation}.</p>
<p>Written by cudatrace {version} on {generated}. This file is self-contained: it loads nothing
from the network.</p></footer>
<div id="tip" class="tip" hidden></div>
"""

_BODY_REPORT = (
    _HEADER.replace("{what}", "device memory report")
    + """
<main>
<section class="stats">{stats}</section>
<section class="card" id="timeline-card">
  <div class="card-head"><h2>Live device memory over time</h2>
    <div class="controls" id="timeline-controls"></div></div>
  <div id="timeline" class="timeline"></div>
  <div id="legend" class="legend"></div>
  <p class="hint">Click the chart to choose a moment (the flame graph and the table follow; the
  arrow keys step between moments); drag across it to zoom in, double-click to zoom out.</p>
</section>
{ranks}"""
    + _FLAME_CARD.replace("{flame_title}", "Live at the chosen moment")
    + """<section class="card" id="sites-card">
  <div class="card-head"><h2 id="sites-title">Call sites</h2></div>
  <div id="sites"></div>
</section>
<section class="card" id="facts-card">
  <div class="card-head"><h2>The run</h2></div>
  {facts}
  <details><summary>The text report</summary><pre class="text">{text}</pre></details>
</section>
</main>
"""
    + _FOOTER
)


# ---- a diff -------------------------------------------------------------------------------


def render_diff_html(
    a: Analysis, b: Analysis, d: Diff, depth: int = 1, progress: ProgressFactory | None = None
) -> str:
    """The HTML page of a diff; d: the diff dict (cudatrace.diff/1) with every site: its data
    (both runs, the sites' changes), the figures side by side, the ranks card."""
    data = _diff_data(a, b, d, Tables(depth=depth))
    e = html.escape
    A, B = d["a"], d["b"]
    title = "cudatrace diff: {} vs {}".format(
        os.path.basename(A["path"].rstrip("/")) or A["path"],
        os.path.basename(B["path"].rstrip("/")) or B["path"],
    )
    c = d["status_counts"]
    body = _BODY_DIFF.format(
        title=e(title),
        cmd_a=e(_cmd(A["command"])),
        cmd_b=e(_cmd(B["command"])),
        path_a=e(A["path"]),
        path_b=e(B["path"]),
        stats="".join(_diff_stats(d)),
        counts=e(
            ", ".join(
                "%d %s" % (c[k], k) for k in ("grown", "shrunk", "new", "gone", "same") if c[k]
            )
            or "no sites"
        ),
        generated=e(data["generated"]),
        version=e(data["version"]),
        aggregation=e(data["aggregation"]),
        ranks=ranks_diff_card(d),
    )
    return page(title, data, body)


def _diff_data(a: Analysis, b: Analysis, d: Diff, tables: Tables) -> dict[str, Any]:
    """The page's data: both runs at their peak and end, the sites' changes (the first
    MAX_SITE_CHANGES), the tables of frames and stacks they share."""
    runs: list[RunData] = []
    for side, an in ((0, a), (1, b)):
        m = an.model
        moments: list[Moment] = []
        if m.found:
            moments.append({"kind": "peak", "ts": m.peak_ts, "seq": m.peak_seq})
        if m.n_events:
            moments.append({"kind": "end", "ts": m.t_end, "seq": NONE64 - 1})
        runs.append(run_data(an, tables, moments, side=side))
        runs[-1]["first_alloc"] = first_allocation(an)
    return {
        "kind": "diff",
        "version": _version(),
        "generated": _now(),
        "diff": dict(
            d,
            sites=d["sites"][:MAX_SITE_CHANGES],
            more_sites=d.get("more_sites", 0) + max(0, len(d["sites"]) - MAX_SITE_CHANGES),
        ),
        "runs": runs,
        "aggregation": aggregation_note(runs, tables),
        **tables_json(tables),
    }


def _delta(x: int, pct_of: int | None = None) -> str:
    s = ("+" if x > 0 else "-" if x < 0 else "") + format_bytes(abs(x)) if x else "no change"
    if pct_of:
        s += " (%+.1f%%)" % (100.0 * x / pct_of)
    return s


def _diff_stats(d: Diff) -> list[str]:
    """The figures of both runs side by side: peaks, the change, what was live at exit, the
    allocations."""
    A, B, T = d["a"], d["b"], d["totals"]
    pd, ed = T["peak_bytes"]["delta"], T["end_bytes"]["delta"]
    return [
        _stat(
            "peak A",
            format_bytes(A["peak_bytes"]),
            "at {}".format(_when(A["peak_time"])) if A["peak_time"] is not None else "",
        ),
        _stat(
            "peak B",
            format_bytes(B["peak_bytes"]),
            "at {}".format(_when(B["peak_time"])) if B["peak_time"] is not None else "",
        ),
        _stat(
            "peak change",
            _delta(pd, A["peak_bytes"] or None),
            "B minus A",
            "grown" if pd > 0 else "shrunk" if pd < 0 else "",
        ),
        _stat(
            "live at exit",
            "{} → {}".format(format_bytes(A["end_bytes"]), format_bytes(B["end_bytes"])),
            _delta(ed),
        ),
        _stat(
            "allocations",
            "%d → %d" % (A["allocs"], B["allocs"]),
            "failed %d → %d, denied %d → %d" % (A["failed"], B["failed"], A["denied"], B["denied"]),
        ),
    ]


def _version() -> str:
    from ... import __version__

    return __version__


_BODY_DIFF = (
    """<header class="top">
  <div class="brand">cudatrace<span>diff</span></div>
  <h1>{title}</h1>
  <div class="cmd"><span class="tag a">A</span><code>{cmd_a}</code> <span class="path">{path_a}</span></div>
  <div class="cmd"><span class="tag b">B</span><code>{cmd_b}</code> <span class="path">{path_b}</span></div>
</header>
<main>
<section class="stats">{stats}</section>
<section class="card" id="timeline-card">
  <div class="card-head"><h2>Live device memory: A and B</h2>
    <div class="controls" id="timeline-controls"></div></div>
  <div id="timeline" class="timeline"></div>
  <div id="legend" class="legend"></div>
  <p class="hint">Drag across the chart to zoom in, double-click to zoom out.</p>
</section>
"""
    + _FLAME_CARD.replace("{flame_title}", "What changed")
    + """<section class="card" id="sites-card">
  <div class="card-head"><h2 id="sites-title">Site changes: {counts}</h2></div>
  <div id="sites"></div>
</section>
{ranks}</main>
"""
    + _FOOTER
)


# ---- writing ------------------------------------------------------------------------------


def write_html(path: str | Path, text: str) -> Path:
    """The page, by the rules of outputs.py (its text lossless: no byte of a trace can make
    it unwritable)."""
    from ...outputs import write_output
    from ...units import lossless

    write_output(path, lossless(text))
    return Path(path)
