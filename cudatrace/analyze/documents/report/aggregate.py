"""The report's part of --aggregate traces (and damaged ones): what they lack, said in its
notes, and each file's snapshot (read/aggregate.py turns it into the events the replay
reads)."""

from __future__ import annotations

from typing import Any

from ...read.aggregate import Snapshot
from ...read.trace import C, Trace
from ..analysis import Analysis


def aggregate_notes(a: Analysis) -> dict[str, Any]:
    """What the report says of aggregate (and damaged) traces: {"warnings": [...], "json":
    {...} or None when no trace of the run is an aggregate one}."""
    damaged = [
        f"{t.path.name}: {t.bad_events} event(s) could not be decoded (the file is "
        "damaged in the middle) and were skipped"
        for t in a.traces
        if t.bad_events
    ]
    aggs = [(t, s) for t in a.traces if isinstance(s := t.aggregate, Snapshot)]
    if not aggs:
        return {"warnings": damaged, "json": None}
    warnings = damaged + [
        "aggregate trace (--aggregate): exact at each process's peak, each device's peak and "
        "the end; a full trace would add the timeline between them (--at TIME shows the "
        "nearest of these moments before it), every event's time and order, and the "
        "observed-vs-traced comparison over time"
    ]
    if len(aggs) > 1:
        peaks = [p.get("peak_bytes", 0) for p in a.model.procs]
        warnings.append(
            "aggregate traces of several processes: each process's peak is exact (processes), "
            "their sum over time is not known: the run's true peak lies between the highest "
            "process peak (%d bytes) and the sum of them (%d bytes); the run's peak shown holds "
            "each process at its last moment until its next" % (max(peaks), sum(peaks))
        )
    files = []
    for t, snap in aggs:
        warnings += _file_notes(a, t, snap)
        files.append(_file_json(a, t, snap))
    return {"warnings": warnings, "json": {"files": files}}


def _file_notes(a: Analysis, t: Trace, s: Snapshot) -> list[str]:
    """What one aggregate file's snapshot lacks."""
    h = s.head
    if not h:
        return [f"{t.path.name}: no complete snapshot (killed before the first one was written)"]
    out = []
    if h["events_not_written"]:
        out.append(
            f"{t.path.name}: {h['events_not_written']} failure/denial/query "
            "events over the aggregate caps were counted, not kept"
        )
    if any(k["flags"] & C()["CT_SNAP_KEY_MIXED"] for k in s.keys):
        out.append(f"{t.path.name}: too many distinct sites and sizes: some sizes are averaged")
    if not t.complete:
        out.append(
            f"{t.path.name}: the process did not exit cleanly: its last "
            f"snapshot is {a.seconds(h['ts_ns'])} s into the run; what came "
            "after it is not known"
        )
    return out


def _file_json(a: Analysis, t: Trace, s: Snapshot) -> dict[str, Any]:
    """One aggregate file: its snapshot's counts and moments, its 20 largest keys' totals."""
    h = s.head
    if not h:
        return {"file": t.path.name, "pid": t.pid, "snapshot": None, "slots": s.slots}
    return {
        "file": t.path.name,
        "pid": t.pid,
        "snapshot": h["seq"],
        "snapshot_time": a.seconds(h["ts_ns"]),
        "reason": {1: "exit", 2: "peak", 3: "interval"}.get(h["reason"], "?"),
        "snapshots_written": h["snapshots"],
        "slots": s.slots,
        "allocs": h["allocs"],
        "frees": h["frees"],
        "failed": h["failed"],
        "denied": h["denied"],
        "memory_queries": h["meminfo"],
        "unmatched_frees": h["unmatched_frees"],
        "not_written": h["events_not_written"],
        "moments": [{"what": w, "time": a.seconds(ts)} for w, ts in s.moments],
        "totals": [
            _key_json(a, t, k) for k in sorted(s.keys, key=lambda k: -k["alloc_bytes"])[:20]
        ],
    }


def _key_json(a: Analysis, t: Trace, k: dict[str, Any]) -> dict[str, Any]:
    """One key of a snapshot (a site and size): its frames, API, device and the run's totals."""
    ti = a.traces.index(t)
    return {
        "frames": [f.as_json() for f in a.stacks.frames(ti, k["stack"])[:3]] if k["stack"] else [],
        "api": t.api_name(k["api"]),
        "device": k["device"],
        "size": k["size"],
        "mixed_sizes": bool(k["flags"] & C()["CT_SNAP_KEY_MIXED"]),
        "allocs": k["allocs"],
        "alloc_bytes": k["alloc_bytes"],
        "frees": k["frees"],
        "freed_bytes": k["freed_bytes"],
        "live_bytes": k["cur_bytes"],
    }
