"""The run's processes and devices in the report: each process's figures and how its trace
ended, the peak and each device's, the budget, the memory queries, traced versus observed,
the versions and events lost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...read.runfacts import launcher_saw_signal
from ...read.trace import C, Trace
from ...replay.lives import ADDR, AUX, AUX2, Groups
from ..analysis import Analysis
from .notes import beyond_traces


def versions_json(a: Analysis) -> dict[str, Any]:
    drv = sorted({t.info["driver_version"] for t in a.traces if t.info.get("driver_version")})
    shim = sorted({t.info.get("shim_version") or t.shim_version for t in a.traces} - {""})
    depth = sorted({t.stack_depth for t in a.traces})
    return {
        "driver": [int(d) if d.isdigit() else d for d in drv],
        "shim": shim,
        "stack_depth": depth,
        "nvml_driver": (a.td.run.get("sampler") or {}).get("driver"),
        "simulated": (a.td.run.get("simulated") or {}).get("device_bytes"),
    }


def lost_json(a: Analysis) -> list[dict[str, Any]]:
    """Processes whose shim stopped writing (a full disk): from when, and why. What they did
    after that moment is not in the trace."""
    out = []
    for t in a.traces:
        if t.stopped_ns:
            out.append(
                {
                    "file": t.path.name,
                    "pid": t.pid,
                    "from_ts_ns": t.stopped_ns,
                    "from_time": a.seconds(t.stopped_ns),
                    "why": t.stopped_why,
                    "exit_code": t.stopped_exit if t.stopped_exit != -1 else None,
                }
            )
    return out


def peak_json(a: Analysis, device: int | None) -> dict[str, Any]:
    """The peak (of the run, or of one device) and what was live at the end."""
    m = a.model
    if device is not None:
        pb, pts = m.device_peaks[device]
        return {
            "peak_bytes": pb,
            "peak_time": a.seconds(pts),
            "peak_ts_ns": pts,
            "end_bytes": m.device_end.get(device, 0),
        }
    return {
        "peak_bytes": m.peak_bytes,
        "peak_time": a.seconds(m.peak_ts) if m.found else None,
        "peak_ts_ns": m.peak_ts if m.found else None,
        "end_bytes": m.end_bytes,
    }


def _ended_seen(t: Trace) -> bool:
    """A trace with no exit record of a process the launcher saw end (not an image exec
    replaced, not one whose trace stopped early)."""
    return bool(not t.complete and t.exit_seen_ns and t.status != "exec" and not t.stopped_ns)


def processes_json(a: Analysis, live: Groups, warnings: list[Any]) -> tuple[list[Any], list[Any]]:
    """(processes, truncated files): one entry per trace file; lost events and gaps noted."""
    m = a.model
    moment_by_trace = live.by_trace()
    processes = []
    truncated = []
    for i, t in enumerate(a.traces):
        p = m.procs[i] if i < len(m.procs) else {}
        reason = None
        if not t.complete:
            reason = (
                "no clean exit record: the process was killed, crashed, exec'd without "
                "closing or is still running"
            )
            if t.stopped_ns and t.stopped_exit >= 0:  # the trace stopped, the process went on
                reason = "the trace stopped (%s); the process exited with status %d" % (
                    t.stopped_why,
                    t.stopped_exit,
                )
            elif _ended_seen(t):
                reason = (
                    "no clean exit record: the process was killed or crashed; the launcher saw "
                    "it end at %.3f s, when its memory ends" % (a.seconds(t.exit_seen_ns) or 0.0)
                )
            truncated.append(
                {"file": t.path.name, "pid": t.pid, "reason": reason, "events": t.n_events}
            )
        processes.append(
            {
                "pid": t.pid,
                "ppid": t.ppid,
                "exe": t.exe,
                "argv": t.argv,
                "file": t.path.name,
                "exec_index": t.exec_index,
                "status": t.status,
                "exit_code": t.end.exit_code
                if t.end
                else (t.stopped_exit if t.stopped_ns and t.stopped_exit >= 0 else None),
                "stopped": t.stopped_why or None,
                "dropped_events": t.end.dropped if t.end else None,
                "gaps": t.gaps,
                "events": t.n_events,
                "allocs": p.get("allocs", 0),
                "frees": p.get("frees", 0),
                "failed": p.get("failed", 0),
                "denied": p.get("denied", 0),
                "peak_bytes": p.get("peak_bytes", 0),
                "peak_time": a.seconds(p.get("peak_ts")) if p.get("allocs") else None,
                "at_bytes": moment_by_trace.get(i, 0),
                "end_bytes": p.get("end_bytes", 0),
                "first_time": a.seconds(p.get("first_ts")) if p.get("events") else None,
                "last_time": a.seconds(p.get("last_ts")) if p.get("events") else None,
            }
        )
        if _ended_seen(t):  # killed or crashed: when the launcher saw it end (record/exits.py)
            processes[-1]["ended_time"] = a.seconds(t.exit_seen_ns)
        sig = launcher_saw_signal(a.td, t)
        if sig:
            processes[-1]["signal"] = sig
        if t.end and t.end.dropped:
            warnings.append(
                "%s: %d events were lost (the trace file could not grow)"
                % (t.path.name, t.end.dropped)
            )
        if t.gaps:
            warnings.append(
                "%s: %d unpublished record(s) skipped (a writer died mid-record)"
                % (t.path.name, t.gaps)
            )
    return processes, truncated


def devices_json(
    a: Analysis, live: Groups, device: int | None, limits: dict[int, int]
) -> list[Any]:
    """One entry per device: its peak, end, allocations, bytes at the moment, budget."""
    m = a.model
    moment_by_dev = live.by_device()
    devices = []
    for dev, (pb, pts) in sorted(m.device_peaks.items()):
        if device is not None and dev != device:
            continue
        devices.append(
            {
                "device": dev,
                "peak_bytes": pb,
                "peak_time": a.seconds(pts),
                "peak_ts_ns": pts,
                "end_bytes": m.device_end.get(dev, 0),
                "allocs": m.device_allocs.get(dev, 0),
                "at_bytes": moment_by_dev.get(dev, 0),
                "budget": limits.get(dev),
            }
        )
    return devices


def observed_json(a: Analysis, mom: dict[str, Any], device: int | None) -> dict[str, Any]:
    """Traced versus observed near the peak (or the moment) and over the run."""
    m = a.model
    obs = a.observed.compare(
        mom["ts_ns"]
        if mom["kind"] == "peak" and mom["ts_ns"] is not None
        else (m.peak_ts if m.found else m.t0),
        lambda lo, hi: m.bytes_max(lo, hi, device),
        a.start_ns,
        device,
        ends=a.process_ends(),
    )
    obs["traced_peak_bytes"] = (
        m.device_peaks.get(device, (0, 0))[0] if device is not None else m.peak_bytes
    )
    return obs


def budget_json(a: Analysis, limits: dict[int, int]) -> dict[str, Any] | None:
    """The budget the run ran under (None without one)."""
    budget = None
    if limits or a.td.run.get("budget") or a.td.run.get("group"):
        on = sorted({t.info["on_exceed"] for t in a.traces if t.info.get("on_exceed")})
        budget = {
            "limits": {str(d): v for d, v in sorted(limits.items())},
            # the processes' own (the first, sorted, when they differ), else run.json's
            "on_exceed": on[0] if on else a.td.run.get("on_exceed"),
            "group": a.td.run.get("group"),
            "share": next(  # the share of the group they counted in (a Slurm job's): its label
                (t.info["budget_share"] for t in a.traces if t.info.get("budget_share")), None
            ),
            "aborted": bool(a.td.run.get("budget_aborted")),
            "spec": a.td.run.get("budget"),
            # CUDA contexts the budget counted beside the allocations (the shim's last
            # figure per process, summed): device -> bytes
            "contexts": {str(d): v for d, v in sorted(a.budget_contexts().items())},
            # what the ledger saw that no trace holds (a process could not record), or None
            "beyond_traces": beyond_traces(a),
        }
    return budget


def host_pinned_json(a: Analysis) -> dict[str, Any]:
    """Pinned host memory: its peak, when, what was live at the end, how many allocations."""
    m = a.model
    return {
        "peak_bytes": m.host_peak,
        "peak_time": a.seconds(m.host_peak_ts) if m.host_peak else None,
        "end_bytes": m.host_end,
        "allocs": m.counts.get("host_allocs", 0),
    }


def stack_counts(traces: Sequence[Trace]) -> dict[str, int]:
    """How the shim took the events' stacks, summed over the trace files (header counters)."""
    return {
        "stack_unwinds_full": sum(getattr(t, "stack_unwinds_full", 0) for t in traces),
        "stack_cache_hits": sum(getattr(t, "stack_cache_hits", 0) for t in traces),
    }


def memory_queries_json(a: Analysis, device: int | None) -> dict[str, Any]:
    K = C()
    virt = K["CT_EF_VIRTUALIZED"]
    qs = [q for q in a.model.meminfo if device is None or q.device == device]
    by_api: dict[str, int] = {}
    nvirt = 0
    for q in qs:
        t = a.traces[q.trace]
        name = t.api_name(q.api)
        if q.rt_api:
            name += f" ({t.api_name(q.rt_api)})"
        by_api[name] = by_api.get(name, 0) + 1
        if q.flags & virt:
            nvirt += 1
    last = None
    ok = [q for q in qs if q.result == 0]
    if ok:
        q = ok[-1]
        t = a.traces[q.trace]
        last = {
            "api": t.api_name(q.api),
            "time": a.seconds(q.ts),
            "pid": t.pid,
            "device": q.device,
            "free": q.event[ADDR],
            "total": q.size,
            "device_free": q.event[AUX],
            "device_total": q.event[AUX2],
            "virtualized": bool(q.flags & virt),
        }
    return {
        "count": len(qs),
        "failed": len(qs) - len(ok),
        "by_api": by_api,
        "virtualized": nvirt,
        "last": last,
    }
