"""The replay's rules written again in Python: the oracle the tests hold the C replay
(native/reader/replay.c, cudatrace.analyze.replay.model) to. The product never runs it.

    build_with(td, backend, timeline_buckets) -> Model     backend: "c" or "python"
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from cudatrace.analyze.read.rundir import TraceDir
from cudatrace.analyze.read.trace import C, Trace
from cudatrace.analyze.replay.backend import process_ends
from cudatrace.analyze.replay.lives import (
    ADDR,
    AUX,
    DEV,
    END_EXITED,
    END_FREE,
    END_LIVE,
    END_REUSED,
    END_UNMAPPED,
    KIND,
    NEVER_FREED,
    NONE64,
    OP,
    RES,
    SIZE,
    SPACE,
    STACK,
    TS,
    Alloc,
    Groups,
    device_kinds,
    host_kinds,
    kinds_mask,
)
from cudatrace.analyze.replay.model import TIMELINE_BUCKETS, Model, build, from_replay

BACKENDS = ("c", "python")


def build_with(
    td: TraceDir | list[Trace], backend: str = "c", timeline_buckets: int = TIMELINE_BUCKETS
) -> Model:
    """The Model of td through the C replay (the product's) or this Python oracle."""
    if backend == "c":
        return build(td, timeline_buckets)
    if backend != "python":
        raise ValueError(f"unknown replay backend {backend!r}")
    traces = td.traces if isinstance(td, TraceDir) else list(td)
    return from_replay(traces, PyReplay(traces, timeline_buckets))


_ST_DEV, _ST_HOST, _ST_MAP = 1, 2, 3
_MAP_SPACE = 255


class PyReplay:
    name = "python"

    def __init__(self, traces: list[Trace], buckets: int):
        K = C()
        ALLOC, FREE, MAP, UNMAP = (
            K["CT_OP_ALLOC"],
            K["CT_OP_FREE"],
            K["CT_OP_MAP"],
            K["CT_OP_UNMAP"],
        )
        DENY, MEMINFO, IMPORT, UNIMPORT = (
            K["CT_OP_DENY"],
            K["CT_OP_MEMINFO"],
            K["CT_OP_IMPORT"],
            K["CT_OP_UNIMPORT"],
        )
        VMM = K["CT_SPACE_VMM"]
        dmask, hmask = kinds_mask(device_kinds()), kinds_mask(host_kinds())
        self.traces = traces
        self.buckets = buckets
        counts = dict.fromkeys(
            (
                "events",
                "allocs",
                "frees",
                "failed",
                "failed_frees",
                "denied",
                "host_allocs",
                "host_frees",
                "unmatched_frees",
                "null_frees",
                "reused",
                "maps",
                "unmaps",
                "unmatched_unmaps",
                "deferred_releases",
                "imports",
                "unimports",
                "meminfo",
                "other",
                "unsorted_traces",
            ),
            0,
        )
        procs = [
            dict.fromkeys(
                (
                    "events",
                    "allocs",
                    "frees",
                    "failed",
                    "denied",
                    "meminfo",
                    "host_allocs",
                    "peak_bytes",
                    "peak_ts",
                    "end_bytes",
                    "first_ts",
                    "last_ts",
                ),
                0,
            )
            for _ in traces
        ]
        streams = []
        t0, t1 = None, 0
        ends = process_ends(traces)
        for i, t in enumerate(traces):
            evs = t.events
            if not evs:
                continue
            order: Sequence[int] = range(len(evs))
            if any(evs[k][TS] > evs[k + 1][TS] for k in range(len(evs) - 1)):
                counts["unsorted_traces"] += 1
                order = sorted(order, key=lambda k: evs[k][TS])
            first, last = evs[order[0]][TS], evs[order[-1]][TS]
            t0 = first if t0 is None else min(t0, first)
            t1 = max(t1, last)
            stream = [(evs[k][TS], 1, i, k) for k in order]
            if ends[i]:  # the process's end: before any event of the same time
                stream.append((max(ends[i], last), 0, i, -1))
            streams.append(stream)
        t0 = t0 or 0
        span = t1 - t0
        self.lives: list[list] = []  # [trace, idx, seq, end_seq, end_ts, how]
        self.lists: dict[str, list[Any]] = {"failed": [], "denied": [], "meminfo": []}
        devices: dict[int, dict] = {}
        dev_cur: dict[int, int] = {}
        proc_cur = [0] * len(traces)
        tl_all: dict[int, list] = {}
        tl_dev: dict[int, dict[int, list]] = {}
        tab: dict[tuple, list] = {}  # key -> [state, val, maps, released]
        st = {"cur": 0, "host": 0, "exited": 0, "host_exited": 0}
        dev_exited: dict[int, int] = {}
        s = {
            "peak_bytes": 0,
            "peak_ts": 0,
            "peak_seq": 0,
            "found": 0,
            "host_peak": 0,
            "host_peak_ts": 0,
        }

        def slot_dev(d: int) -> int:
            return max(-1, min(d, 62))

        def note(b: dict[int, list[int]], i: int, v: int, ts: int) -> None:
            cell = b.get(i)
            if cell is None:
                b[i] = [1, v, ts, v, ts, v, ts]
                return
            if v < cell[1]:
                cell[1], cell[2] = v, ts
            if v > cell[3]:
                cell[3], cell[4] = v, ts
            cell[5], cell[6] = v, ts
            cell[0] += 1

        def changed(dslot: int, ts: int) -> None:
            if not buckets:
                return
            i = int((ts - t0) / span * buckets) if span else 0
            if i >= buckets:
                i = buckets - 1
            note(tl_all, i, st["cur"], ts)
            note(tl_dev.setdefault(dslot, {}), i, dev_cur[dslot], ts)

        def end_life(li: int, seq: int, ts: int, how: int) -> None:
            L = self.lives[li]
            e = traces[L[0]].events[L[1]]
            ds = slot_dev(e[DEV])
            L[3], L[4], L[5] = seq, ts, how
            st["cur"] -= e[SIZE]
            dev_cur[ds] -= e[SIZE]
            proc_cur[L[0]] -= e[SIZE]
            changed(ds, ts)

        def unmapped(ti: int, hv: int, seq: int, ts: int) -> None:
            h = tab.get((ti, VMM, hv))
            if h and h[0] == _ST_DEV and h[2]:
                h[2] -= 1
                if h[2] == 0 and h[3]:
                    end_life(h[1], seq, ts, END_UNMAPPED)
                    del tab[(ti, VMM, hv)]

        def process_end(ti: int, seq: int, ts: int) -> None:
            procs[ti]["end_bytes"] = proc_cur[ti]
            mine = [k for k in tab if k[0] == ti]  # device ones in allocation order, as C
            mine.sort(key=lambda k: tab[k][1] if tab[k][0] == _ST_DEV else NONE64)
            for key in mine:
                v = tab.pop(key)
                if v[0] == _ST_DEV:
                    size = traces[ti].events[self.lives[v[1]][1]][SIZE]
                    ds = slot_dev(traces[ti].events[self.lives[v[1]][1]][DEV])
                    st["exited"] += size
                    dev_exited[ds] = dev_exited.get(ds, 0) + size
                    end_life(v[1], seq, ts, END_EXITED)
                elif v[0] == _ST_HOST and key[1] != "import":
                    st["host"] -= v[1]
                    st["host_exited"] += v[1]

        seq = 0
        for ts, is_event, ti, idx in heapq.merge(*streams):
            if not is_event:
                process_end(ti, seq, ts)
                continue
            e = traces[ti].events[idx]
            p = procs[ti]
            p["events"] += 1
            if not p["first_ts"] or ts < p["first_ts"]:
                p["first_ts"] = ts
            if ts > p["last_ts"]:
                p["last_ts"] = ts
            op = e[OP]
            ref = [ti, idx, seq, NONE64, NONE64, END_LIVE]
            if op == ALLOC:
                if e[RES] != 0:
                    counts["failed"] += 1
                    p["failed"] += 1
                    self.lists["failed"].append(ref)
                else:
                    kind = min(e[KIND], 63)
                    is_dev, is_host = (dmask >> kind) & 1, (hmask >> kind) & 1
                    if not is_dev and not is_host:
                        counts["other"] += 1
                    else:
                        key = (ti, e[SPACE], e[ADDR])
                        old = tab.get(key)
                        if old is not None:
                            counts["reused"] += 1
                            if old[0] == _ST_DEV:
                                end_life(old[1], seq, ts, END_REUSED)
                            elif old[0] == _ST_HOST:
                                st["host"] -= old[1]
                            del tab[key]
                        if is_dev:
                            tab[key] = [_ST_DEV, len(self.lives), 0, 0]
                            self.lives.append(ref)
                            ds = slot_dev(e[DEV])
                            d = devices.setdefault(
                                ds,
                                {
                                    "allocs": 0,
                                    "peak_bytes": 0,
                                    "peak_ts": 0,
                                    "peak_seq": 0,
                                    "end_bytes": 0,
                                },
                            )
                            counts["allocs"] += 1
                            p["allocs"] += 1
                            d["allocs"] += 1
                            st["cur"] += e[SIZE]
                            dev_cur[ds] = dev_cur.get(ds, 0) + e[SIZE]
                            proc_cur[ti] += e[SIZE]
                            if st["cur"] > s["peak_bytes"] or not s["found"]:
                                s.update(peak_bytes=st["cur"], peak_ts=ts, peak_seq=seq, found=1)
                            if dev_cur[ds] > d["peak_bytes"] or d["allocs"] == 1:
                                d.update(peak_bytes=dev_cur[ds], peak_ts=ts, peak_seq=seq)
                            if proc_cur[ti] > p["peak_bytes"]:
                                p["peak_bytes"], p["peak_ts"] = proc_cur[ti], ts
                            changed(ds, ts)
                        else:
                            tab[key] = [_ST_HOST, e[SIZE], 0, 0]
                            counts["host_allocs"] += 1
                            p["host_allocs"] += 1
                            st["host"] += e[SIZE]
                            if st["host"] > s["host_peak"]:
                                s["host_peak"], s["host_peak_ts"] = st["host"], ts
            elif op == FREE:
                if e[RES] != 0:
                    counts["failed_frees"] += 1
                elif e[ADDR] == 0:
                    counts["null_frees"] += 1
                else:
                    key = (ti, e[SPACE], e[ADDR])
                    sl = tab.get(key)
                    if sl is None and e[SPACE] == VMM and (ti, "import", e[ADDR]) in tab:
                        del tab[(ti, "import", e[ADDR])]  # an imported handle released
                        counts["unimports"] += 1
                    elif sl is None or sl[0] == _ST_MAP:
                        counts["unmatched_frees"] += 1
                    elif sl[0] == _ST_HOST:
                        st["host"] -= sl[1]
                        counts["host_frees"] += 1
                        del tab[key]
                    else:
                        counts["frees"] += 1
                        p["frees"] += 1
                        if e[SPACE] == VMM and sl[2] > 0:
                            sl[3] = 1
                            counts["deferred_releases"] += 1
                        else:
                            end_life(sl[1], seq, ts, END_FREE)
                            del tab[key]
            elif op == MAP:
                if e[RES] != 0:
                    counts["other"] += 1
                else:
                    counts["maps"] += 1
                    mk = (ti, _MAP_SPACE, e[ADDR])
                    m = tab.pop(mk, None)
                    if m is not None:
                        unmapped(ti, m[1], seq, ts)
                    tab[mk] = [_ST_MAP, e[AUX], e[SIZE], 0]  # maps field: bytes mapped
                    h = tab.get((ti, VMM, e[AUX]))
                    if h and h[0] == _ST_DEV:
                        h[2] += 1
            elif op == UNMAP:
                if e[RES] != 0:
                    counts["other"] += 1
                else:
                    counts["unmaps"] += 1
                    m = tab.get((ti, _MAP_SPACE, e[ADDR]))
                    if m is not None and m[2] >= e[SIZE]:
                        del tab[(ti, _MAP_SPACE, e[ADDR])]
                        unmapped(ti, m[1], seq, ts)
                    else:
                        lo, n = e[ADDR], e[SIZE]
                        found = [
                            k
                            for k, v in tab.items()
                            if v[0] == _ST_MAP
                            and k[0] == ti
                            and k[1] == _MAP_SPACE
                            and k[2] >= lo
                            and k[2] - lo < n
                        ]
                        if not found:
                            counts["unmatched_unmaps"] += 1
                        for k in sorted(found, key=lambda k: k[2]):  # address order, as C
                            m = tab.pop(k)
                            unmapped(ti, m[1], seq, ts)
            elif op == DENY:
                counts["denied"] += 1
                p["denied"] += 1
                self.lists["denied"].append(ref)
            elif op == MEMINFO:
                counts["meminfo"] += 1
                p["meminfo"] += 1
                self.lists["meminfo"].append(ref)
            elif op == IMPORT:
                counts["imports"] += 1
                if e[RES] == 0 and e[ADDR] and e[SPACE] == VMM:
                    tab[(ti, "import", e[ADDR])] = [_ST_HOST, 0]
            elif op == UNIMPORT:
                counts["unimports"] += 1
            else:
                counts["other"] += 1
            seq += 1
        counts["events"] = seq
        for i, p in enumerate(procs):
            if not ends[i] or not traces[i].events:
                p["end_bytes"] = proc_cur[i]
        self.counts = counts
        self.summary = {
            "t0": t0,
            "t_end": t1,
            "peak_bytes": s["peak_bytes"],
            "peak_ts": s["peak_ts"],
            "peak_seq": s["peak_seq"],
            "end_bytes": st["cur"] + st["exited"],
            "host_peak": s["host_peak"],
            "host_peak_ts": s["host_peak_ts"],
            "host_end": st["host"] + st["host_exited"],
            "lives": len(self.lives),
            "ntraces": len(traces),
            "found": s["found"],
        }
        self.devices = {}
        for ds, d in devices.items():
            d["end_bytes"] = dev_cur.get(ds, 0) + dev_exited.get(ds, 0)
            self.devices[ds] = d
        self.procs = procs
        self._tl_all = tl_all
        self._tl_dev = tl_dev

    def _alloc(self, L: list[int]) -> Alloc:
        e = self.traces[L[0]].events[L[1]]
        return Alloc(
            L[0], e, e[SIZE], e[TS], e[DEV], L[1], L[2], None if L[4] == NONE64 else L[4], L[5]
        )

    def _live(self, L: list[int], by_ts: bool | int, v: int) -> bool:
        if by_ts == NEVER_FREED:
            return L[5] in (END_LIVE, END_EXITED)
        if by_ts:
            return self.traces[L[0]].events[L[1]][TS] <= v < L[4]
        return L[2] <= v < L[3]

    def select(self, by_ts: bool, value: int, device: int | None = None) -> list[Alloc]:
        return [
            self._alloc(L)
            for L in self.lives
            if self._live(L, by_ts, value)
            and (device is None or self.traces[L[0]].events[L[1]][DEV] == device)
        ]

    def groups(self, by_ts: bool, value: int, device: int | None = None) -> Groups:
        return Groups.of(self.select(by_ts, value, device))

    def live_bytes(self, by_ts: bool, value: int, device: int | None = None) -> tuple[int, int]:
        sel = self.select(by_ts, value, device)
        return sum(a.size for a in sel), len(sel)

    def all(self) -> list[Alloc]:
        return [self._alloc(L) for L in self.lives]

    def bytes_at(self, times: list[int], device: int | None = None) -> list[int]:
        return [self.live_bytes(True, t, device)[0] for t in times]

    def bytes_max(self, lo: list[int], hi: list[int], device: int | None = None) -> list[int]:
        # every moment where the bytes can change: the window's start and each event inside
        moments = sorted(
            {self.traces[L[0]].events[L[1]][TS] for L in self.lives}
            | {L[4] for L in self.lives if L[4] != NONE64}
        )
        return [
            max(
                self.live_bytes(True, t, device)[0]
                for t in [a] + [m for m in moments if a < m <= b]
            )
            for a, b in zip(lo, hi)
        ]

    def listed(self, which: str) -> list[Alloc]:
        return [self._alloc(L) for L in self.lists[which]]

    def stack_totals(self) -> dict[tuple[int, int], tuple[int, int]]:
        out: dict[tuple[int, int], tuple[int, int]] = {}
        for L in self.lives:
            e = self.traces[L[0]].events[L[1]]
            k = (L[0], e[STACK])
            c, b = out.get(k, (0, 0))
            out[k] = (c + 1, b + e[SIZE])
        return out

    def timeline(self, device: int | None = None) -> list[tuple[int, ...]]:
        b = self._tl_all if device is None else self._tl_dev.get(max(-1, min(device, 62)), {})
        return [tuple(b[i]) for i in sorted(b)]
