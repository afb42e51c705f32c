"""The report's sites: those live at the moment, what was never freed, failed allocations and
budget denials, each with its frames; how they were attributed."""

from __future__ import annotations

from typing import Any

from ...replay.lives import AUX, AUX2, Alloc, Groups
from ...sites.group import Site
from ...sites.stacks import SFrame
from ..analysis import Analysis
from ..cu_errors import cu_error


def _frames(frames: list[SFrame]) -> list[dict[str, Any]]:
    return [f.as_json() for f in frames]


def site_json(a: Analysis, s: Site, total: int, rank: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "label": s.label(a.full_names),
        "key": s.key_text(),
        "bytes": s.bytes,
        "count": s.count,
        "share": round(s.bytes / total, 6) if total else 0.0,
        "api": s.api_list(),
        "api_counts": dict(s.apis),
        "sizes": s.size_summary(),
        "pids": sorted(s.pids),
        "devices": sorted(s.devices),
        "device_labels": sorted(s.device_labels),
        "first_time": a.seconds(s.first_ts),
        "last_time": a.seconds(s.last_ts),
        "frames": _frames(s.frames),
        "context": _frames(s.context),
        "via": _frames(s.via),
    }


def attribution_json(a: Analysis) -> dict[str, Any]:
    """How sites were attributed (docs/attribution.md): layers folded or not, the --fold
    patterns, the functions recognized as allocator layers, full names or short."""
    st = a.stacks
    return {
        "fold": st.layers,
        "patterns": [p.pattern for p in st.patterns],
        "layers": st.layer_names(a.full_names) if st.layers else [],
        "full_names": a.full_names,
    }


def live_json(
    a: Analysis, live: Groups, sites: list[Site], by: str, depth: int, top: int, device: int | None
) -> dict[str, Any]:
    """What was live at the moment, by the grouping asked (its `top` sites), and what was never
    freed by site: one numbering of sites in every table (a site never freed keeps its number
    of the table of the moment; one not in it is numbered after that table's sites)."""
    end_live = a.model.groups_at_end(device)
    end_sites = a.sites(end_live, "site", depth)
    numbers = {x.key: i for i, x in enumerate(sites, 1)} if by == "site" else {}
    total = live.bytes
    return {
        "total_live_bytes": total,
        "total_live_count": live.count,
        "sites": [site_json(a, s, total, i) for i, s in enumerate(sites[:top], 1)],
        "more_sites": max(0, len(sites) - top),
        "never_freed": never_freed_json(a, end_live, end_sites, top, numbers),
    }


def never_freed_json(
    a: Analysis, end_live: Groups, end_sites: list[Any], top: int, numbers: dict[Any, int]
) -> dict[str, Any]:
    """What was live at the end, by site, each with its number of the report's sites (numbers:
    key -> number; the others numbered after them); how much of it in truncated traces."""
    trunc_idx = {i for i, t in enumerate(a.traces) if not t.complete}
    listed, after = [], len(numbers)
    for s in end_sites[:top]:
        n = numbers.get(s.key)
        if n is None:
            after += 1
            n = after
        listed.append(site_json(a, s, end_live.bytes, n))
    return {
        "bytes": end_live.bytes,
        "count": end_live.count,
        "in_truncated_bytes": end_live.only(traces=trunc_idx).bytes,
        "sites": listed,
        "more_sites": max(0, len(end_sites) - top),
    }


def failures_json(a: Analysis, device: int | None, depth: int) -> tuple[list[Any], list[Any]]:
    """(failed, denied): failed allocations and budget denials grouped by site."""
    m = a.model
    failed_allocs = [x for x in m.failed if device is None or x.device == device]
    failed = []
    for rank, s in enumerate(a.sites(failed_allocs, "site", depth), 1):
        d = site_json(a, s, 0, rank)
        d.pop("share")
        d["errors"] = [
            {"code": c, "name": cu_error(c), "count": n} for c, n in s.results.most_common()
        ]
        failed.append(d)
    denied_allocs = [x for x in m.denied if device is None or x.device == device]
    denied = []
    for rank, s in enumerate(a.sites(denied_allocs, "site", depth), 1):
        d = site_json(a, s, 0, rank)
        d.pop("share")
        mine = [x for x in denied_allocs if _same_site(a, x, s, depth)]
        last = max(mine, key=lambda x: x.ts) if mine else None
        d["limit"] = last.event[AUX] if last else None
        d["in_use"] = last.event[AUX2] if last else None
        denied.append(d)
    return failed, denied


def _same_site(a: Analysis, x: Alloc, s: Site, depth: int) -> bool:
    fr = a.stacks.site_frames(x.trace, x.stack)[:depth] if x.stack else []
    return tuple(f.key() for f in fr) == s.key
