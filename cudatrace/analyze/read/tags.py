"""Each process's host and rank, from what the shim recorded when its trace opened (the
launchers' variables, INFO "env.NAME"), and the physical device an ordinal names in it
(CUDA_VISIBLE_DEVICES): what ranks, sites and the live figures group by (docs/ranks.md)."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .trace import Trace, host_of

# (rank, local rank, world size) of each launcher, the innermost first: torchrun's workers under
# srun see RANK (theirs) and SLURM_PROCID (the srun task that started torchrun)
RANK_VARS = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", None, "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
)


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None and v.strip() else None
    except ValueError:
        return None


@dataclass
class Tag:
    host: str
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    source: str | None = None  # the variable the rank came from


def tag_of(t: Trace) -> Tag:
    """A process's host and rank, from the variables its shim recorded."""
    env = {k[4:]: v for k, v in t.info.items() if k.startswith("env.")}
    for rk, lk, wk in RANK_VARS:
        r = _int(env.get(rk))
        if r is not None:
            return Tag(host_of(t), r, _int(env.get(lk)) if lk else None, _int(env.get(wk)), rk)
    return Tag(host_of(t))


def hosts_of(traces: list[Trace]) -> set[str]:
    """The hosts of the processes that used CUDA or carry a rank (a launcher's shell that did
    neither may run elsewhere, or under another host name)."""
    return {host_of(t) for t in traces if t.n_events or tag_of(t).rank is not None}


def tagged(traces: list[Trace]) -> bool:
    """Whether the report has a ranks section: a rank variable, or more than one host or
    trace directory."""
    return (
        any(tag_of(t).rank is not None for t in traces)
        or len(hosts_of(traces)) > 1
        or len({t.source for t in traces}) > 1
    )


def device_label(t: Trace, device: int) -> str:
    """The physical device an ordinal names in a process: CUDA_VISIBLE_DEVICES's entry for it
    when set (an index or a UUID), else the ordinal; '?' when unknown."""
    if device < 0:
        return "?"
    cvd = t.info.get("env.CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        vis = [x.strip() for x in cvd.split(",") if x.strip()]
        if device < len(vis):
            return vis[device]
    return str(device)


@dataclass
class RankGroup:
    """One rank: the processes that carry its number (children inherit it), or, untagged, one
    process."""

    key: tuple[Any, ...]
    label: str
    host: str
    rank: int | None
    local_rank: int | None
    world_size: int | None
    traces: list[int] = field(default_factory=list)


def rank_groups(traces: list[Trace]) -> list[RankGroup]:
    """The run's ranks, by rank number, untagged processes one each; in rank order. When one
    number is carried in two places (separate launches read as one run), each place's rank is
    its own: `HOST rank N` when the places are different hosts, else `DIR rank N` (the trace
    directory's name)."""
    tags = [tag_of(t) for t in traces]
    places: dict[int, set[Any]] = defaultdict(set)  # rank -> {(host, trace directory)}
    for t, tg in zip(traces, tags):
        if tg.rank is not None:
            places[tg.rank].add((tg.host, t.source))
    clash = any(len(p) > 1 for p in places.values())
    by_host = all(len({h for h, _ in p}) == len(p) for p in places.values())
    groups: dict[tuple[Any, ...], RankGroup] = {}
    for i, (t, tg) in enumerate(zip(traces, tags)):
        if tg.rank is None and not t.n_events:
            continue  # a launcher's shell: no rank, no CUDA
        if tg.rank is None:
            key: tuple[Any, ...] = (1, tg.host, t.pid, i)
            label = "%s pid %d" % (tg.host, t.pid)
        elif not clash:
            key = (0, "", tg.rank)
            label = "rank %d" % tg.rank
        else:
            where = tg.host if by_host else (os.path.basename(t.source) or tg.host)
            key = (0, where, tg.rank)
            label = "%s rank %d" % (where, tg.rank)
        g = groups.get(key)
        if g is None:
            g = groups[key] = RankGroup(key, label, tg.host, tg.rank, tg.local_rank, tg.world_size)
        g.traces.append(i)
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3:]))]


def rank_label_of(traces: list[Trace]) -> list[str]:
    """trace index -> its rank's label (what --by rank groups by)."""
    out = ["%s pid %d" % (host_of(t), t.pid) for t in traces]
    for g in rank_groups(traces):
        for i in g.traces:
            out[i] = g.label
    return out
