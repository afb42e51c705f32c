"""Allocations grouped into sites: by call site (the first frames of each stack outside the folded
libraries and allocator layers, stacks.py), by API, library, process or rank; each site's
bytes, count, sizes, processes, devices and the heaviest stack of the group. Every report
command groups through here, so report, diff and the summary of `cudatrace run` agree on
what a site is."""

from __future__ import annotations

import os
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...choices import GROUPINGS
from ..read.tags import device_label, rank_label_of
from ..read.trace import Trace
from ..replay.lives import API, RT, Alloc, Groups
from ..replay.model import Model
from .stacks import SFrame, Stacks

NO_STACK = "(no stack recorded: stacks off, --stack-depth 0)"


def kth_smallest(parts: Sequence[Sequence[int]], k: int, lo: int, hi: int) -> int:
    """The k-th smallest value (from 0) of the union of sorted sequences: a binary search on
    the value, counting with bisect in each part."""
    if len(parts) == 1:
        return parts[0][k]
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(bisect_right(p, mid) for p in parts) > k:
            hi = mid
        else:
            lo = mid + 1
    return lo


def key_text(key: tuple[Any, ...]) -> str:
    """A site key as one line of text (stable: names, not addresses)."""
    parts = []
    for k in key:
        if isinstance(k, tuple):
            if len(k) == 3:
                parts.append("{}:{}{}".format(k[0], k[1], (f" ({k[2]})") if k[2] else ""))
            elif len(k) == 2 and isinstance(k[1], int):
                parts.append("{}+0x{:x}".format(*k))
            else:
                parts.append(":".join(str(x) for x in k))
        else:
            parts.append(str(k))
    return " <- ".join(parts)


@dataclass
class Site:
    key: tuple[Any, ...]
    frames: list[SFrame]
    by: str = "site"
    name: str | None = None  # label for api / library / process groups
    bytes: int = 0
    count: int = 0
    apis: Counter[Any] = field(default_factory=Counter)
    size_parts: list[Any] = field(default_factory=list)  # sorted sequences of sizes
    pids: set[Any] = field(default_factory=set)
    traces: set[Any] = field(default_factory=set)
    devices: set[Any] = field(default_factory=set)
    # the physical devices those ordinals name (CUDA_VISIBLE_DEVICES's entries; read/tags.py)
    device_labels: set[Any] = field(default_factory=set)
    results: Counter[Any] = field(default_factory=Counter)  # CUresult -> count (failures)
    context: list[SFrame] = field(default_factory=list)  # the heaviest stack of the group
    via: list[SFrame] = field(default_factory=list)  # its frames folded into layers
    first_ts: int | None = None
    last_ts: int | None = None
    _best: tuple[Any, ...] = (0, -1, 0)

    def label(self, full: bool = False) -> str:
        if self.name is not None:
            return self.name
        if not self.frames:
            return NO_STACK
        return self.frames[0].label(full)

    def via_text(self, full: bool = False) -> str:
        """The folded layers, outermost first: `tensor_new > backend_get > device_take`."""
        return " > ".join(f.name(full) for f in reversed(self.via))

    def key_text(self) -> str:
        return key_text(self.key)

    @property
    def sizes(self) -> list[int]:
        """Every allocation's size (ascending within each part)."""
        out: list[int] = []
        for p in self.size_parts:
            out.extend(p)
        return out

    def size_summary(self) -> dict[Any, Any]:
        """min, median (the lower one for an even count) and max: exact, without merging the
        parts (a site of millions of allocations costs a few bisections)."""
        parts = [p for p in self.size_parts if len(p)]
        n = sum(len(p) for p in parts)
        if not n:
            return {}
        lo, hi = min(p[0] for p in parts), max(p[-1] for p in parts)
        return {"min": lo, "median": kth_smallest(parts, (n - 1) // 2, lo, hi), "max": hi}

    def api_list(self) -> list[str]:
        return [a for a, _ in self.apis.most_common()]


def site_of(
    stacks: Stacks, ti: int, leaf: int, depth: int = 1
) -> tuple[tuple[Any, ...], list[SFrame]]:
    """(key, frames) of the site a (trace, leaf) stack belongs to, as group(by="site") makes it."""
    fr = stacks.site_frames(ti, leaf)[: max(1, depth)] if leaf else []
    return tuple(f.key() for f in fr), fr


def api_label(model: Model, a: Alloc) -> str:
    t = model.traces[a.trace]
    name = t.api_name(a.event[API])
    rt = a.event[RT]
    if rt:
        name += f" ({t.api_name(rt)})"
    return name


def process_label(t: Trace) -> str:
    return "pid %d (%s)" % (t.pid, os.path.basename(t.exe) or "?")


def _rows(allocs: Groups | Iterable[Alloc]) -> list[tuple[Any, ...]]:
    """(trace, leaf, api, rt_api, device, count, bytes, first_ts, last_ts, sizes, results)"""
    if isinstance(allocs, Groups):
        return [r + (None,) for r in allocs.rows]
    return Groups.of(allocs, results=True).rows


def group(
    model: Model,
    allocs: Groups | Iterable[Alloc],
    stacks: Stacks,
    by: str = "site",
    depth: int = 1,
    context: int = 8,
) -> list[Site]:
    """Group allocations (a list of Alloc, or Groups from the model); sites sorted by bytes,
    largest first.

    by: "site" (the first `depth` frames outside CUDA's libraries), "api" (driver API and the
    runtime call it ran under), "library" (module of the first such frame), "process", "rank"
    (the process's rank and host, analyze/read/tags.py)."""
    if by not in GROUPINGS:
        raise ValueError(f"unknown grouping {by!r}")
    depth = max(1, depth)
    rows = _rows(allocs)
    if by in ("site", "library"):
        stacks.prepare({(r[0], r[1]) for r in rows if r[1]})
        stacks.learn_if_alone({(r[0], r[1]) for r in rows if r[1]})
    sites: dict[tuple[Any, ...], Site] = {}
    api_names: dict[tuple[Any, ...], str] = {}
    rank_labels = None
    dev_label = _device_labeler(model)
    for ti, leaf, api, rt, dev, count, nbytes, first, last, sizes, results in rows:
        t = model.traces[ti]
        name: str | None = None
        key: tuple[Any, ...]
        fr: list[SFrame] = []
        if by == "site":
            fr = stacks.site_frames(ti, leaf)[:depth] if leaf else []
            key = tuple(f.key() for f in fr)
        elif by == "api":
            key = (_api_text(t, api, rt, api_names),)
            name = key[0]
        elif by == "library":
            full = stacks.site_frames(ti, leaf) if leaf else []
            fr = full[:1]
            key = (os.path.basename(full[0].module) if full else "?",)
            name = key[0] if full else NO_STACK
        elif by == "rank":
            if rank_labels is None:
                rank_labels = rank_label_of(model.traces)
            key = (rank_labels[ti],)
            name = key[0]
        else:
            key = (ti,)
            name = process_label(t)
        s = sites.get(key)
        if s is None:
            s = sites[key] = Site(key, list(fr), by=by, name=name)
        s.bytes += nbytes
        s.count += count
        s.apis[_api_text(t, api, rt, api_names)] += count
        s.size_parts.append(sizes)
        s.pids.add(t.pid)
        s.traces.add(ti)
        s.devices.add(dev)
        s.device_labels.add(dev_label(ti, dev))
        if results:
            s.results.update(results)
        s.first_ts = first if s.first_ts is None else min(s.first_ts, first)
        s.last_ts = last if s.last_ts is None else max(s.last_ts, last)
        if leaf and (nbytes, count) > s._best[:2]:
            s._best = (nbytes, count, (ti, leaf))
    out = sorted(sites.values(), key=lambda s: (-s.bytes, -s.count, s.label()))
    for s in out:
        if s._best[1] > 0:
            ti, leaf = s._best[2]
            s.context = stacks.frames(ti, leaf)[: max(context, depth)]
            if by in ("site", "library"):
                s.via = stacks.split(ti, leaf)[0]
                s.context = (
                    s.context
                    if not s.via
                    else stacks.frames(ti, leaf)[: max(context, depth) + len(s.via)]
                )
    return out


def _device_labeler(model: Model) -> Callable[[int, int], str]:
    """(trace, ordinal) -> the physical device it names (tags.device_label), memoized."""
    memo: dict[tuple[int, int], str] = {}

    def label(ti: int, dev: int) -> str:
        v = memo.get((ti, dev))
        if v is None:
            v = memo[ti, dev] = device_label(model.traces[ti], dev)
        return v

    return label


def _api_text(t: Trace, api: int, rt: int, cache: dict[Any, Any]) -> str:
    k = (id(t), api, rt)
    s = cache.get(k)
    if s is None:
        s = t.api_name(api)
        if rt:
            s += f" ({t.api_name(rt)})"
        cache[k] = s
    return s


def depth_note(sites_at: Callable[[int], list[Any]], depth: int, n: int) -> list[str]:
    """The note of a --depth above 1 that splits no site (the n sites at `depth` are as many as
    at depth 1, so the report is --depth 1's): [] otherwise. sites_at(d): the sites at depth d."""
    if depth <= 1 or len(sites_at(1)) != n:
        return []
    return [
        f"--depth {depth}: no call site splits at this depth here (each is reached through one "
        "chain of callers), so the sites are those of --depth 1"
    ]
