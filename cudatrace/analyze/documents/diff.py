"""`cudatrace diff A B`: what changed between two runs (or two builds) of a program.

Sites are matched by their symbolized frames (SFrame.key(): module basename, function, file
basename; module and offset when a frame could not be symbolized), never by address, so runs
with different load addresses compare, and so do builds when symbols are there. For each site:
bytes and counts live at each run's own peak and at the end, and whether the site allocated
anything at all in each run, which labels it new (never allocated in A), gone (never in B),
grown, shrunk or same (by bytes at the peak, then at the end). Largest absolute change first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Optional, cast

from ..sites.group import Site, key_text, site_of
from ..sites.stacks import SFrame
from .analysis import Analysis
from .diff_types import Diff, DiffPair, DiffRanks, DiffSide, DiffSite
from .ranks import ranks_diff, split_devices, tables

SCHEMA: Literal["cudatrace.diff/1"] = "cudatrace.diff/1"


def share_graph(a: Analysis, b: Analysis) -> None:
    """Recognize the allocator layers from the stacks of both runs together (names, not
    addresses: function identities compare across runs), so both sides fold alike."""
    if a.stacks.graph is not b.stacks.graph:
        b.stacks.graph = a.stacks.graph
    a.stacks.learn(a.model.allocation_stacks())
    b.stacks.learn(b.model.allocation_stacks())
    a.stacks.set_source(None)
    b.stacks.set_source(None)


def _side(a: Analysis) -> DiffSide:
    m = a.model
    peak, peak_ts = (m.peak_bytes, m.peak_ts if m.found else None)
    if split_devices(a):  # one ordinal, several devices: the most one held (ranks.md)
        peak, peak_ts = max(tables(a)["dev_peaks"].values(), default=(0, None))
    return {
        "path": str(a.path),
        "paths": [str(d) for d in (a.td.dirs or [a.path])],
        "command": list(a.td.run.get("argv") or (a.traces[0].argv if a.traces else [])),
        "peak_bytes": peak,
        "peak_time": a.seconds(peak_ts),
        "end_bytes": m.end_bytes,
        "allocs": m.counts.get("allocs", 0),
        "failed": m.counts.get("failed", 0),
        "denied": m.counts.get("denied", 0),
        "processes": len(a.traces),
        "truncated_files": [t.path.name for t in a.traces if not t.complete],
    }


def _pair(x: int, y: int) -> DiffPair:
    return {"a": x, "b": y, "delta": y - x}


def diff(a: Analysis, b: Analysis, depth: int = 1, top: int | None = None) -> Diff:
    """The comparison as a dict: the --json output (docs/report-json.md, cudatrace.diff/1)."""
    if a.stacks.graph is not b.stacks.graph:
        share_graph(a, b)
    rows: dict[tuple[Any, ...], dict[Any, Any]] = {}
    for side, an in ((0, a), (1, b)):
        _collect(rows, side, an, depth)
    sites = sorted((_site(r) for r in rows.values()), key=_order)
    counts = {
        k: sum(1 for s in sites if s["status"] == k)
        for k in ("grown", "shrunk", "new", "gone", "same")
    }
    A, B = _side(a), _side(b)
    shown = sites if top is None else sites[:top]
    return {
        "schema": SCHEMA,
        "depth": depth,
        "a": A,
        "b": B,
        "totals": {
            "peak_bytes": _pair(A["peak_bytes"], B["peak_bytes"]),
            "end_bytes": _pair(A["end_bytes"], B["end_bytes"]),
            "allocs": _pair(A["allocs"], B["allocs"]),
            "failed": _pair(A["failed"], B["failed"]),
            "denied": _pair(A["denied"], B["denied"]),
        },
        "status_counts": counts,
        # the sites and ranks as the schema has them (tests/unit/test_schemas.py validates)
        "sites": cast(list[DiffSite], shown),
        "more_sites": len(sites) - len(shown),
        "ranks": cast(Optional[list[DiffRanks]], ranks_diff(a, b)),
    }


def _slot(
    rows: dict[Any, dict[Any, Any]],
    key: Any,
    frames: list[SFrame],
    label: str,
    via: Sequence[SFrame] = (),
) -> dict[Any, Any]:
    """The row of site `key`, made on first sight; both sides add to it."""
    r = rows.get(key)
    if r is None:
        r = rows[key] = {
            "key": key,
            "frames": frames,
            "label": label,
            "via": list(via),
            "peak_bytes": [0, 0],
            "peak_count": [0, 0],
            "end_bytes": [0, 0],
            "end_count": [0, 0],
            "run_bytes": [0, 0],
            "run_count": [0, 0],
        }
    elif not r["frames"] and frames:
        r["frames"], r["label"] = frames, label
    return r


def _collect(rows: dict[Any, Any], side: int, an: Analysis, depth: int) -> None:
    """Add one run's sites: live at its peak and at its end, and everything it allocated."""
    m = an.model
    for what, allocs in (("peak", m.groups_at_peak()), ("end", m.groups_at_end())):
        for s in an.sites(allocs, "site", depth):
            r = _slot(rows, s.key, s.frames, s.label(an.full_names), s.via)
            r[what + "_bytes"][side] += s.bytes
            r[what + "_count"][side] += s.count
    totals = m.stack_totals()
    an.stacks.prepare(list(totals))
    for (ti, leaf), (cnt, nbytes) in totals.items():
        key, fr = site_of(an.stacks, ti, leaf, depth)
        label = Site(key, fr).label(an.full_names)
        r = _slot(rows, key, fr, label, an.stacks.split(ti, leaf)[0])
        r["run_bytes"][side] += nbytes
        r["run_count"][side] += cnt


def _status(r: dict[Any, Any]) -> str:
    pa, pb = r["peak_bytes"]
    ea, eb = r["end_bytes"]
    ra, rb = r["run_count"]
    if ra == 0 and rb > 0:
        return "new"
    if rb == 0 and ra > 0:
        return "gone"
    if pb != pa:
        return "grown" if pb > pa else "shrunk"
    if eb != ea:
        return "grown" if eb > ea else "shrunk"
    return "same"


def _moment(r: dict[Any, Any], what: str) -> dict[Any, Any]:
    (xa, xb), (ca, cb) = r[what + "_bytes"], r[what + "_count"]
    return {
        "a_bytes": xa,
        "b_bytes": xb,
        "delta_bytes": xb - xa,
        "a_count": ca,
        "b_count": cb,
        "delta_count": cb - ca,
    }


def _site(r: dict[Any, Any]) -> dict[Any, Any]:
    """One site of the JSON from its row."""
    ra, rb = r["run_count"]
    return {
        "status": _status(r),
        "label": r["label"],
        "key": key_text(r["key"]),
        "frames": [f.as_json() for f in r["frames"]],
        "via": [f.as_json() for f in r["via"]],
        "peak": _moment(r, "peak"),
        "end": _moment(r, "end"),
        "run": {
            "a_bytes": r["run_bytes"][0],
            "b_bytes": r["run_bytes"][1],
            "a_count": ra,
            "b_count": rb,
            "delta_count": rb - ra,
        },
    }


def _order(s: dict[Any, Any]) -> tuple[Any, ...]:
    """Largest absolute change first (bytes, then counts), then by label."""
    return (
        -max(abs(s["peak"]["delta_bytes"]), abs(s["end"]["delta_bytes"])),
        -abs(s["peak"]["delta_count"]),
        -abs(s["end"]["delta_count"]),
        -abs(s["run"]["delta_count"]),
        s["label"],
    )
