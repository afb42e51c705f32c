"""Many ranks as one run (docs/ranks.md): each process's host and rank, from what the shim
recorded when its trace opened (the launchers' variables, INFO "env.NAME"); per-rank and
per-device peaks; sites merged across ranks; the outlier rule.

Honest figures: processes on different hosts never share a device, and ranks on one host often
see different GPUs as their device 0 (CUDA_VISIBLE_DEVICES). So a peak here is one rank's (the
sum of its own processes) or one physical device's (host and the GPU the ordinal names); no
figure adds up bytes of different devices and calls it a peak.
"""

from __future__ import annotations

import os
from array import array
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from .. import native
from .aggregate import apply_snapshots
from .model import END_EXITED, device_kinds
from .trace import C, Trace, TraceDir, host_of, layout

if TYPE_CHECKING:
    from .analysis import Analysis
    from .model import Alloc

T = TypeVar("T")

# (rank, local rank, world size) of each launcher, the innermost first: torchrun's workers under
# srun see RANK (theirs) and SLURM_PROCID (the srun task that started torchrun)
RANK_VARS = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", None, "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
)

# the outlier rule (docs/ranks.md): at least MIN_RANKS figures; one stands out when it is
# farther from their median than all of: MAD_FACTOR scaled median absolute deviations,
# REL_FLOOR of the median, and ABS_FLOOR bytes
MIN_RANKS = 3
MAD_FACTOR = 3.0
MAD_SCALE = 1.4826  # a normal distribution's standard deviation per MAD
REL_FLOOR = 0.10
ABS_FLOOR = 1 << 20
RULE = (
    "a rank stands out when its figure is farther from the median of all ranks than 3 scaled "
    "median absolute deviations (3 x 1.4826 x MAD), 10% of the median and 1 MiB, all three; "
    "at least 3 ranks are needed"
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


def peaks(
    allocs: Iterable[Alloc], key: Callable[[Alloc], Hashable | None]
) -> dict[Any, tuple[int, int | None]]:
    """key(alloc) -> (peak bytes, time of the peak) over allocation lifetimes; at one time frees
    count before allocations, so a peak is never higher than the replay's."""
    steps: dict[Any, Any] = defaultdict(list)
    for a in allocs:
        k = key(a)
        if k is None:
            continue
        steps[k].append((a.ts, 1, a.size))
        if a.end_ts is not None:
            steps[k].append((a.end_ts, 0, -a.size))
    out = {}
    for k, lst in steps.items():
        lst.sort()
        cur, best, when = 0, 0, None
        for ts, _, d in lst:
            cur += d
            if cur > best:
                best, when = cur, ts
        out[k] = (best, when)
    return out


def _median(vals: list[int]) -> float:
    v = sorted(vals)
    n = len(v)
    return float(v[n // 2]) if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def outliers(values: dict[Any, Any]) -> tuple[float | None, list[Any]]:
    """(median, keys whose value stands out) by the rule above; (None, []) under MIN_RANKS."""
    if len(values) < MIN_RANKS:
        return None, []
    med = _median(list(values.values()))
    mad = _median([abs(v - med) for v in values.values()])
    bound = max(MAD_FACTOR * MAD_SCALE * mad, REL_FLOOR * med, ABS_FLOOR)
    return med, [k for k, v in values.items() if abs(v - med) > bound]


def _cached(a: Analysis, key: Hashable, make: Callable[[], T]) -> T:
    """One computation per Analysis (report, HTML and diff ask for the same figures)."""
    cache = a.__dict__.setdefault("_ranks_cache", {})
    if key not in cache:
        cache[key] = make()
    return cast(T, cache[key])


def _rank_peaks(
    a: Analysis,
) -> tuple[list[RankGroup], dict[int, RankGroup], list[Alloc], dict[Any, tuple[int, int | None]]]:
    """(groups, trace -> group, lifetimes of the ranks' allocations, group key -> peak): the
    plain computation over every allocation (tables() takes a shorter way when it can)."""

    def make() -> tuple[
        list[RankGroup], dict[int, RankGroup], list[Alloc], dict[Any, tuple[int, int | None]]
    ]:
        groups = rank_groups(a.traces)
        of_trace = {i: g for g in groups for i in g.traces}
        lives = [x for x in a.model.lifetimes() if x.trace in of_trace]
        return groups, of_trace, lives, peaks(lives, lambda x: of_trace[x.trace].key)

    return _cached(a, "ranks", make)


def alloc_ordinals(t: Trace) -> set[int] | None:
    """The device ordinals a trace's successful device allocations used, read from the
    scanner's event array column by column; None when it has no such array (its events were
    made from an --aggregate snapshot)."""
    src = getattr(t, "source_blocks", None)
    if src is not None and t._raw is None and t._events is None:  # decoded, never held
        result: set[int] | None = src.alloc_devices(device_kinds())
        return result
    if t.raw_events is None or t._events is not None:
        return None
    n = t.n_events
    if not n:
        return set()
    es = layout("struct ct_event")[0]
    ffi = native.ffi()
    raw = memoryview(ffi.buffer(t.raw_events, es.size * n)).cast("B")

    def column(name: str, fmt: Literal["B", "i"]) -> list[Any]:
        off = ffi.offsetof("struct ct_event", name)
        width = ffi.sizeof(ffi.typeof("struct ct_event").fields[_field(name)][1].type)
        assert off % width == 0 and es.size % width == 0
        return raw.cast(fmt)[off // width :: es.size // width].tolist()

    alloc, kinds = C()["CT_OP_ALLOC"], device_kinds()
    return {
        d
        for op, kind, res, d in zip(
            column("op", "B"), column("kind", "B"), column("result", "i"), column("device", "i")
        )
        if op == alloc and res == 0 and kind in kinds
    }


def _field(name: str) -> int:
    return [f for f, _ in native.ffi().typeof("struct ct_event").fields].index(name)


def tables(a: Analysis, fast: bool = True) -> dict[Any, Any]:
    """What the ranks section is made of: groups, of_trace, rank_peaks (key -> (bytes, ts)),
    dev_peaks ((host, device) -> (bytes, ts)), dev_end, dev_allocs, dev_ranks (labels),
    rank_devs (key -> physical devices). When every process allocated on one device, a rank of
    one process has that process's peak and a device used by one process too (the replay's
    figures): no pass over every allocation. Otherwise, or for the ranks and devices that
    several processes share, the lifetimes are swept (peaks)."""
    return _cached(a, ("tables", fast), lambda: _tables(a, fast))


def _tables(a: Analysis, fast: bool) -> dict[Any, Any]:
    traces, m = a.traces, a.model
    groups = rank_groups(traces)
    of_trace = {i: g for g in groups for i in g.traces}
    procs = [m.procs[i] if i < len(m.procs) else {} for i in range(len(traces))]
    ords = [alloc_ordinals(t) if fast else None for t in traces]
    one = fast and all(o is not None and len(o) <= 1 for o in ords)
    out: dict[Any, Any] = {
        "groups": groups,
        "of_trace": of_trace,
        "dev_end": defaultdict(int),
        "dev_allocs": defaultdict(int),
        "dev_ranks": defaultdict(set),
        "rank_devs": defaultdict(set),
    }
    if not one:
        _, _, lives, rank_peaks = _rank_peaks(a)
        out["rank_peaks"], out["dev_peaks"] = rank_peaks, device_peaks(a)
        dkey = device_key(a)
        for x in lives:
            dk = dkey(x)
            out["dev_ranks"][dk].add(of_trace[x.trace].label)
            out["rank_devs"][of_trace[x.trace].key].add(dk[1])
            out["dev_allocs"][dk] += 1
            if x.end_ts is None or x.how == END_EXITED:  # never freed (model.py)
                out["dev_end"][dk] += x.size
        return out
    dk_of = {
        i: (host_of(traces[i]), device_label(traces[i], next(iter(o))))
        for i, o in enumerate(ords)
        if o
    }
    users: dict[Any, Any] = defaultdict(list)
    for i, dk in dk_of.items():
        users[dk].append(i)
        if i in of_trace:
            out["dev_ranks"][dk].add(of_trace[i].label)
            out["rank_devs"][of_trace[i].key].add(dk[1])
        out["dev_allocs"][dk] += procs[i].get("allocs", 0)
        out["dev_end"][dk] += procs[i].get("end_bytes", 0)

    def own(i: int) -> tuple[int, int | None]:
        pb = procs[i].get("peak_bytes", 0)
        return (pb, procs[i].get("peak_ts") if pb else None)

    shared_ranks = [g for g in groups if len([i for i in g.traces if i in dk_of]) > 1]
    shared_devs = {dk for dk, us in users.items() if len(us) > 1}
    lives = []
    if shared_ranks or shared_devs:
        keep = {i for g in shared_ranks for i in g.traces} | {
            i for dk in shared_devs for i in users[dk]
        }
        lives = [x for x in m.lifetimes() if x.trace in keep]
    rank_peaks = {}
    for g in groups:
        mine = [i for i in g.traces if i in dk_of]
        if len(mine) == 1:
            rank_peaks[g.key] = own(mine[0])
    in_shared = {i for g in shared_ranks for i in g.traces}
    rank_peaks.update(
        peaks([x for x in lives if x.trace in in_shared], lambda x: of_trace[x.trace].key)
    )
    dev_peaks = {dk: own(us[0]) for dk, us in users.items() if len(us) == 1}
    dev_peaks.update(
        peaks([x for x in lives if dk_of.get(x.trace) in shared_devs], lambda x: dk_of[x.trace])
    )
    out["rank_peaks"], out["dev_peaks"] = rank_peaks, dev_peaks
    return out


def rank_series(a: Analysis) -> list[tuple[RankGroup, list[tuple[int, int]]]]:
    """Each rank's live device bytes over time: (group, [(ts, bytes) after each change])."""
    groups, of_trace, lives, _ = _rank_peaks(a)
    steps: dict[Any, Any] = defaultdict(list)
    for x in lives:
        k = of_trace[x.trace].key
        steps[k].append((x.ts, 1, x.size))
        if x.end_ts is not None:
            steps[k].append((x.end_ts, 0, -x.size))
    out = []
    for g in groups:
        cur, pts = 0, []  # type: int, list[tuple[int, int]]
        for ts, _, d in sorted(steps.get(g.key, ())):
            cur += d
            if pts and pts[-1][0] == ts:
                pts[-1] = (ts, cur)
            else:
                pts.append((ts, cur))
        out.append((g, pts))
    return out


def device_key(a: Analysis) -> Callable[[Alloc], tuple[str, str]]:
    """alloc -> (host, physical device), memoized per (trace, ordinal)."""

    def make() -> Callable[[Alloc], tuple[str, str]]:
        memo: dict[tuple[int, int], tuple[str, str]] = {}
        traces = a.traces

        def key(x: Alloc) -> tuple[str, str]:
            k = (x.trace, x.device)
            v = memo.get(k)
            if v is None:
                t = traces[x.trace]
                v = memo[k] = (host_of(t), device_label(t, x.device))
            return v

        return key

    return _cached(a, "device_key", make)


def device_peaks(a: Analysis) -> dict[Any, tuple[int, int | None]]:
    """(host, physical device) -> (peak bytes, time): what each device held of the run."""
    return _cached(a, "devices", lambda: peaks(a.model.lifetimes(), device_key(a)))


def split_devices(a: Analysis) -> bool:
    """Whether a device ordinal names more than one device in this run: several hosts, or
    processes of one host whose CUDA_VISIBLE_DEVICES map the same ordinal to different GPUs.
    Then figures per ordinal (the model's) would add up different devices, and the report's
    peaks and devices are per physical device instead (honest_peak)."""
    if len(hosts_of(a.traces)) > 1:
        return True
    seen: dict[Any, Any] = {}
    ords = [alloc_ordinals(t) for t in a.traces]
    if all(o is not None for o in ords):
        pairs = {(i, d) for i, o in enumerate(ords) for d in o or ()}
    else:
        pairs = {(x.trace, x.device) for x in a.model.lifetimes()}
    for t_dev in pairs:
        t = a.traces[t_dev[0]]
        label = device_label(t, t_dev[1])
        if seen.setdefault((host_of(t), t_dev[1]), label) != label:
            return True
    return False


def ranks_diff(a: Analysis, b: Analysis) -> list[dict[Any, Any]] | None:
    """Two runs' ranks side by side, matched by label (rank 3 with rank 3): each one's peak in
    A and B. None when neither run has ranks."""
    if not (tagged(a.traces) or tagged(b.traces)):
        return None
    sides = []
    for an in (a, b):
        tb = tables(an)
        groups, rp = tb["groups"], tb["rank_peaks"]
        sides.append({g.label: (g, rp.get(g.key, (0, None))[0]) for g in groups})
    out = []
    for label in sorted(set(sides[0]) | set(sides[1]), key=_label_order):
        pa = sides[0][label][1] if label in sides[0] else None
        pb = sides[1][label][1] if label in sides[1] else None
        g = (sides[1].get(label) or sides[0][label])[0]
        out.append(
            {
                "label": label,
                "host": g.host,
                "a_peak_bytes": pa,
                "b_peak_bytes": pb,
                "delta_bytes": (pb or 0) - (pa or 0),
            }
        )
    return out


def ranks_json(a: Analysis, depth: int = 1, top: int = 10) -> dict[Any, Any] | None:
    """The report's `ranks` section (docs/report-json.md), None for a run without ranks."""
    traces = a.traces
    if not traces or not tagged(traces):
        return None
    m = a.model
    tb = tables(a)
    groups, rank_peaks, dev_peaks = tb["groups"], tb["rank_peaks"], tb["dev_peaks"]
    dev_ranks, rank_devs, dev_end, dev_allocs = (
        tb["dev_ranks"],
        tb["rank_devs"],
        tb["dev_end"],
        tb["dev_allocs"],
    )
    med, out_keys = outliers({g.key: rank_peaks.get(g.key, (0, None))[0] for g in groups})
    ranks = []
    for g in groups:
        pb, pts = rank_peaks.get(g.key, (0, None))
        procs = [m.procs[i] if i < len(m.procs) else {} for i in g.traces]
        ranks.append(
            {
                "label": g.label,
                "rank": g.rank,
                "host": g.host,
                "local_rank": g.local_rank,
                "world_size": g.world_size,
                "pids": sorted({traces[i].pid for i in g.traces}),
                "files": [traces[i].path.name for i in g.traces],
                "dirs": sorted({traces[i].source for i in g.traces if traces[i].source}),
                "devices": sorted(rank_devs.get(g.key, ())),
                "peak_bytes": pb,
                "peak_time": a.seconds(pts),
                "end_bytes": sum(p.get("end_bytes", 0) for p in procs),
                "allocs": sum(p.get("allocs", 0) for p in procs),
                "failed": sum(p.get("failed", 0) for p in procs),
                "denied": sum(p.get("denied", 0) for p in procs),
                "outlier": g.key in out_keys,
            }
        )
    devices = [
        {
            "host": h,
            "device": d,
            "peak_bytes": pb,
            "peak_time": a.seconds(pts),
            "peak_ts_ns": pts,
            "end_bytes": dev_end[(h, d)],
            "allocs": dev_allocs[(h, d)],
            "ranks": sorted(dev_ranks[(h, d)], key=_label_order),
        }
        for (h, d), (pb, pts) in sorted(dev_peaks.items())
    ]
    top_dev = max(devices, key=lambda d: d["peak_bytes"], default=None)
    hosts: dict[str, dict[Any, Any]] = {}
    for g in groups:
        for i in g.traces:
            t = traces[i]
            h = hosts.setdefault(
                host_of(t),
                {
                    "host": host_of(t),
                    "dirs": set(),
                    "ranks": [],
                    "processes": 0,
                    "clock_shift_ns": 0,
                },
            )
            h["processes"] += 1
            if t.source:
                h["dirs"].add(t.source)
            h["clock_shift_ns"] = t.clock_shift_ns
            if g.label not in h["ranks"]:
                h["ranks"].append(g.label)
    sites, more = merged_sites(a, groups, rank_peaks, depth, top)
    by_label = {g.key: g.label for g in groups}
    return {
        "split_devices": split_devices(a),
        "hosts": [dict(h, dirs=sorted(h["dirs"])) for h in hosts.values()],
        "sources": sorted({tag_of(t).source for t in traces if tag_of(t).source}),
        "ranks": ranks,
        "devices": devices,
        "peak": top_dev,
        "median_peak_bytes": med,
        "outliers": [
            {
                "label": by_label[k],
                "what": "peak",
                "bytes": rank_peaks.get(k, (0, None))[0],
                "median_bytes": med,
            }
            for k in out_keys
        ],
        "sites": sites,
        "more_sites": more,
        "rule": RULE,
        "missing": missing_ranks(traces),
    }


def missing_ranks(traces: list[Trace]) -> dict[str, Any] | None:
    """The ranks a run's world size promises that no trace carries: {"ranks": [numbers],
    "world_size": N, "variable": the world size's variable}. None when the processes name no
    world size, disagree on it, or one rank number is carried in separate places (separate
    launches, whose numbers repeat)."""
    tags = [tag_of(t) for t in traces]
    ranked = [(tg, t) for tg, t in zip(tags, traces) if tg.rank is not None]
    sizes = {tg.world_size for tg, _ in ranked}
    if not ranked or len(sizes) != 1 or None in sizes:
        return None
    places: dict[int, set[tuple[str, str]]] = defaultdict(set)
    for tg, t in ranked:
        places[tg.rank].add((tg.host, t.source))  # type: ignore[index]
    if any(len(p) > 1 for p in places.values()):
        return None
    world = sizes.pop()
    assert world is not None
    source = ranked[0][0].source
    var = next((wk for rk, _, wk in RANK_VARS if rk == source), None)
    gone = sorted(set(range(world)) - set(places))
    return {"ranks": gone, "world_size": world, "variable": var} if gone else None


def _label_order(label: str) -> tuple[str, int]:
    parts = label.rsplit(" ", 1)
    return (parts[0], int(parts[1])) if len(parts) == 2 and parts[1].isdigit() else (label, 0)


def merged_sites(
    a: Analysis,
    groups: list[RankGroup],
    rank_peaks: dict[Any, tuple[int, int | None]],
    depth: int,
    top: int,
) -> tuple[list[dict[Any, Any]], int]:
    """Sites across ranks, each rank at its own peak: per site the bytes each rank held then,
    how many ranks held it, and the ranks that stand out (the rule above, over every rank: a
    site only some ranks hold stands out on them when the others hold none)."""
    m = a.model
    per_site: dict[tuple[Any, ...], dict[Any, Any]] = {}
    for g in groups:
        pb, pts = rank_peaks.get(g.key, (0, None))
        if not pb or pts is None:
            continue
        live = m.groups_at(pts).only(traces=set(g.traces))
        for s in a.sites(live, "site", depth):
            e = per_site.setdefault(s.key, {"site": s, "bytes": {}, "count": 0})
            e["bytes"][g.label] = e["bytes"].get(g.label, 0) + s.bytes
            e["count"] += s.count
    rows = sorted(per_site.values(), key=lambda e: (-sum(e["bytes"].values()), e["site"].label()))
    out = []
    for e in rows[:top]:
        held = e["bytes"]
        vals = {g.label: held.get(g.label, 0) for g in groups}
        med, odd = outliers(vals)
        hv = sorted(held.values())
        s = e["site"]
        out.append(
            {
                "label": s.label(a.full_names),
                "key": s.key_text(),
                "ranks": len(held),
                "of_ranks": len(groups),
                "total_bytes": sum(hv),
                "median_bytes": _median(hv),
                "min_bytes": hv[0],
                "max_bytes": hv[-1],
                "count": e["count"],
                "per_rank": dict(sorted(held.items(), key=lambda kv: _label_order(kv[0]))),
                "outliers": [
                    {"label": k, "bytes": vals[k], "median_bytes": med}
                    for k in sorted(odd, key=_label_order)
                ],
            }
        )
    return out, max(0, len(rows) - top)


# ---- separate runs are not one run ---------------------------------------------------------


def separate_runs(td: TraceDir, folder: Path | None = None) -> str | None:
    """Why the trace directories read together are separate runs rather than the ranks of one
    (docs/ranks.md), or None: no process carries a rank variable, and two of them never ran at
    the same time (as their launchers' wall clocks, else their traces', say). Read as one run,
    they would make "one run of N ranks" with a peak and a budget none of them had."""
    if len(td.dirs) < 2 or any(tag_of(t).rank is not None for t in td.traces):
        return None
    runs = td.runs + [{}] * (len(td.dirs) - len(td.runs))
    spans = [
        _span(run, [t for t in td.traces if t.source == str(d)]) for d, run in zip(td.dirs, runs)
    ]
    known = [(a, b) for a, b in spans if a is not None and b is not None]
    if len(known) < 2 or max(a for a, _ in known) <= min(b for _, b in known):
        return None  # all ran at one time (intervals that meet pairwise share a moment)
    return _separate_message(td, runs, spans, folder)


def _span(run: dict[str, Any], traces: list[Trace]) -> tuple[float | None, float | None]:
    """(start, end) of one directory's run in wall-clock seconds: its launcher's (run.json),
    else its traces' (their starts, and their ends when every one left one)."""
    t0, t1 = run.get("start_time"), run.get("end_time")
    if isinstance(t0, (int, float)) and isinstance(t1, (int, float)):
        return float(t0), float(t1)
    starts = [t.start_realtime_ns for t in traces if t.start_realtime_ns]
    ends = []
    for t in traces:
        mono = t.end.ts_ns if t.end else t.exit_seen_ns
        if not mono or not t.start_realtime_ns:
            return (min(starts) / 1e9 if starts else None), None  # one still open: unknown
        ends.append(t.start_realtime_ns + mono - t.start_monotonic_ns)
    return (min(starts) / 1e9 if starts else None), (max(ends) / 1e9 if ends else None)


def _separate_message(
    td: TraceDir,
    runs: list[dict[str, Any]],
    spans: list[tuple[float | None, float | None]],
    folder: Path | None,
) -> str:
    """The refusal: each run with its command and when it ran, and how to read them."""
    import time

    from ..units import shell_quote

    names = [str(d) for d in td.dirs]
    width = min(40, max(len(n) for n in names))
    where = f"{folder} holds {len(names)}" if folder else f"these {len(names)}"
    lines = [
        f"{where} trace directories of separate runs, not the ranks of one run: no "
        "process carries a rank variable (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK ...) and they "
        "did not all run at the same time (docs/ranks.md):"
    ]
    for name, d, run, (a, b) in zip(names, td.dirs, runs, spans):
        argv = run.get("argv") or next((t.argv for t in td.traces if t.source == str(d)), [])
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a)) if a is not None else "?"
        took = f", {b - a:.1f} s" if a is not None and b is not None else ""
        cmd = shell_quote(argv)
        lines.append(
            f"  {name:<{width}}  {when}{took}  {cmd[:60] + ('...' if len(cmd) > 60 else '')}"
        )
    q = shell_quote
    lines += [
        f"  one run:            cudatrace report {q([names[0]])}",
        f"  two runs compared:  cudatrace diff {q([names[0], names[1]])}",
        "  a sweep's runs:     cudatrace sweep --from DIR (the folder `cudatrace sweep` wrote)",
    ]
    return "\n".join(lines)


def honest_peak(r: dict[Any, Any]) -> None:
    """A run whose ordinals name several devices (split_devices): the report's peak is the
    highest one device saw (ranks.peak), and its devices are the hosts' physical devices, never
    one ordinal summed over hosts or over CUDA_VISIBLE_DEVICES."""
    rk = r.get("ranks")
    if not rk or not rk["split_devices"]:
        return
    p = rk["peak"]
    r["peak_scope"] = "device"
    if p is None:
        return
    r["peak_bytes"] = p["peak_bytes"]
    r["peak_time"] = p["peak_time"]
    r["peak_ts_ns"] = p["peak_ts_ns"]
    r["devices"] = [
        dict(d, device=int(d["device"]) if d["device"].isdigit() else -1, label=d["device"])
        for d in rk["devices"]
    ]


def align_clocks(traces: list[Trace], run: dict[Any, Any]) -> None:
    """Monotonic clocks are per boot: processes of one host share one, another host's differs.
    With several hosts, each host's times are moved onto the clock of the host that booted
    first, through the wall time each file noted at its start
    (CLOCK_REALTIME - CLOCK_MONOTONIC): a timeline of all ranks lines up as far as the hosts'
    wall clocks agree (NTP: milliseconds). Within a host nothing moves, so the order of its
    events stays exact. run.json's start (the first directory's launcher) moves with its host."""
    offsets: dict[str, int] = {}
    for t in traces:
        if t.start_realtime_ns and t.start_monotonic_ns:
            offsets.setdefault(host_of(t), t.start_realtime_ns - t.start_monotonic_ns)
    if len(offsets) < 2:
        return
    base = min(offsets.values())
    for t in traces:
        shift = offsets.get(host_of(t), base) - base
        if shift:
            _shift(t, shift)
    if traces and isinstance(run.get("start_monotonic_ns"), int):
        run["start_monotonic_ns"] += offsets.get(host_of(traces[0]), base) - base


def _shift(t: Trace, ns: int) -> None:
    """Add ns to every time of a trace (its events, start, end, modules)."""
    if t.snap_slots:  # --aggregate: its events come from the snapshot; make them now
        apply_snapshots(t)
    if t.raw_events is not None and t._events is None:
        if t.n_events:  # the ts_ns column of the scanner's array, in place (0: unpublished)
            es = layout("struct ct_event")[0]
            ffi = native.ffi()
            assert ffi.offsetof("struct ct_event", "ts_ns") == 0 and es.size % 8 == 0
            q = memoryview(ffi.buffer(t.raw_events, es.size * t.n_events)).cast("B").cast("Q")
            col = q[0 :: es.size // 8]
            col[:] = array("Q", [v + ns if v else 0 for v in col.tolist()])
    else:
        t.events = [(e[0] + ns if e[0] else 0, *e[1:]) for e in t.events]
    t.clock_shift_ns += ns
    t.start_monotonic_ns += ns
    if t.end:
        t.end.ts_ns += ns
    if t.stopped_ns:
        t.stopped_ns += ns
    for m in t.modules:
        if m.ts_ns:
            m.ts_ns += ns
