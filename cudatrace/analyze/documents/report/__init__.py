"""The report as data: cudatrace.report/1, the JSON of `cudatrace report --json`
(docs/report-json.md). `build_report` puts the parts together in the document's order, each
made by the module of its section (present/report/ renders each into text, so text and JSON
never disagree):

    sites       what is live at the moment by site, never freed, failed and denied; attribution
    run         the peak and each device's, processes, the budget, memory queries, traced
                versus observed, versions, events lost
    notes       what the report cannot see, or sees with a caveat; sealed chunks lost
    aggregate   --aggregate (and damaged) traces: what they lack, each file's snapshot
    ranks       many ranks as one run (documents/ranks.py)
"""

from __future__ import annotations

from typing import Any, cast

from .... import __version__
from ...read.load import ReportError
from ...read.tags import hosts_of
from ...sites.group import depth_note
from ..analysis import Analysis
from ..python_summary import python_summary
from ..ranks import honest_peak, ranks_json, split_devices
from ..report_types import Report
from .aggregate import aggregate_notes
from .notes import coverage_notes, lost_chunks_json
from .run import (
    budget_json,
    devices_json,
    host_pinned_json,
    lost_json,
    memory_queries_json,
    observed_json,
    peak_json,
    processes_json,
    stack_counts,
    versions_json,
)
from .sites import attribution_json, failures_json, live_json

SCHEMA = "cudatrace.report/1"


def build_report(
    a: Analysis,
    at: str = "peak",
    by: str = "site",
    depth: int = 1,
    top: int = 10,
    device: int | None = None,
) -> Report:
    """The report: the --json output (docs/report-json.md), its parts in the document's order.
    Its type is the schema's (report_types.py; tests/unit/test_schemas.py validates what this
    builds)."""
    check_device(a, device)
    mom = a.moment(at, device)
    live = a.live(mom)
    sites = a.sites(live, by, depth)
    listed = live_json(a, live, sites, by, depth, top, device)  # the moment's, never freed
    # the notes, in the report's order: the depth, each process's, what the report cannot
    # see, what --aggregate traces lack
    warnings = depth_note(lambda d: a.sites(live, by, d), depth, len(sites)) if by == "site" else []
    processes, truncated = processes_json(a, live, warnings)
    limits = a.budget_limits()
    failed, denied = failures_json(a, device, depth)
    sc = stack_counts(a.traces)
    lost = lost_json(a)
    warnings += coverage_notes(a, mom, truncated, sc, lost)
    agg = aggregate_notes(a)
    warnings.extend(agg["warnings"])
    r = {
        **_head(a, mom, by, depth, device),
        **peak_json(a, device),
        **listed,
        "failed": failed,
        "denied": denied,
        "processes": processes,
        "devices": devices_json(a, live, device, limits),
        "host_pinned": host_pinned_json(a),
        "memory_queries": memory_queries_json(a, device),
        "observed": observed_json(a, mom, device),
        "budget": budget_json(a, limits),
        "counts": {**a.model.counts, **sc},
        "truncated_files": truncated,
        "python": python_summary(a.traces, a.model.stack_totals(), a.stacks.view),
        "lost": lost,
        "lost_chunks": lost_chunks_json(a.traces),
        "unreadable_files": list(a.td.errors),
        "warnings": warnings,
        "aggregate": agg["json"],
        "paths": [str(d) for d in (a.td.dirs or [a.path])],
        "ranks": ranks_json(a, depth=depth, top=top),
    }
    honest_peak(r)
    return cast(Report, r)


def _head(
    a: Analysis, mom: dict[str, Any], by: str, depth: int, device: int | None
) -> dict[str, Any]:
    """What was run, when, with what; the moment and grouping asked; how sites were
    attributed."""
    m = a.model
    argv = a.td.run.get("argv") or (a.traces[0].argv if a.traces else [])
    return {
        "schema": SCHEMA,
        "cudatrace_version": __version__,
        "path": str(a.path),
        "command": list(argv),
        "start_ns": a.start_ns,
        "start_time": a.td.run.get("start_time"),
        "duration": a.seconds(m.t_end) if m.n_events else 0.0,
        "run_seconds": a.run_seconds(),
        "exit_status": a.td.run.get("exit_status"),
        "versions": versions_json(a),
        "at": {
            "spec": mom["spec"],
            "kind": mom["kind"],
            "time": a.seconds(mom["ts_ns"]),
            "ts_ns": mom["ts_ns"],
            "device": device,
        },
        "by": by,
        "depth": depth,
        "device": device,
        "attribution": attribution_json(a),
    }


def check_device(a: Analysis, device: int | None) -> None:
    """--device names one device this run used, and one only."""
    m = a.model
    if device is not None and split_devices(a):
        raise ReportError(
            "--device picks a device ordinal, and in this run one ordinal names "
            "several devices (%d hosts, or CUDA_VISIBLE_DEVICES differing between processes): "
            "report one process's or host's trace with --device, or see each device's peak in "
            "the run's report (docs/ranks.md)" % len(hosts_of(a.traces))
        )
    if device is not None and device not in m.device_peaks:
        seen = ", ".join(str(d) for d in sorted(m.device_peaks)) or "none"
        raise ReportError(
            "no device memory was traced on device %d (devices with "
            "allocations: %s)" % (device, seen)
        )
