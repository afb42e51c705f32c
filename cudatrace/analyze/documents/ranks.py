"""Many ranks as one run (docs/ranks.md): per-rank and per-device peaks, sites merged across
ranks, the outlier rule, the ranks missing from a world; each process's host and rank are
read/tags.py's, a run of several directories read/load.py's.

Honest figures: processes on different hosts never share a device, and ranks on one host often
see different GPUs as their device 0 (CUDA_VISIBLE_DEVICES). So a peak here is one rank's (the
sum of its own processes) or one physical device's (host and the GPU the ordinal names); no
figure adds up bytes of different devices and calls it a peak.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from ... import native
from ..read.tags import RANK_VARS, RankGroup, device_label, hosts_of, rank_groups, tag_of, tagged
from ..read.trace import C, Trace, host_of, layout
from ..replay.lives import END_EXITED, device_kinds, peak

if TYPE_CHECKING:
    from ..replay.lives import Alloc
    from .analysis import Analysis

T = TypeVar("T")


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


def peaks(
    allocs: Iterable[Alloc], key: Callable[[Alloc], Hashable | None]
) -> dict[Any, tuple[int, int | None]]:
    """key(alloc) -> (peak bytes, time of the peak) over allocation lifetimes (lives.peak)."""
    by: dict[Any, list[Alloc]] = defaultdict(list)
    for a in allocs:
        k = key(a)
        if k is not None:
            by[k].append(a)
    return {k: peak(lst) for k, lst in by.items()}


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
            if x.end_ts is None or x.how == END_EXITED:  # never freed (replay/lives.py)
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
    """The report's `ranks` section (docs/report-json.md), None for a run without ranks: each
    rank's figures, each physical device's, the hosts, the outliers, the sites across ranks."""
    traces = a.traces
    if not traces or not tagged(traces):
        return None
    tb = tables(a)
    groups, rank_peaks = tb["groups"], tb["rank_peaks"]
    med, out_keys = outliers({g.key: rank_peaks.get(g.key, (0, None))[0] for g in groups})
    ranks = [_rank_json(a, g, tb, g.key in out_keys) for g in groups]
    devices = _devices_json(a, tb)
    hosts = _hosts_json(traces, groups)
    sites, more = merged_sites(a, groups, rank_peaks, depth, top)
    by_label = {g.key: g.label for g in groups}
    return {
        "split_devices": split_devices(a),
        "hosts": hosts,
        "sources": sorted({tag_of(t).source for t in traces if tag_of(t).source}),
        "ranks": ranks,
        "devices": devices,
        "peak": max(devices, key=lambda d: d["peak_bytes"], default=None),
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


def _rank_json(a: Analysis, g: RankGroup, tb: dict[Any, Any], outlier: bool) -> dict[Any, Any]:
    """One rank: its processes, files, devices, peak and counts."""
    traces, m = a.traces, a.model
    pb, pts = tb["rank_peaks"].get(g.key, (0, None))
    procs = [m.procs[i] if i < len(m.procs) else {} for i in g.traces]
    return {
        "label": g.label,
        "rank": g.rank,
        "host": g.host,
        "local_rank": g.local_rank,
        "world_size": g.world_size,
        "pids": sorted({traces[i].pid for i in g.traces}),
        "files": [traces[i].path.name for i in g.traces],
        "dirs": sorted({traces[i].source for i in g.traces if traces[i].source}),
        "devices": sorted(tb["rank_devs"].get(g.key, ())),
        "peak_bytes": pb,
        "peak_time": a.seconds(pts),
        "end_bytes": sum(p.get("end_bytes", 0) for p in procs),
        "allocs": sum(p.get("allocs", 0) for p in procs),
        "failed": sum(p.get("failed", 0) for p in procs),
        "denied": sum(p.get("denied", 0) for p in procs),
        "outlier": outlier,
    }


def _devices_json(a: Analysis, tb: dict[Any, Any]) -> list[dict[Any, Any]]:
    """Each physical device (host, the GPU an ordinal names there): its peak, end, allocations
    and the ranks that used it."""
    return [
        {
            "host": h,
            "device": d,
            "peak_bytes": pb,
            "peak_time": a.seconds(pts),
            "peak_ts_ns": pts,
            "end_bytes": tb["dev_end"][(h, d)],
            "allocs": tb["dev_allocs"][(h, d)],
            "ranks": sorted(tb["dev_ranks"][(h, d)], key=_label_order),
        }
        for (h, d), (pb, pts) in sorted(tb["dev_peaks"].items())
    ]


def _hosts_json(traces: list[Trace], groups: list[RankGroup]) -> list[dict[Any, Any]]:
    """Each host: its trace directories, ranks, processes and how far its clock was moved."""
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
    return [dict(h, dirs=sorted(h["dirs"])) for h in hosts.values()]


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
