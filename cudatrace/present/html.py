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
from pathlib import Path

from ..analyze.analysis import Analysis, build_report
from ..analyze.model import NONE64, Groups
from ..analyze.sites import NO_STACK, SFrame, Site, key_text, site_of
from ..units import format_bytes
from .report import render_text

ASSETS = Path(__file__).resolve().parent / "html_assets"
MAX_MOMENTS = 200            # live-set snapshots kept per run
MAX_EVENTS = 500             # denials / failed allocations marked on the timeline
MAX_POINTS = 3000            # points of the exact timeline line, per view
MAX_SAMPLES = 2000           # points per observed series
MAX_SITE_CHANGES = 500       # rows of a diff's site table
FAIL_MOMENTS = 20            # failures and denials that get their own snapshot
MAX_ROWS = 300               # stacks kept per moment; the smaller rest is one row per process
OTHER = "(smaller stacks, aggregated)"


# ---- tables shared by the moments: frames, stacks, sites ----------------------------------

class Tables:
    """Frames, stacks (root first) and sites, each stored once; ids are list indexes.

    by_key: frames are the same when SFrame.key() is (names, not addresses: what diff matches
    runs by); otherwise when module and label are."""

    def __init__(self, depth: int = 1, by_key: bool = False):
        self.depth = depth
        self.by_key = by_key
        self.frames: list[list] = []          # [label, module basename]
        self._frame_ids: dict = {}
        self.stacks: list[list] = []          # [site id, [frame ids, root first]]
        self._stack_ids: dict = {}
        self.sites: list[dict] = []
        self._site_ids: dict = {}
        self._by_leaf: dict = {}              # (analysis id, trace, leaf) -> stack id
        self.aggregated = 0                   # moments whose smaller stacks were merged
        self._row_memo: dict = {}

    def frame(self, f: SFrame | None) -> int:
        if f is None:
            ident, row = ("", NO_STACK), [NO_STACK, ""]
        else:
            ident = f.key() if self.by_key else (f.module, f.label())
            row = [_key_label(f) if self.by_key else f.label(), os.path.basename(f.module)]
        i = self._frame_ids.get(ident)
        if i is None:
            i = self._frame_ids[ident] = len(self.frames)
            self.frames.append(row)
        return i

    def site(self, key: tuple, frames: list[SFrame]) -> int:
        i = self._site_ids.get(key)
        if i is None:
            i = self._site_ids[key] = len(self.sites)
            self.sites.append({"label": Site(key, list(frames)).label(), "key": key_text(key),
                               "apis": {}, "run_count": [0, 0], "run_bytes": [0, 0],
                               "stack": []})
        return i

    def other(self) -> int:
        """The stack that stands for a moment's smaller stacks, merged."""
        sid = self._stack_ids.get(OTHER)
        if sid is None:
            site = self.site((OTHER,), [])
            self.sites[site]["label"] = OTHER
            fid = len(self.frames)
            self.frames.append([OTHER, ""])
            sid = self._stack_ids[OTHER] = len(self.stacks)
            self.stacks.append([site, [fid]])
        return sid

    def stack(self, a: Analysis, ti: int, leaf: int) -> int:
        k = (id(a), ti, leaf)
        sid = self._by_leaf.get(k)
        if sid is not None:
            return sid
        fr = a.stacks.frames(ti, leaf) if leaf else []
        key, sfr = site_of(a.stacks, ti, leaf, self.depth)
        site = self.site(key, sfr)
        shown = _trim(fr)
        ids = tuple(self.frame(f) for f in reversed(shown)) if shown else (self.frame(None),)
        sid = self._stack_ids.get((site, ids))
        if sid is None:
            sid = self._stack_ids[(site, ids)] = len(self.stacks)
            self.stacks.append([site, list(ids)])
            s = self.sites[site]
            if not s["stack"] and shown:
                s["stack"] = [f.long_label() for f in shown]
        self._by_leaf[k] = sid
        return sid


def _key_label(f: SFrame) -> str:
    """A frame's label without its line: what frames matched by SFrame.key() have in common."""
    if f.function:
        return "%s (%s)" % (f.function, os.path.basename(f.file)) if f.file else f.function
    return f.label()


def _trim(frames: list[SFrame]) -> list[SFrame]:
    """Frames up to main, as the report lists them (beyond it: the C runtime starting it)."""
    for i, f in enumerate(frames):
        if f.function == "main":
            return frames[:i + 1]
    return frames


def _api(t, api: int, rt: int) -> str:
    s = t.api_name(api)
    return s + (" (%s)" % t.api_name(rt) if rt else "")


# ---- moments ------------------------------------------------------------------------------

def pick_moments(a: Analysis, limit: int = MAX_MOMENTS, at: dict | None = None) -> list[dict]:
    """The moments whose live set is kept: the peak, the end, each device's own peak, the
    report's --at moment, the first failures and denials, then, in as many equal slices of the
    run as room is left, the highest point of the live total in each (so a run of fewer changes
    than the limit keeps every change)."""
    m = a.model
    out: list[dict] = []
    if not m.n_events:
        return out
    if m.found:
        out.append({"kind": "peak", "ts": m.peak_ts, "seq": m.peak_seq})
    out.append({"kind": "end", "ts": m.t_end, "seq": NONE64 - 1})
    if len(m.device_peaks) > 1:
        for dev, (b, ts) in sorted(m.device_peaks.items()):
            out.append({"kind": "device peak", "ts": ts, "seq": m.device_peak_seq[dev], "device": dev})
    if at and at.get("kind") == "time" and at.get("ts_ns") is not None:
        out.append({"kind": "time", "ts": min(at["ts_ns"], m.t_end), "seq": None})
    seen_ts = set()
    for kind, lst in (("failed", m.failed), ("denied", m.denied)):
        for x in lst:
            if len(seen_ts) >= FAIL_MOMENTS:
                break
            if x.ts not in seen_ts:
                seen_ts.add(x.ts)
                out.append({"kind": kind, "ts": x.ts, "seq": None})
    pts = m.timeline_points(None)[1:]
    room = max(0, limit - len(out))
    taken = {(o["ts"], o["kind"]) for o in out}
    if pts and room:
        if len(pts) <= room:
            chosen = pts
        else:
            t0, t1 = pts[0][0], pts[-1][0]
            span = max(1, t1 - t0)
            best: dict[int, tuple] = {}
            for ts, v in pts:
                k = min(room - 1, (ts - t0) * room // span)
                if k not in best or v > best[k][1]:
                    best[k] = (ts, v)
            chosen = [best[k] for k in sorted(best)]
        for ts, _v in chosen:
            if (ts, "time") not in taken and not (m.found and ts == m.peak_ts):
                out.append({"kind": "time", "ts": ts, "seq": None})
                taken.add((ts, "time"))
    out.sort(key=lambda o: (o["ts"], o["kind"] != "time"))
    return out


def _groups(a: Analysis, mo: dict) -> Groups:
    m = a.model
    if mo["kind"] == "peak":
        return m.groups_at_peak()
    if mo["kind"] == "end":
        return m.groups_at_end()
    if mo.get("seq") is not None:
        return m.backend.groups(False, mo["seq"])
    return m.groups_at(mo["ts"])


def snapshot(a: Analysis, tables: Tables, groups: Groups) -> tuple[int, int, list[int]]:
    """(bytes, count, rows): rows flattened as stack, process, device, bytes, count."""
    agg: dict[tuple, list[int]] = {}
    memo = tables._row_memo
    for ti, leaf, api, rt, dev, count, nbytes, *_ in groups.rows:
        got = memo.get((id(a), ti, leaf, api, rt))
        if got is None:
            sid = tables.stack(a, ti, leaf)
            got = memo[(id(a), ti, leaf, api, rt)] = (sid, tables.sites[tables.stacks[sid][0]]["apis"],
                                                      _api(a.traces[ti], api, rt))
        sid, apis, name = got
        apis[name] = apis.get(name, 0) + count
        k = (sid, ti, dev)
        x = agg.get(k)
        if x is None:
            agg[k] = [nbytes, count]
        else:
            x[0] += nbytes
            x[1] += count
    rows: list[int] = []
    order = sorted(agg.items(), key=lambda kv: -kv[1][0])
    for (sid, ti, dev), (b, c) in order[:MAX_ROWS]:
        rows.extend((sid, ti, dev, b, c))
    if len(order) > MAX_ROWS:
        tables.aggregated += 1
        rest: dict[tuple, list[int]] = {}
        for (sid, ti, dev), (b, c) in order[MAX_ROWS:]:
            x = rest.setdefault((ti, dev), [0, 0])
            x[0] += b
            x[1] += c
        other = tables.other()
        for (ti, dev), (b, c) in sorted(rest.items()):
            rows.extend((other, ti, dev, b, c))
    return groups.bytes, groups.count, rows


# ---- series -------------------------------------------------------------------------------

def _thin(points: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """At most about `limit` points: in each of limit/3 time slices the lowest, the highest
    and the last point, in time order (every extreme of the line is kept)."""
    if len(points) <= limit:
        return points
    n = max(1, limit // 3)
    t0, t1 = points[0][0], points[-1][0]
    span = max(1, t1 - t0)
    slices: dict[int, list] = {}
    for p in points:
        k = min(n - 1, (p[0] - t0) * n // span)
        s = slices.get(k)
        if s is None:
            slices[k] = [p, p, p]
        else:
            if p[1] < s[0][1]:
                s[0] = p
            if p[1] > s[1][1]:
                s[1] = p
            s[2] = p
    out = [points[0]]
    for k in sorted(slices):
        for p in sorted(set(slices[k])):
            if p != out[-1]:
                out.append(p)
    if out[-1] != points[-1]:
        out.append(points[-1])
    return out


def _flat(a: Analysis, points) -> list:
    out: list = []
    for ts, v in points:
        out.append(a.seconds(ts))
        out.append(int(v))
    return out


def _observed(a: Analysis, device: int | None) -> dict:
    obs = a.observed.series(device)
    no_nvml = not a.observed.nvml_devices(device) and not obs["tree_device"]
    out = {}
    if obs["tree_device"]:
        out["tree_device"] = _flat(a, _thin(obs["tree_device"], MAX_SAMPLES))
    if obs["device_used"] and not no_nvml:
        out["device_used"] = _flat(a, _thin(obs["device_used"], MAX_SAMPLES))
    if obs["mem_available"]:
        base = obs["mem_available"][0][1]
        drop = [(t, max(0, base - v)) for t, v in obs["mem_available"]]
        out["mem_available_drop"] = _flat(a, _thin(drop, MAX_SAMPLES))
    if obs["tree_rss"] and no_nvml:
        out["tree_rss"] = _flat(a, _thin(obs["tree_rss"], MAX_SAMPLES))
    return out


def _events(a: Analysis, tables: Tables) -> list[list]:
    """[time, "denied" | "failed", device, bytes requested, bytes in use then, site label, note]"""
    from ..analyze.analysis import cu_error
    m = a.model
    out = []
    for x in m.denied[:MAX_EVENTS]:
        sid = tables.stack(a, x.trace, x.stack)
        out.append([a.seconds(x.ts), "denied", x.device, x.size, x.event[4],
                    tables.sites[tables.stacks[sid][0]]["label"],
                    "budget %s, in use %s" % (format_bytes(x.event[3]), format_bytes(x.event[4]))])
    fails = m.failed[:MAX_EVENTS]
    for x in fails:
        sid = tables.stack(a, x.trace, x.stack)
        live = m.live_bytes_at(x.ts, x.device)[0] if len(fails) <= 200 else None
        out.append([a.seconds(x.ts), "failed", x.device, x.size, live,
                    tables.sites[tables.stacks[sid][0]]["label"], cu_error(x.result)])
    out.sort(key=lambda e: e[0])
    return out


# ---- one run ------------------------------------------------------------------------------

def run_data(a: Analysis, tables: Tables, moments: list[dict], side: int = 0,
             progress=None) -> dict:
    """A run's timeline, observations, budget, events and live-set snapshots."""
    m = a.model
    devices = sorted(m.device_peaks)
    limits = a.budget_limits()
    used_limits = {d: v for d, v in limits.items() if d in m.device_peaks}
    views = {"all": {"line": _flat(a, _thin(m.timeline_points(None), MAX_POINTS)) if m.found else [],
                     "observed": _observed(a, None),
                     "budget": sum(used_limits.values()) if used_limits else None,
                     "peak": [a.seconds(m.peak_ts), m.peak_bytes] if m.found else None}}
    if len(devices) > 1:
        for d in devices:
            b, ts = m.device_peaks[d]
            views[str(d)] = {"line": _flat(a, _thin(m.timeline_points(d), MAX_POINTS)),
                             "observed": _observed(a, d), "budget": limits.get(d),
                             "peak": [a.seconds(ts), b]}
    totals = m.stack_totals()
    a.stacks.prepare([k for k in totals if k[1]])         # symbolize every stack in one pass
    snaps = []
    for mo in moments:
        total, count, rows = snapshot(a, tables, _groups(a, mo))
        snaps.append({"t": a.seconds(mo["ts"]), "kind": mo["kind"], "device": mo.get("device"),
                      "bytes": total, "count": count, "rows": rows})
        if progress is not None:
            progress.step()
    for (ti, leaf), (cnt, nbytes) in totals.items():
        s = tables.sites[tables.stacks[tables.stack(a, ti, leaf)][0]]
        s["run_count"][side] += cnt
        s["run_bytes"][side] += nbytes
    t_first = a.seconds(m.t0) if m.n_events else 0.0
    t_last = a.seconds(m.t_end) if m.n_events else 0.0
    obs_end = max([0.0] + [v[-2] for view in views.values() for v in view["observed"].values() if v])
    return {"path": str(a.path), "devices": devices, "views": views, "moments": snaps,
            "events": _events(a, tables),
            "procs": [[t.pid, os.path.basename(t.exe) or "?"] for t in a.traces],
            "span": [t_first, t_last, max(t_last, obs_end)],
            "changes": len(m.timeline_points(None)) - 1 if m.found else 0}


def _tables_json(tables: Tables) -> dict:
    sites = []
    for s in tables.sites:
        apis = sorted(s["apis"].items(), key=lambda kv: -kv[1])
        sites.append([s["label"], s["key"], [k for k, _ in apis], s["run_count"], s["run_bytes"],
                      s["stack"]])
    return {"frames": tables.frames, "stacks": tables.stacks, "sites": sites}


def _aggregation(runs: list[dict], tables: Tables) -> str:
    parts = []
    for side, r in enumerate(runs):
        n = len(r["moments"])
        parts.append("%s%d moment%s of %d change%s of the live total kept%s" % (
            ("AB"[side] + ": ") if len(runs) > 1 else "", n, "" if n == 1 else "s", r["changes"], "" if r["changes"] == 1 else "s",
            " (every change)" if n >= r["changes"] else " (the peak and the end)" if len(runs) > 1 else
            " (the peak, the end, failures and denials, and the highest point of each of "
            "equal slices of the run)"))
    merged = ("; at %d moment%s the stacks beyond the %d largest are merged into one "
              "\"%s\" row per process and device (totals stay exact)"
              % (tables.aggregated, "" if tables.aggregated == 1 else "s", MAX_ROWS, OTHER)
              if tables.aggregated else "")
    return ("%s; allocations grouped by stack, process and device (%d stacks, %d frames, "
            "%d sites)%s; stacks shown up to main, CUDA's own frames folded as in the report"
            % ("; ".join(parts), len(tables.stacks), len(tables.frames), len(tables.sites), merged))


# ---- the page -----------------------------------------------------------------------------

def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _json_for_script(doc) -> str:
    """JSON safe inside <script>: no '<' at all (so no '</script>' or '<!--')."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page(title: str, data: dict, body: str) -> str:
    e = html.escape
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n",
        "<meta name=\"generator\" content=\"cudatrace %s\">\n" % e(data.get("version", "")),
        "<title>%s</title>\n<style>\n%s</style>\n</head>\n<body>\n" % (e(title), _asset("report.css")),
        body,
        "\n<script type=\"application/json\" id=\"ct-data\">%s</script>\n" % _json_for_script(data),
        "<script>\n%s</script>\n</body>\n</html>\n" % _asset("report.js"),
    ])


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _cmd(argv) -> str:
    return " ".join(argv) if argv else "?"


def _fact(k: str, v: str, raw: bool = False) -> str:
    return "<tr><th>%s</th><td>%s</td></tr>" % (html.escape(k), v if raw else html.escape(v))


def _facts_html(r: dict) -> str:
    """The run's facts as static HTML (readable even where scripts are off)."""
    from .report import _limits_text, driver_text
    e = html.escape
    rows = [_fact("command", "<code>%s</code>" % e(_cmd(r["command"])), raw=True),
            _fact("trace", r["path"])]
    if r.get("start_time"):
        rows.append(_fact("started", _dt.datetime.fromtimestamp(r["start_time"], _dt.timezone.utc)
                          .strftime("%Y-%m-%d %H:%M:%S UTC")))
    rows.append(_fact("exit status", "not recorded" if r.get("exit_status") is None
                      else str(r["exit_status"])))
    rows.append(_fact("duration", _when(r.get("duration") or 0)))
    b = r.get("budget")
    if b:
        lim = _limits_text(b["limits"]) or "spec %s" % b.get("spec")
        rows.append(_fact("budget", "%s (over budget: %s%s%s)" % (
            lim, b.get("on_exceed") or "?", "; group %s" % b["group"] if b.get("group") else "",
            "; the run was aborted" if b.get("aborted") else "")))
    else:
        rows.append(_fact("budget", "none"))
    c = r["counts"]
    rows.append(_fact("events", "{:,} events; {:,} device allocations, {:,} frees, {:,} failed, "
                      "{:,} denied; pinned host peak {}".format(
                          c.get("events", 0), c.get("allocs", 0), c.get("frees", 0),
                          c.get("failed", 0), c.get("denied", 0),
                          format_bytes(r["host_pinned"]["peak_bytes"]))))
    v = r["versions"]
    parts = ["%s frames per event" % "/".join(str(d) for d in v["stack_depth"])]
    if v["driver"]:
        parts.append("driver %s" % ", ".join(driver_text(d) for d in v["driver"]))
    if v.get("nvml_driver"):
        parts.append("NVML driver %s" % v["nvml_driver"])
    if v["shim"]:
        parts.append("shim %s" % ", ".join(v["shim"]))
    rows.append(_fact("recorded with", "; ".join(parts)))
    from .report import _render_observed
    obs: list[str] = []
    _render_observed(r, obs.append)
    rows.append(_fact("observed", '<pre class="obs">%s</pre>' % e("\n".join(x for x in obs if x.strip())),
                      raw=True))
    out = ['<table class="facts">%s</table>' % "".join(rows)]

    procs = ['<tr><th>pid</th><th>ppid</th><th>program</th><th class="n">allocations</th>'
             '<th class="n">peak</th><th class="n">at exit</th><th class="n">failed</th>'
             '<th class="n">denied</th><th>status</th><th>file</th></tr>']
    for p in r["processes"]:
        st = p["status"]
        if st == "complete":
            st = "exit %s" % p["exit_code"] if p["exit_code"] not in (None, -1) else "complete"
            cls = ""
        else:
            st = "truncated (killed, crashed or still running)"
            cls = ' class="warn"'
        procs.append("<tr%s><td>%d</td><td>%d</td><td title=\"%s\">%s</td><td class=\"n\">%s</td>"
                     "<td class=\"n\">%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td>"
                     "<td class=\"n\">%s</td><td>%s</td><td><code>%s</code></td></tr>" % (
                         cls, p["pid"], p["ppid"], e(_cmd(p.get("argv") or [p["exe"]])),
                         e(os.path.basename(p["exe"]) or "?"), "{:,}".format(p["allocs"]),
                         format_bytes(p["peak_bytes"]), format_bytes(p["end_bytes"]),
                         p["failed"], p["denied"], e(st), e(p["file"])))
    out.append('<h3>Processes</h3><div class="facts-wrap"><table class="grid">%s</table></div>'
               % "".join(procs))
    notes = []
    for t in r["truncated_files"]:
        notes.append("truncated: %s (pid %d, %d events): %s" % (t["file"], t["pid"], t["events"],
                                                                t["reason"]))
    for u in r["unreadable_files"]:
        notes.append("unreadable: %s" % u)
    notes.extend(r["warnings"])
    if notes:
        out.append('<h3>Notes</h3><ul class="notes">%s</ul>'
                   % "".join("<li>%s</li>" % e(n) for n in notes))
    return "".join(out)


def _when(t: float) -> str:
    """Seconds since the start as the page's charts write them."""
    return "%.3f ms" % (t * 1e3) if abs(t) < 1 else "%.3f s" % t


def _stat(label: str, value: str, sub: str = "", cls: str = "") -> str:
    return ('<div class="stat%s"><div class="k">%s</div><div class="v">%s</div>'
            '<div class="s">%s</div></div>' % (" " + cls if cls else "", html.escape(label),
                                               html.escape(value), html.escape(sub)))


def render_report_html(a: Analysis, r: dict | None = None, depth: int = 1, progress=None) -> str:
    """The HTML page of one run; r: the report dict (built here at the peak when not given)."""
    if r is None:
        r = build_report(a, depth=depth)
    tables = Tables(depth=r.get("depth", depth))
    moments = pick_moments(a, at=r.get("at"))
    bar = progress("building the HTML report", len(moments)) if progress else None
    try:
        run = run_data(a, tables, moments, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    at = r.get("at") or {}
    initial = 0
    for i, mo in enumerate(run["moments"]):
        if mo["kind"] == at.get("kind", "peak") and (at.get("kind") != "time"
                                                     or mo["t"] == round(min(at["time"], run["span"][1]), 6)):
            initial = i
            break
    else:
        initial = max(0, len(run["moments"]) - 1)
    data = {"kind": "report", "version": r.get("cudatrace_version", ""), "generated": _now(),
            "report": r, "run": run, "initial": initial,
            "aggregation": _aggregation([run], tables), **_tables_json(tables)}
    e = html.escape
    cmd = _cmd(r["command"])
    title = "cudatrace: %s" % (os.path.basename(r["command"][0]) if r["command"] else r["path"])
    stats = [_stat("peak", format_bytes(r["peak_bytes"]) if r["peak_time"] is not None else "none",
                   "at %s" % _when(r["peak_time"]) if r["peak_time"] is not None else "nothing allocated"),
             _stat("live at exit", format_bytes(r["end_bytes"]),
                   "never freed" if r["end_bytes"] else "everything freed")]
    c = r["counts"]
    stats.append(_stat("allocations", "{:,}".format(c.get("allocs", 0)),
                       "{:,} process{}".format(len(r["processes"]),
                                               "" if len(r["processes"]) == 1 else "es")))
    if r["sites"]:
        s0 = r["sites"][0]
        stats.append(_stat("top site at the %s" % (at.get("kind") or "peak"), s0["label"],
                           "%s in %d allocation%s (%.1f%%)" % (format_bytes(s0["bytes"]), s0["count"],
                                                              "" if s0["count"] == 1 else "s",
                                                              100 * s0["share"]), "wide"))
    if r.get("budget"):
        lim = [v for d, v in r["budget"]["limits"].items() if int(d) in a.model.device_peaks]
        stats.append(_stat("budget", format_bytes(sum(lim)) if lim else "set",
                           "on_exceed %s" % r["budget"].get("on_exceed")))
    bad = c.get("failed", 0) + c.get("denied", 0)
    stats.append(_stat("failed / denied", "%d / %d" % (c.get("failed", 0), c.get("denied", 0)),
                       "allocations refused" if bad else "none", "alert" if bad else ""))
    if r["truncated_files"]:
        stats.append(_stat("truncated", str(len(r["truncated_files"])), "trace files", "alert"))
    body = _BODY_REPORT.format(
        title=e(title), cmd=e(cmd), generated=e(data["generated"]), version=e(data["version"]),
        stats="".join(stats), facts=_facts_html(r), text=e(render_text(r)),
        aggregation=e(data["aggregation"]))
    return page(title + " — device memory report", data, body)


_HEADER = """<header class="top">
  <div class="brand">cudatrace<span>{what}</span></div>
  <h1>{title}</h1>
  <div class="cmd"><code>{cmd}</code></div>
</header>"""

_BODY_REPORT = _HEADER.replace("{what}", "device memory report") + """
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
<section class="card" id="flame-card">
  <div class="card-head"><h2 id="flame-title">Live at the chosen moment</h2>
    <div class="controls" id="flame-controls"></div></div>
  <div id="flame-sub" class="sub"></div>
  <div id="flame" class="flame"></div>
  <div id="flame-status" class="status"></div>
</section>
<section class="card" id="sites-card">
  <div class="card-head"><h2 id="sites-title">Call sites</h2></div>
  <div id="sites"></div>
</section>
<section class="card" id="facts-card">
  <div class="card-head"><h2>The run</h2></div>
  {facts}
  <details><summary>The text report</summary><pre class="text">{text}</pre></details>
</section>
</main>
<footer><p id="aggregation">{aggregation}.</p>
<p>Written by cudatrace {version} on {generated}. This file is self-contained: it loads nothing
from the network.</p></footer>
<div id="tip" class="tip" hidden></div>
"""


# ---- a diff -------------------------------------------------------------------------------

def render_diff_html(a: Analysis, b: Analysis, d: dict, depth: int = 1, progress=None) -> str:
    """The HTML page of a diff; d: the diff dict (cudatrace.diff/1) with every site."""
    tables = Tables(depth=depth, by_key=True)
    runs = []
    for side, an in ((0, a), (1, b)):
        m = an.model
        moments = ([{"kind": "peak", "ts": m.peak_ts, "seq": m.peak_seq}] if m.found else []) + \
                  ([{"kind": "end", "ts": m.t_end, "seq": NONE64 - 1}] if m.n_events else [])
        runs.append(run_data(an, tables, moments, side=side))
    data = {"kind": "diff", "version": d.get("cudatrace_version") or _version(), "generated": _now(),
            "diff": dict(d, sites=d["sites"][:MAX_SITE_CHANGES],
                         more_sites=d.get("more_sites", 0) + max(0, len(d["sites"]) - MAX_SITE_CHANGES)),
            "runs": runs, "aggregation": _aggregation(runs, tables), **_tables_json(tables)}
    e = html.escape
    A, B, T = d["a"], d["b"], d["totals"]
    title = "cudatrace diff: %s vs %s" % (os.path.basename(A["path"].rstrip("/")) or A["path"],
                                          os.path.basename(B["path"].rstrip("/")) or B["path"])

    def delta(x, pct_of=None):
        s = ("+" if x > 0 else "-" if x < 0 else "") + format_bytes(abs(x)) if x else "no change"
        if pct_of:
            s += " (%+.1f%%)" % (100.0 * x / pct_of)
        return s

    pd, ed = T["peak_bytes"]["delta"], T["end_bytes"]["delta"]
    stats = [_stat("peak A", format_bytes(A["peak_bytes"]),
                   "at %s" % _when(A["peak_time"]) if A["peak_time"] is not None else ""),
             _stat("peak B", format_bytes(B["peak_bytes"]),
                   "at %s" % _when(B["peak_time"]) if B["peak_time"] is not None else ""),
             _stat("peak change", delta(pd, A["peak_bytes"] or None), "B minus A",
                   "grown" if pd > 0 else "shrunk" if pd < 0 else ""),
             _stat("live at exit", "%s → %s" % (format_bytes(A["end_bytes"]), format_bytes(B["end_bytes"])),
                   delta(ed)),
             _stat("allocations", "%d → %d" % (A["allocs"], B["allocs"]),
                   "failed %d → %d, denied %d → %d" % (A["failed"], B["failed"], A["denied"], B["denied"]))]
    c = d["status_counts"]
    body = _BODY_DIFF.format(
        title=e(title), cmd_a=e(_cmd(A["command"])), cmd_b=e(_cmd(B["command"])),
        path_a=e(A["path"]), path_b=e(B["path"]), stats="".join(stats),
        counts=e(", ".join("%d %s" % (c[k], k) for k in ("grown", "shrunk", "new", "gone", "same") if c[k])
                 or "no sites"),
        generated=e(data["generated"]), version=e(data["version"]),
        aggregation=e(data["aggregation"]))
    return page(title, data, body)


def _version() -> str:
    from .. import __version__
    return __version__


_BODY_DIFF = """<header class="top">
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
<section class="card" id="flame-card">
  <div class="card-head"><h2 id="flame-title">What changed</h2>
    <div class="controls" id="flame-controls"></div></div>
  <div id="flame-sub" class="sub"></div>
  <div id="flame" class="flame"></div>
  <div id="flame-status" class="status"></div>
</section>
<section class="card" id="sites-card">
  <div class="card-head"><h2 id="sites-title">Site changes: {counts}</h2></div>
  <div id="sites"></div>
</section>
</main>
<footer><p id="aggregation">{aggregation}.</p>
<p>Written by cudatrace {version} on {generated}. This file is self-contained: it loads nothing
from the network.</p></footer>
<div id="tip" class="tip" hidden></div>
"""


# ---- writing ------------------------------------------------------------------------------

def write_html(path, text: str) -> Path:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)
    return p
