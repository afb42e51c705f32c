"""Replaying traces into live allocations over time: peaks, what is live at a moment, failures.

Counted as device memory: device, pitch, managed, stream-ordered, VMM physical (cuMemCreate),
arrays and graph memory. Pinned host memory is tracked apart (it is host DRAM, except on
unified-memory devices). Imports (IPC, external memory) map memory someone else paid for and
are never counted. A free matches the live allocation of the same process, address space and
address; a free that matches none (memory allocated before tracing, or by an unhooked path) is
counted as unmatched and changes nothing.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .trace import C, Trace, TraceDir, event_fields

_F = {name: i for i, name in enumerate(event_fields())}
TS, SIZE, ADDR, AUX, AUX2, TID, DEV, RES, STACK, API, RT, OP, KIND, SPACE, FLAGS = (
    _F[n] for n in ("ts_ns", "size", "addr", "aux", "aux2", "tid", "device", "result", "stack",
                    "api", "rt_api", "op", "kind", "space", "flags"))

KIND_NAMES = {"CT_KIND_DEVICE": "device", "CT_KIND_PITCH": "pitch", "CT_KIND_MANAGED": "managed",
              "CT_KIND_ASYNC": "async", "CT_KIND_HOST": "host", "CT_KIND_VMM": "vmm",
              "CT_KIND_ARRAY": "array", "CT_KIND_GRAPH": "graph", "CT_KIND_IMPORT": "import",
              "CT_KIND_NONE": "none"}


def kind_name(k: int) -> str:
    for n, v in C().items():
        if n.startswith("CT_KIND_") and v == k:
            return KIND_NAMES.get(n, n)
    return "kind%d" % k


@dataclass
class Alloc:
    trace: int            # index into Model.traces
    event: tuple
    size: int
    ts: int
    device: int

    @property
    def api(self) -> int:
        return self.event[API]

    @property
    def stack(self) -> int:
        return self.event[STACK]


@dataclass
class Model:
    traces: list[Trace]
    peak_bytes: int = 0
    peak_ts: int = 0
    peak_index: int = -1
    end_bytes: int = 0
    device_peaks: dict[int, tuple[int, int]] = field(default_factory=dict)  # dev -> (bytes, ts)
    host_peak: int = 0
    live_at_peak: list[Alloc] = field(default_factory=list)
    live_at_end: list[Alloc] = field(default_factory=list)
    failed: list[Alloc] = field(default_factory=list)
    denied: list[Alloc] = field(default_factory=list)
    meminfo: list[tuple[int, tuple]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    unmatched_frees: int = 0
    timeline: list[tuple[int, int]] = field(default_factory=list)   # (ts, live device bytes)
    t0: int = 0
    t_end: int = 0

    def at(self, ts: int) -> list[Alloc]:
        """Allocations live at monotonic time ts."""
        return _replay(self.traces, stop_ts=ts)[0]


def device_kinds() -> set[int]:
    K = C()
    return {K[n] for n in ("CT_KIND_DEVICE", "CT_KIND_PITCH", "CT_KIND_MANAGED", "CT_KIND_ASYNC",
                           "CT_KIND_VMM", "CT_KIND_ARRAY", "CT_KIND_GRAPH")}


def _merged(traces: list[Trace]):
    """(ts, trace index, event) for all traces, in time order."""
    streams = []
    for i, t in enumerate(traces):
        evs = t.events
        if any(evs[k][TS] > evs[k + 1][TS] for k in range(len(evs) - 1)):
            evs = sorted(evs, key=lambda e: e[TS])
        streams.append(((e[TS], i, e) for e in evs))
    return heapq.merge(*streams, key=lambda x: (x[0], x[1]))


def _replay(traces: list[Trace], stop_ts: int | None = None, stop_index: int | None = None):
    """Live device allocations after replaying up to stop_ts / stop_index (inclusive)."""
    K = C()
    ALLOC, FREE = K["CT_OP_ALLOC"], K["CT_OP_FREE"]
    dkinds = device_kinds()
    live: dict[tuple, Alloc] = {}
    n = -1
    for ts, ti, e in _merged(traces):
        if stop_ts is not None and ts > stop_ts:
            break
        n += 1
        if stop_index is not None and n > stop_index:
            break
        op = e[OP]
        if op == ALLOC and e[RES] == 0 and e[KIND] in dkinds:
            live[(ti, e[SPACE], e[ADDR])] = Alloc(ti, e, e[SIZE], ts, e[DEV])
        elif op == FREE and e[RES] == 0:
            live.pop((ti, e[SPACE], e[ADDR]), None)
    return list(live.values()), n


def build(td: TraceDir | list[Trace], timeline_points: int = 2000) -> Model:
    traces = td.traces if isinstance(td, TraceDir) else td
    K = C()
    ALLOC, FREE, DENY, MEMINFO = K["CT_OP_ALLOC"], K["CT_OP_FREE"], K["CT_OP_DENY"], K["CT_OP_MEMINFO"]
    HOST = K["CT_KIND_HOST"]
    dkinds = device_kinds()
    m = Model(traces=traces)
    live: dict[tuple, tuple[int, int]] = {}      # key -> (size, device)
    host_live: dict[tuple, int] = {}
    cur = host_cur = 0
    dev_cur: dict[int, int] = {}
    counts = {"allocs": 0, "frees": 0, "failed": 0, "denied": 0, "maps": 0, "meminfo": 0,
              "imports": 0, "host_allocs": 0}
    tl = []
    n = -1
    first = True
    for ts, ti, e in _merged(traces):
        n += 1
        if first:
            m.t0 = ts
            first = False
        m.t_end = ts
        op = e[OP]
        if op == ALLOC:
            if e[RES] != 0:
                counts["failed"] += 1
                m.failed.append(Alloc(ti, e, e[SIZE], ts, e[DEV]))
                continue
            kind = e[KIND]
            key = (ti, e[SPACE], e[ADDR])
            if kind in dkinds:
                counts["allocs"] += 1
                old = live.get(key)
                if old:                            # address reused without a traced free
                    cur -= old[0]
                    dev_cur[old[1]] -= old[0]
                live[key] = (e[SIZE], e[DEV])
                cur += e[SIZE]
                dev_cur[e[DEV]] = dev_cur.get(e[DEV], 0) + e[SIZE]
                db = dev_cur[e[DEV]]
                if db > m.device_peaks.get(e[DEV], (0, 0))[0]:
                    m.device_peaks[e[DEV]] = (db, ts)
                if cur > m.peak_bytes:
                    m.peak_bytes, m.peak_ts, m.peak_index = cur, ts, n
                tl.append((ts, cur))
            elif kind == HOST:
                counts["host_allocs"] += 1
                host_live[key] = e[SIZE]
                host_cur += e[SIZE]
                m.host_peak = max(m.host_peak, host_cur)
        elif op == FREE:
            if e[RES] != 0:
                continue
            counts["frees"] += 1
            key = (ti, e[SPACE], e[ADDR])
            old = live.pop(key, None)
            if old:
                cur -= old[0]
                dev_cur[old[1]] -= old[0]
                tl.append((ts, cur))
            elif key in host_live:
                host_cur -= host_live.pop(key)
            else:
                m.unmatched_frees += 1
        elif op == DENY:
            counts["denied"] += 1
            m.denied.append(Alloc(ti, e, e[SIZE], ts, e[DEV]))
        elif op == MEMINFO:
            counts["meminfo"] += 1
            m.meminfo.append((ti, e))
        elif op in (K["CT_OP_MAP"], K["CT_OP_UNMAP"]):
            counts["maps"] += 1
        elif op == K["CT_OP_IMPORT"]:
            counts["imports"] += 1
    m.end_bytes = cur
    m.counts = counts
    if m.peak_index >= 0:
        m.live_at_peak = _replay(traces, stop_index=m.peak_index)[0]
    m.live_at_end = _replay(traces)[0]
    if len(tl) > timeline_points:
        step = len(tl) / timeline_points
        pts = [tl[int(i * step)] for i in range(timeline_points)]
        # keep the peak itself in the picture
        pts.append((m.peak_ts, m.peak_bytes))
        pts.sort()
        tl = pts + [tl[-1]]
    m.timeline = tl
    return m
