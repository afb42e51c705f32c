"""PyTorch's memory snapshot pickle, for pytorch.org/memory_viz and torch.cuda._memory_viz.

The snapshot is taken at the moment (--at): `segments` hold what is live then and
`device_traces` (one list per device index) every allocation and free up to it, in time order,
so the viewer's timeline ends at the moment (`--at end` shows the whole run). PyTorch's
caching allocator carves blocks out of segments; a driver allocation is both, so each traced
allocation is one segment holding one active block of its size:

    allocation: segment_alloc, then alloc               (same address and size)
    free:       free_requested, free_completed, then segment_free
    denial:     oom (size requested; device_free = the budget's room left then)

Frames are `report`'s, innermost first, as {filename, line, name} (the module's path where no
source file is known); with several processes the outermost frame names the process.
Addresses are the program's own. Processes have address spaces of their own, so two of them
can hold the same address on one device; the viewer keys blocks by address, so when that
happens each further process's addresses are moved up by its rank << 48 (said in the
snapshot's `cudatrace` entry). Failed driver allocations are not in the pickle (the format
has no event for them); `report` lists them.

Written with pickle protocol 4, which the viewer's unpickler requires; plain dicts, lists,
strings and ints only, so it unpickles without torch.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from ... import __version__
from ...analyze.replay.lives import ADDR, AUX, AUX2, Alloc
from ...analyze.sites.group import NO_STACK

if TYPE_CHECKING:
    from .view import View

PROTOCOL = 4
SHIFT = 48


class VizFrame(TypedDict):
    """A frame as PyTorch's memory viewer reads it."""

    filename: str
    line: int
    name: str


K = TypeVar("K", bound=Hashable)  # how allocations are told apart by device
# an entry of a device's trace, sorted by its key: (sort key, device slot, [entries])
Event = tuple[tuple[int, ...], int, list[dict[str, Any]]]
# an allocation live at the moment: (it, its address in the viewer, its frames)
Live = tuple[Alloc, int, list[VizFrame]]


def build(view: View) -> dict[str, Any]:
    m = view.model
    live_ids = {(x.trace, x.index) for x in view.live_allocations()}
    allocs = sorted((x for x in m.lifetimes() if view.included(x)), key=lambda x: x.seq)
    denied = [x for x in m.denied if view.included(x)]
    view.prepare({(x.trace, x.stack) for x in allocs + denied})

    if view.split_devices:  # one list per (host, device): docs/ranks.md
        keys = sorted({view.device_key(x) for x in allocs + denied})
        slot = {k: i for i, k in enumerate(keys)}
    else:
        devs = sorted({x.device for x in allocs + denied})
        known = [d for d in devs if d >= 0]
        unknown_slot = (max(known) + 1) if known else 0
        slot = {d: (d if d >= 0 else unknown_slot) for d in devs}
    n_slots = max(slot.values()) + 1 if slot else 0

    shift = _shifts(allocs, slot, view.device_key)
    frames = _Frames(view)

    def slot_of(x: Alloc) -> int:  # the viewer's device list of an allocation
        return slot[view.device_key(x)]

    events, remaining = _alloc_events(allocs, live_ids, slot_of, shift, frames)
    events += _oom_events(denied, slot_of, frames)
    events.sort(key=lambda e: e[0])
    device_traces: list[list[dict[str, Any]]] = [[] for _ in range(n_slots)]
    for _k, s, entries in events:
        device_traces[s].extend(entries)
    return {
        "segments": _segments(remaining, slot_of),
        "device_traces": device_traces,
        "cudatrace": {
            "version": __version__,
            "command": view.command(),
            "moment": view.moment_text(),
            "moment_ns": view.moment_ts,
            "devices": {str(s): d for d, s in slot.items()},
            "address_shift": {"%d:%d" % k: v for k, v in shift.items()},
            "pids": {str(i): t.pid for i, t in enumerate(view.traces)},
            "exe": {str(i): os.path.basename(t.exe) for i, t in enumerate(view.traces)},
        },
    }


class _Frames:
    """The frames of a (trace, leaf) stack as PyTorch's viewer reads them, made once each."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.cache: dict[tuple[int, int], list[VizFrame]] = {}

    def __call__(self, ti: int, leaf: int) -> list[VizFrame]:
        k = (ti, leaf)
        got = self.cache.get(k)
        if got is None:
            view = self.view
            fr = view.frames(ti, leaf)
            got = [
                {
                    "filename": f.file or f.module,
                    "line": int(f.line or 0),
                    "name": f.function or f.label(),
                }
                for f in fr
            ]
            if not fr:
                got.append({"filename": "??", "line": 0, "name": NO_STACK})
            if view.multi_process:
                t = view.traces[ti]
                got.append({"filename": t.exe or "??", "line": 0, "name": view.process(ti)})
            self.cache[k] = got
        return got


def _alloc_events(
    allocs: list[Alloc],
    live_ids: set[tuple[int, int]],
    slot_of: Callable[[Alloc], int],
    shift: Mapping[tuple[int, int], int],
    frames: _Frames,
) -> tuple[list[Event], list[Live]]:
    """(events, remaining): each allocation's alloc and, unless live at the moment, free
    entries as (sort key, slot, [entries]); the allocations live at the moment."""
    events: list[Event] = []
    remaining: list[Live] = []
    for x in allocs:
        addr = _addr(x) + shift.get((slot_of(x), x.trace), 0)
        fr = frames(x.trace, x.stack)
        base = {"addr": addr, "size": x.size, "stream": 0, "frames": fr}
        events.append(
            (
                (x.ts, 1, x.seq),
                slot_of(x),
                [
                    dict(base, action="segment_alloc", time_us=x.ts // 1000),
                    dict(base, action="alloc", time_us=x.ts // 1000),
                ],
            )
        )
        if (x.trace, x.index) in live_ids or x.end_ts is None:
            remaining.append((x, addr, fr))
            continue
        order = 2 if x.end_ts == x.ts else 0  # a free sorts before allocations at its time
        tu = x.end_ts // 1000
        events.append(
            (
                (x.end_ts, order, x.seq),
                slot_of(x),
                [
                    dict(base, action="free_requested", time_us=tu),
                    dict(base, action="free_completed", time_us=tu),
                    dict(base, action="segment_free", time_us=tu),
                ],
            )
        )
    return events, remaining


def _oom_events(
    denied: list[Alloc], slot_of: Callable[[Alloc], int], frames: _Frames
) -> list[Event]:
    """A budget denial as the viewer's out-of-memory entry (free = limit - in use)."""
    events: list[Event] = []
    for x in denied:
        limit, in_use = x.event[AUX], x.event[AUX2]
        events.append(
            (
                (x.ts, 1, x.seq),
                slot_of(x),
                [
                    {
                        "action": "oom",
                        "addr": 0,
                        "size": x.size,
                        "stream": 0,
                        "frames": frames(x.trace, x.stack),
                        "device_free": max(0, limit - in_use),
                        "time_us": x.ts // 1000,
                    }
                ],
            )
        )
    return events


def _segments(remaining: list[Live], slot_of: Callable[[Alloc], int]) -> list[dict[str, Any]]:
    """The snapshot's segments: one per allocation live at the moment, one block each."""
    segments = []
    for x, addr, fr in sorted(remaining, key=lambda r: (slot_of(r[0]), r[1])):
        block = {
            "address": addr,
            "size": x.size,
            "requested_size": x.size,
            "state": "active_allocated",
            "frames": fr,
        }
        segments.append(
            {
                "device": slot_of(x),
                "address": addr,
                "total_size": x.size,
                "allocated_size": x.size,
                "active_size": x.size,
                "requested_size": x.size,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": fr,
                "blocks": [block],
            }
        )
    return segments


def _addr(x: Alloc) -> int:
    addr: int = x.event[ADDR]
    return addr


def _shifts(
    allocs: list[Alloc], slot: Mapping[K, int], key: Callable[[Alloc], K]
) -> dict[tuple[int, int], int]:
    """(device slot, trace) -> what to add to its addresses so that processes sharing a device
    never share an address range in the viewer (0 for the first process of each device and
    wherever no ranges overlap)."""
    spans: dict[int, dict[int, list[int]]] = {}
    for x in allocs:
        a = _addr(x)
        sp = spans.setdefault(slot[key(x)], {}).setdefault(x.trace, [a, a + x.size])
        sp[0] = min(sp[0], a)
        sp[1] = max(sp[1], a + x.size)
    out = {}
    for s, per in spans.items():
        order = sorted(per, key=lambda ti: per[ti][0])
        overlap = any(per[p][1] > per[q][0] for p, q in zip(order, order[1:]))
        if overlap:
            for rank, ti in enumerate(sorted(per)):
                if rank:
                    out[(s, ti)] = rank << SHIFT
    return out


def write(view: View, path: Path) -> dict[str, int]:
    snap = build(view)
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=PROTOCOL)
    return {
        "segments": len(snap["segments"]),
        "trace entries": sum(len(t) for t in snap["device_traces"]),
    }
