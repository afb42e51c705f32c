"""The data of the HTML page (html/page.py): the tables of frames, stacks and sites stored
once, the live set at a bounded number of moments, the exact timeline, observed series and
marked events, as plain JSON-able structures."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TypedDict, Union, cast

from ...analyze.documents.analysis import Analysis
from ...analyze.documents.report_types import ReportAt
from ...analyze.read.tags import rank_label_of, tagged
from ...analyze.read.trace import Trace
from ...analyze.replay.lives import NONE64, Groups
from ...analyze.sites.group import NO_STACK, Site, key_text, site_of
from ...analyze.sites.stacks import SFrame
from ...symbols.progress import ProgressLike
from ...units import format_bytes

ASSETS = Path(__file__).resolve().parent  # page.js and page.css
MAX_MOMENTS = 200  # live-set snapshots kept per run
MAX_EVENTS = 500  # denials / failed allocations marked on the timeline
MAX_POINTS = 3000  # points of the exact timeline line, per view
MAX_SAMPLES = 2000  # points per observed series
MAX_SITE_CHANGES = 500  # rows of a diff's site table
FAIL_MOMENTS = 20  # failures and denials that get their own snapshot
MAX_ROWS = 300  # stacks kept per moment; the smaller rest is one row per process
OTHER = "(smaller stacks, aggregated)"


# ---- what the page's data is made of -----------------------------------------------------


class _MomentRequired(TypedDict):
    kind: str  # peak, end, device peak, time, failed, denied
    ts: int
    seq: int | None  # the model's event sequence number, when the moment is one event's


class Moment(_MomentRequired, total=False):
    """A moment whose live set is kept."""

    device: int  # a device peak's


class Snapshot(TypedDict):
    """The live set at a moment: rows flattened as stack, process, device, bytes, count."""

    t: float | None
    kind: str
    device: int | None
    bytes: int
    count: int
    rows: list[int]


class PageSite(TypedDict):
    """A site of the page's tables, as Tables gathers it (tables_json writes it as a row)."""

    label: str
    key: str
    apis: dict[str, int]  # the API's label -> allocations through it, over the moments
    run_count: list[int]  # allocations, in run A and run B
    run_bytes: list[int]
    stack: list[str]  # its frames, root first, up to main


# a stack of the tables: (site id, frame ids root first then its layers', the layers' number);
# the stack standing for a moment's merged rows has no layers
StackRow = Union[tuple[int, list[int], int], tuple[int, list[int]]]


class View(TypedDict):
    """One of the page's views (the run, or one device): its live line, what was observed, the
    budget, the peak; times and values flattened as [t, v, t, v, ...]."""

    line: list[float | int | None]
    observed: dict[str, list[float | int | None]]
    budget: int | None
    peak: list[float | int | None] | None


class RunData(TypedDict):
    """A run's part of the page's data (run_data)."""

    path: str
    devices: list[int]
    views: dict[str, View]  # the page's JSON views: "all", and each device's
    moments: list[Snapshot]
    events: list[list[object]]  # events_json's rows
    procs: list[list[object]]  # [pid, executable's name]
    ranks: list[str] | None  # each process's rank label, where the traces are tagged
    span: list[float]
    changes: int
    first_alloc: float | None  # the run's first device allocation: a diff's curves start there


def first_allocation(a: Analysis) -> float | None:
    """When the run's first device allocation was made (seconds from its start); None when it
    made none. A diff's page lines A and B up there, so their curves overlay (their first
    events, a driver query or a context, come at different distances before it)."""
    first = min((x.ts for x in a.model.lifetimes()), default=None) if a.model.found else None
    return a.seconds(first)


# ---- tables shared by the moments: frames, stacks, sites ----------------------------------


class Tables:
    """Frames, stacks (root first) and sites, each stored once; ids are list indexes.

    Frames are the same when SFrame.key() is (function, file and module names, not lines or
    addresses: what diff matches runs by), in a report's page as in a diff's: `main` calling
    from three lines is one frame of the flame graph."""

    def __init__(self, depth: int = 1):
        self.depth = depth
        self.frames: list[list[str]] = []  # [label, module basename]
        self._frame_ids: dict[tuple[object, ...], int] = {}
        # (site id, (frame ids: root first down to the site, then its allocator layers), layers)
        self.stacks: list[StackRow] = []
        self._stack_ids: dict[object, int] = {}
        self.sites: list[PageSite] = []
        self._site_ids: dict[tuple[object, ...], int] = {}
        self._by_leaf: dict[tuple[int, int, int], int] = {}  # (analysis id, trace, leaf) -> stack
        self.aggregated = 0  # moments whose smaller stacks were merged
        # (analysis id, trace, leaf, api, runtime api) -> (stack id, its site's apis, api label)
        self._row_memo: dict[tuple[int, ...], tuple[int, dict[str, int], str]] = {}

    def frame(self, f: SFrame | None) -> int:
        if f is None:
            ident, row = ("", NO_STACK), [NO_STACK, ""]
        else:
            ident, row = f.key(), [key_label(f), os.path.basename(f.module)]
        i = self._frame_ids.get(ident)
        if i is None:
            i = self._frame_ids[ident] = len(self.frames)
            self.frames.append(row)
        return i

    def site(self, key: tuple[object, ...], frames: list[SFrame]) -> int:
        i = self._site_ids.get(key)
        if i is None:
            i = self._site_ids[key] = len(self.sites)
            self.sites.append(
                {
                    "label": Site(key, list(frames)).label(),
                    "key": key_text(key),
                    "apis": {},
                    "run_count": [0, 0],
                    "run_bytes": [0, 0],
                    "stack": [],
                }
            )
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
            self.stacks.append((site, [fid]))
        return sid

    def stack(self, a: Analysis, ti: int, leaf: int) -> int:
        k = (id(a), ti, leaf)
        sid = self._by_leaf.get(k)
        if sid is not None:
            return sid
        via, fr = a.stacks.split(ti, leaf) if leaf else ([], [])  # layers, and the site up
        key, sfr = site_of(a.stacks, ti, leaf, self.depth)
        site = self.site(key, sfr)
        shown = trim_to_main(fr)
        ids = tuple(self.frame(f) for f in reversed(shown)) if shown else (self.frame(None),)
        ids += tuple(self.frame(f) for f in reversed(via))  # the page opens them on demand
        sid = self._stack_ids.get((site, ids, len(via)))
        if sid is None:
            sid = self._stack_ids[(site, ids, len(via))] = len(self.stacks)
            self.stacks.append((site, list(ids), len(via)))
            s = self.sites[site]
            if not s["stack"] and shown:
                s["stack"] = [f.long_label() for f in shown]
        self._by_leaf[k] = sid
        return sid


def key_label(f: SFrame) -> str:
    """A frame's label without its line: what frames matched by SFrame.key() have in common."""
    if f.function:
        return f"{f.function} ({os.path.basename(f.file)})" if f.file else f.function
    return f.label()


def trim_to_main(frames: list[SFrame]) -> list[SFrame]:
    """Frames up to main, as the report lists them (beyond it: the C runtime starting it)."""
    for i, f in enumerate(frames):
        if f.function == "main":
            return frames[: i + 1]
    return frames


def api_label(t: Trace, api: int, rt: int) -> str:
    s = t.api_name(api)
    return s + (f" ({t.api_name(rt)})" if rt else "")


# ---- moments ------------------------------------------------------------------------------


def pick_moments(a: Analysis, limit: int = MAX_MOMENTS, at: ReportAt | None = None) -> list[Moment]:
    """The moments whose live set is kept: the peak, the end, each device's own peak, the
    report's --at moment, the first failures and denials, then, in as many equal slices of the
    run as room is left, the highest point of the live total in each (so a run of fewer changes
    than the limit keeps every change)."""
    m = a.model
    out: list[Moment] = []
    if not m.n_events:
        return out
    if m.found:
        out.append({"kind": "peak", "ts": m.peak_ts, "seq": m.peak_seq})
    out.append({"kind": "end", "ts": m.t_end, "seq": NONE64 - 1})
    if len(m.device_peaks) > 1:
        for dev, (_b, ts) in sorted(m.device_peaks.items()):
            out.append(
                {"kind": "device peak", "ts": ts, "seq": m.device_peak_seq[dev], "device": dev}
            )
    at_ts = at.get("ts_ns") if at and at.get("kind") == "time" else None
    if at_ts is not None:
        out.append({"kind": "time", "ts": min(at_ts, m.t_end), "seq": None})
    seen_ts: set[int] = set()
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
        for ts, _v in _highest_per_slice(pts, room):
            if (ts, "time") not in taken and not (m.found and ts == m.peak_ts):
                out.append({"kind": "time", "ts": ts, "seq": None})
                taken.add((ts, "time"))
    out.sort(key=lambda o: (o["ts"], o["kind"] != "time"))
    return out


def _highest_per_slice(pts: list[tuple[int, int]], room: int) -> list[tuple[int, int]]:
    """The highest (ts, value) point in each of `room` equal slices of the run (every point
    when there are no more than that)."""
    if len(pts) <= room:
        return pts
    t0, t1 = pts[0][0], pts[-1][0]
    span = max(1, t1 - t0)
    best: dict[int, tuple[int, int]] = {}
    for ts, v in pts:
        k = min(room - 1, (ts - t0) * room // span)
        if k not in best or v > best[k][1]:
            best[k] = (ts, v)
    return [best[k] for k in sorted(best)]


def groups_at(a: Analysis, mo: Moment) -> Groups:
    m = a.model
    if mo["kind"] == "peak":
        return m.groups_at_peak()
    if mo["kind"] == "end":
        return m.groups_at_end()
    seq = mo.get("seq")
    if seq is not None:
        return m.backend.groups(False, seq)
    return m.groups_at(mo["ts"])


def snapshot(a: Analysis, tables: Tables, groups: Groups) -> tuple[int, int, list[int]]:
    """(bytes, count, rows): rows flattened as stack, process, device, bytes, count."""
    agg: dict[tuple[int, int, int], list[int]] = {}
    memo = tables._row_memo
    for ti, leaf, api, rt, dev, count, nbytes, *_ in groups.rows:
        got = memo.get((id(a), ti, leaf, api, rt))
        if got is None:
            sid = tables.stack(a, ti, leaf)
            got = memo[(id(a), ti, leaf, api, rt)] = (
                sid,
                tables.sites[tables.stacks[sid][0]]["apis"],
                api_label(a.traces[ti], api, rt),
            )
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
        rest: dict[tuple[int, int], list[int]] = {}
        for (_sid, ti, dev), (b, c) in order[MAX_ROWS:]:
            x = rest.setdefault((ti, dev), [0, 0])
            x[0] += b
            x[1] += c
        other = tables.other()
        for (ti, dev), (b, c) in sorted(rest.items()):
            rows.extend((other, ti, dev, b, c))
    return groups.bytes, groups.count, rows


# ---- series -------------------------------------------------------------------------------


def thin(points: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """At most about `limit` points: in each of limit/3 time slices the lowest, the highest
    and the last point, in time order (every extreme of the line is kept)."""
    if len(points) <= limit:
        return points
    n = max(1, limit // 3)
    t0, t1 = points[0][0], points[-1][0]
    span = max(1, t1 - t0)
    slices: dict[int, list[tuple[int, int]]] = {}
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


def flat(a: Analysis, points: Iterable[tuple[int, int]]) -> list[float | int | None]:
    out: list[float | int | None] = []
    for ts, v in points:
        out.append(a.seconds(ts))
        out.append(int(v))
    return out


def observed_series(a: Analysis, device: int | None) -> dict[str, list[float | int | None]]:
    obs = a.observed.series(device)
    no_nvml = not a.observed.nvml_devices(device) and not obs["tree_device"]
    out = {}
    if obs["tree_device"]:
        out["tree_device"] = flat(a, thin(obs["tree_device"], MAX_SAMPLES))
    if obs["device_used"] and not no_nvml:
        out["device_used"] = flat(a, thin(obs["device_used"], MAX_SAMPLES))
    if obs["mem_available"]:
        base = obs["mem_available"][0][1]
        drop = [(t, max(0, base - v)) for t, v in obs["mem_available"]]
        out["mem_available_drop"] = flat(a, thin(drop, MAX_SAMPLES))
    if obs["tree_rss"] and no_nvml:
        out["tree_rss"] = flat(a, thin(obs["tree_rss"], MAX_SAMPLES))
    return out


def events_json(a: Analysis, tables: Tables) -> list[list[object]]:
    """[time, "denied" | "failed", device, bytes requested, bytes in use then, site label, note]"""
    from ...analyze.documents.cu_errors import cu_error

    m = a.model
    out: list[list[object]] = []
    for x in m.denied[:MAX_EVENTS]:
        sid = tables.stack(a, x.trace, x.stack)
        out.append(
            [
                a.seconds(x.ts),
                "denied",
                x.device,
                x.size,
                x.event[4],
                tables.sites[tables.stacks[sid][0]]["label"],
                f"budget {format_bytes(x.event[3])}, in use {format_bytes(x.event[4])}",
            ]
        )
    fails = m.failed[:MAX_EVENTS]
    for x in fails:
        sid = tables.stack(a, x.trace, x.stack)
        live = m.live_bytes_at(x.ts, x.device)[0] if len(fails) <= 200 else None
        out.append(
            [
                a.seconds(x.ts),
                "failed",
                x.device,
                x.size,
                live,
                tables.sites[tables.stacks[sid][0]]["label"],
                cu_error(x.result),
            ]
        )
    out.sort(key=lambda e: cast(float, e[0]))  # the time: first of each row
    return out


# ---- one run ------------------------------------------------------------------------------


def run_data(
    a: Analysis,
    tables: Tables,
    moments: list[Moment],
    side: int = 0,
    progress: ProgressLike | None = None,
) -> RunData:
    """A run's timeline, observations, budget, events and live-set snapshots."""
    m = a.model
    devices = sorted(m.device_peaks)
    limits = a.budget_limits()
    used_limits = {d: v for d, v in limits.items() if d in m.device_peaks}
    views: dict[str, View] = {
        "all": {
            "line": flat(a, thin(m.timeline_points(None), MAX_POINTS)) if m.found else [],
            "observed": observed_series(a, None),
            "budget": sum(used_limits.values()) if used_limits else None,
            "peak": [a.seconds(m.peak_ts), m.peak_bytes] if m.found else None,
        }
    }
    if len(devices) > 1:
        for d in devices:
            b, ts = m.device_peaks[d]
            views[str(d)] = {
                "line": flat(a, thin(m.timeline_points(d), MAX_POINTS)),
                "observed": observed_series(a, d),
                "budget": limits.get(d),
                "peak": [a.seconds(ts), b],
            }
    totals = m.stack_totals()
    a.stacks.prepare([k for k in totals if k[1]])  # symbolize every stack in one pass
    snaps: list[Snapshot] = []
    for mo in moments:
        total, count, rows = snapshot(a, tables, groups_at(a, mo))
        snaps.append(
            {
                "t": a.seconds(mo["ts"]),
                "kind": mo["kind"],
                "device": mo.get("device"),
                "bytes": total,
                "count": count,
                "rows": rows,
            }
        )
        if progress is not None:
            progress.step()
    for (ti, leaf), (cnt, nbytes) in totals.items():
        s = tables.sites[tables.stacks[tables.stack(a, ti, leaf)][0]]
        s["run_count"][side] += cnt
        s["run_bytes"][side] += nbytes
    t_first = (a.seconds(m.t0) or 0.0) if m.n_events else 0.0
    t_last = (a.seconds(m.t_end) or 0.0) if m.n_events else 0.0
    obs_end = max(
        [0.0]  # each series' last time (the series are flat: t, v, t, v ...)
        + [cast(float, v[-2]) for view in views.values() for v in view["observed"].values() if v]
    )
    return {
        "path": str(a.path),
        "devices": devices,
        "views": views,
        "moments": snaps,
        "events": events_json(a, tables),
        "procs": [[t.pid, os.path.basename(t.exe) or "?"] for t in a.traces],
        # each process's rank (docs/ranks.md): the timeline can be stacked by rank
        "ranks": rank_label_of(a.traces) if tagged(a.traces) else None,
        "span": [t_first, t_last, max(t_last, obs_end)],
        "changes": len(m.timeline_points(None)) - 1 if m.found else 0,
        "first_alloc": None,  # a diff's page sets it (first_allocation)
    }


class PageTables(TypedDict):
    frames: list[list[str]]
    stacks: list[StackRow]
    sites: list[list[object]]  # [label, key, apis by count, run_count, run_bytes, stack]


def tables_json(tables: Tables) -> PageTables:
    sites: list[list[object]] = []
    for s in tables.sites:
        apis = sorted(s["apis"].items(), key=lambda kv: -kv[1])
        sites.append(
            [s["label"], s["key"], [k for k, _ in apis], s["run_count"], s["run_bytes"], s["stack"]]
        )
    return {"frames": tables.frames, "stacks": tables.stacks, "sites": sites}


def aggregation_note(runs: list[RunData], tables: Tables) -> str:
    parts = []
    for side, r in enumerate(runs):
        n = len(r["moments"])
        parts.append(
            "%s%d moment%s of %d change%s of the live total kept%s"
            % (
                ("AB"[side] + ": ") if len(runs) > 1 else "",
                n,
                "" if n == 1 else "s",
                r["changes"],
                "" if r["changes"] == 1 else "s",
                " (every change)"
                if n >= r["changes"]
                else " (the peak and the end)"
                if len(runs) > 1
                else " (the peak, the end, failures and denials, and the highest point of each of "
                "equal slices of the run)",
            )
        )
    merged = (
        "; at %d moment%s the stacks beyond the %d largest are merged into one "
        '"%s" row per process and device (totals stay exact)'
        % (tables.aggregated, "" if tables.aggregated == 1 else "s", MAX_ROWS, OTHER)
        if tables.aggregated
        else ""
    )
    return (
        "%s; allocations grouped by stack, process and device (%d stacks, %d frames, "
        "%d sites)%s; stacks shown up to main, CUDA's own frames folded as in the report"
        % ("; ".join(parts), len(tables.stacks), len(tables.frames), len(tables.sites), merged)
    )


# ---- the page -----------------------------------------------------------------------------
