"""The base every report stands on, and the report as data.

`Analysis` loads a trace directory (or one .ctrace file), replays it into the model, and groups
allocations into sites through `sites.group` (as memray's reporters share one base). The report
is built as a plain dict, exactly the JSON of `cudatrace report --json` (schema
cudatrace.report/1, docs/report-json.md); present/report.py renders the text from that dict, so
the two never disagree. diff and the summary of `cudatrace run` stand on the same base.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, cast

from .. import __version__, tracedir
from ..attribution import Attribution
from ..errors import CudatraceError
from ..units import parse_moment
from .aggregate import notes as aggregate_notes
from .cu_errors import cu_error as cu_error  # the report names failures by it
from .documents import Report
from .layers import compile_patterns
from .model import ADDR, AUX, AUX2, NONE64, Alloc, Groups, Model, build
from .observed import Observed
from .python_summary import python_summary
from .ranks import (
    align_clocks,
    honest_peak,
    hosts_of,
    ranks_json,
    separate_runs,
    split_devices,
)
from .runfacts import launcher_saw_signal, run_seconds
from .sites import SFrame, Site, Stacks, depth_note, group, make_symbolizer
from .trace import C, TraceDir, TraceError, read_dir, read_dirs, read_trace, run_dirs
from .unseal import lost_chunks_json

if TYPE_CHECKING:
    from ..symbols import Symbolizer
    from .layers import CallGraph
    from .trace import Trace

SCHEMA = "cudatrace.report/1"
CONTEXT_FRAMES = 6  # frames listed per stack


class ReportError(CudatraceError):
    """A trace that cannot be reported on: exit status 2, with a message naming the file."""


# ---- the shared base ----------------------------------------------------------------------


def load(path: PathArg) -> TraceDir:
    """Read a trace directory or one .ctrace file, or raise ReportError naming what is wrong.
    Several paths (a list), or a directory of trace directories, are one run of many ranks
    (docs/ranks.md)."""
    paths = [Path(x) for x in path] if isinstance(path, (list, tuple)) else [Path(path)]
    dirs = run_dirs(paths[0]) if len(paths) == 1 else paths
    if len(dirs) > 1:
        return _load_many(paths)
    p = dirs[0]  # the path, or the one trace directory a folder holds
    if not p.exists():
        raise ReportError(f"{p}: no such trace directory or file")
    try:
        if p.is_file():
            t = read_trace(p)
            return TraceDir(p.parent, [t], _sibling_run(p), [])
        td = read_dir(p)
    except TraceError as e:
        raise ReportError(f"{e}") from None
    except OSError as e:
        where = getattr(e, "filename", None) or p
        raise ReportError(f"{where}: {e.strerror or e}") from None
    if not td.traces:
        errors = "\n  ".join(td.errors)
        raise ReportError(f"{p}: no readable trace file:\n  {errors}")
    return td


def _load_many(paths: list[Path]) -> TraceDir:
    for p in paths:
        if not p.exists():
            raise ReportError(f"{p}: no such trace directory or file")
    try:
        td = read_dirs(paths)
    except TraceError as e:
        raise ReportError(f"{e}") from None
    except OSError as e:
        raise ReportError(
            f"{getattr(e, 'filename', None) or paths[0]}: {e.strerror or e}"
        ) from None
    if not td.traces:
        errors = "\n  ".join(td.errors)
        raise ReportError(f"no readable trace file in {len(td.dirs)} directories:\n  {errors}")
    separate = separate_runs(td, paths[0] if len(paths) == 1 else None)
    if separate:
        raise ReportError(separate)
    align_clocks(td.traces, td.run)
    return td


def _sibling_run(file: Path) -> dict[str, Any]:
    """run.json beside a single .ctrace file, if it is there."""
    rp = file.parent / tracedir.RUN
    if rp.is_file():
        try:
            result: dict[str, Any] = json.loads(rp.read_text())
            return result
        except ValueError:
            return {}
    return {}


# a trace directory or .ctrace file, or several (one run of many ranks)
PathArg = Union[str, Path, "list[Path]", "list[str]", "tuple[Path, ...]"]


class Analysis:
    """Trace directory -> model -> stacks; what every report command starts from."""

    def __init__(
        self,
        path: PathArg,
        attribution: Attribution = Attribution(),
        symbolize: bool = True,
        progress: bool = False,
        td: TraceDir | None = None,
        symbolizer: Symbolizer | None = None,
        graph: CallGraph | None = None,
    ) -> None:
        self.paths = [Path(x) for x in path] if isinstance(path, (list, tuple)) else [Path(path)]
        self.path = self.paths[0]
        self.td = td if td is not None else load(path)
        self.traces = self.td.traces
        self.model: Model = build(self.td)
        if symbolizer is None and symbolize:
            from ..progress import bar

            symbolizer = make_symbolizer(progress=bar if progress else False)
        self.symbolizer = symbolizer
        self.attribution = attribution
        self.full_names = attribution.full_names
        cuda = attribution.show_cuda_frames
        self.stacks = Stacks(
            self.traces,
            symbolizer,
            fold=not cuda,
            layers=attribution.fold and not cuda,  # the raw stacks, as recorded
            patterns=compile_patterns(attribution.fold_patterns),
            graph=graph,
            view=attribution.view,
        )
        self.stacks.set_source(self.allocation_stacks)
        self.observed = Observed(self.td)
        self.start_ns = self._start()

    def _start(self) -> int:
        """Time zero of "seconds since start": the launcher's start when run.json has it (the
        samples share it), else the first trace's start."""
        starts = [t.start_monotonic_ns for t in self.traces if t.start_monotonic_ns]
        first = min(starts) if starts else self.model.t0
        r = self.td.run.get("start_monotonic_ns")
        if isinstance(r, int) and 0 < r <= (first or r):
            return r
        return first or self.model.t0

    def allocation_stacks(self) -> list[tuple[int, int]]:
        """Every (trace, leaf) stack that allocated, failed or was denied: the call graph the
        allocator layers are recognized from (analyze/layers.py)."""
        m = self.model
        keys = set(m.stack_totals())
        keys.update((x.trace, x.stack) for x in m.failed if x.stack)
        keys.update((x.trace, x.stack) for x in m.denied if x.stack)
        return sorted(keys)

    def seconds(self, ts: int | None) -> float | None:
        if ts is None:
            return None
        return round((ts - self.start_ns) / 1e9, 6)

    def sites(
        self, allocs: Groups | Iterable[Alloc], by: str = "site", depth: int = 1
    ) -> list[Site]:
        return group(self.model, allocs, self.stacks, by, depth, context=max(CONTEXT_FRAMES, depth))

    def moment(self, spec: str = "peak", device: int | None = None) -> dict[str, Any]:
        """What --at names: {"spec", "kind", "ts_ns", "seq", "device"}."""
        m = self.model
        s = (spec or "peak").strip().lower()
        if s == "peak":
            if device is None:
                return {
                    "spec": "peak",
                    "kind": "peak",
                    "ts_ns": m.peak_ts if m.found else None,
                    "seq": m.peak_seq if m.found else None,
                    "device": None,
                }
            b, ts = m.device_peaks.get(device, (0, None))
            return {
                "spec": "peak",
                "kind": "peak",
                "ts_ns": ts,
                "seq": m.device_peak_seq.get(device),
                "device": device,
            }
        if s == "end":
            return {
                "spec": "end",
                "kind": "end",
                "ts_ns": m.t_end if m.n_events else None,
                "seq": NONE64 - 1,
                "device": device,
            }
        secs = parse_moment(spec)
        assert not isinstance(secs, str)  # "peak" and "end" were answered above
        self._within_run(spec, secs)
        return {
            "spec": spec,
            "kind": "time",
            "ts_ns": self.start_ns + int(round(secs * 1e9)),
            "seq": None,
            "device": device,
        }

    def run_seconds(self) -> float:
        """How long the run lasted, from its start (runfacts.run_seconds)."""
        ends = [self.model.t_end] if self.model.n_events else []
        return run_seconds(self.td, [*ends, *self.process_ends().values()], self.start_ns)

    def _within_run(self, spec: str, secs: float) -> None:
        """--at TIME names a moment of the run, or is refused: a moment after it ended would
        show nothing live (each process's memory ended with it), which reads as a fact of the
        run when it is none."""
        end = self.run_seconds()
        if secs < 0 or secs > end + 1e-6:
            raise ReportError(
                f"--at {spec}: the run lasted {end:.3f} s (from its start to its end); give a "
                f"time within it, or --at end (what was live when it ended) or --at peak"
            )

    def live(self, moment: dict[str, Any]) -> Groups:
        """What is live at the moment, grouped (sites.group takes it as is)."""
        m, dev = self.model, moment["device"]
        if moment["kind"] == "peak":
            return m.groups_at_peak(dev)
        if moment["kind"] == "end":
            return m.groups_at_end(dev)
        return m.groups_at(moment["ts_ns"], dev)

    def process_ends(self) -> dict[int, int]:
        """pid -> when its traced memory ended (when the launcher saw it die, else its last
        image's exit record: model.process_ends), for the processes that ended; one still
        running or lost is not there."""
        ends: dict[int, int | None] = {}
        for t in self.traces:
            e = max(t.end.ts_ns, t.exit_seen_ns) if t.end else (t.exit_seen_ns or None)
            prev = ends.get(t.pid, 0)
            ends[t.pid] = None if e is None or prev is None else max(prev, e)
        return {pid: e for pid, e in ends.items() if e}

    def budget_limits(self) -> dict[int, int]:
        """device -> limit in bytes, as the shim wrote it into the traces."""
        out: dict[int, int] = {}
        for t in self.traces:
            for k, v in t.info.items():
                if k.startswith("budget."):
                    try:
                        out[int(k[7:])] = int(v)
                    except ValueError:
                        pass
        return out

    def budget_contexts(self) -> dict[int, int]:
        """device -> bytes of CUDA context the budget counted, summed over the processes (each
        trace's last "context.<dev>" figure, measured through NVML by the shim)."""
        out: dict[int, int] = {}
        for t in self.traces:
            for k, v in t.info.items():
                if k.startswith("context.") and v.isdigit():
                    d = int(k[8:]) if k[8:].isdigit() else 0
                    out[d] = out.get(d, 0) + int(v)
        return out


# ---- the report as data --------------------------------------------------------------------


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


def _versions(a: Analysis) -> dict[str, Any]:
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


PLAUSIBLE_MAX = 1 << 50  # 1 PiB: no device holds more; a figure past it is a corrupt field


def beyond_traces(a: Analysis) -> dict[str, Any] | None:
    """What the budget ledger saw that the traces lack (a process could not record: its trace
    file could not be created or grow): {"denials": denials no trace holds, "peak_bytes": the
    ledger's peak (contexts included) when no allocation was traced, else 0}; None when the
    traces hold all the ledger saw (or no ledger ran)."""
    if not isinstance(a.td.run, dict) or a.td.run.get("group"):
        return None  # a group's ledger counts every member's runs, not this run's alone
    ledger = a.td.run.get("ledger_final")
    devs = ledger.get("devices") if isinstance(ledger, dict) else None
    if not isinstance(devs, list):
        return None
    devs = [d for d in devs if isinstance(d, dict)]
    denials = sum(int(d.get("denials") or 0) for d in devs)
    untraced = max(0, denials - a.model.counts.get("denied", 0))
    peak = 0 if a.model.found else max((int(d.get("peak") or 0) for d in devs), default=0)
    if not untraced and not peak:
        return None
    return {"denials": untraced, "peak_bytes": peak}


def unrecorded(a: Analysis) -> list[str]:
    """What the run did that its traces do not hold: processes whose trace stopped (a full disk,
    no descriptor left), and what the budget ledger saw beyond the traces (denials, a peak) when
    a process could not record at all."""
    from ..units import format_bytes

    out = []
    stopped = [t for t in a.traces if t.stopped_ns]
    if stopped:
        out.append(
            "%d process(es) could not record all their events (%s): the figures miss what they "
            "did after that" % (len(stopped), ", ".join(sorted({t.stopped_why for t in stopped})))
        )
    beyond = beyond_traces(a)
    if beyond and beyond["denials"]:
        out.append(
            "the budget ledger refused %d allocation(s), the traces hold %d: a process "
            "could not record (its trace file could not be created or grow)"
            % (beyond["denials"] + a.model.counts.get("denied", 0), a.model.counts.get("denied", 0))
        )
    if beyond and beyond["peak_bytes"]:
        out.append(
            "the budget ledger saw %s in use at its peak (contexts included) while no "
            "allocation was traced: a process could not record" % format_bytes(beyond["peak_bytes"])
        )
    return out


def implausible(a: Analysis) -> list[str]:
    """Warnings for peaks no device could hold: beyond the device's total (from the traced
    memory queries or the sampler's NVML figures), or beyond PLAUSIBLE_MAX when no total is
    known. A flipped bit in an event's size reads as a plausible-looking wrong number."""
    from ..units import format_bytes

    totals: dict[int, int] = {}
    for q in a.model.meminfo:
        real = q.event[AUX2]
        if q.device >= 0 and 0 < real < PLAUSIBLE_MAX:
            totals[q.device] = max(totals.get(q.device, 0), real)
    for smp in a.td.samples():
        for d in smp.get("devices") or []:
            t = d.get("total")
            if isinstance(t, int) and 0 < t < PLAUSIBLE_MAX and d.get("index") is not None:
                totals.setdefault(int(d["index"]), t)
    out = []
    biggest = max(totals.values(), default=None)
    for dev, (peak, _ts) in sorted(a.model.device_peaks.items()):
        total = totals.get(dev, biggest)
        bound = total if total else PLAUSIBLE_MAX
        if peak > bound:
            out.append(
                "implausible: the traced peak on device %d, %s, is more than %s (%s); an event's "
                "size may be corrupt, so these figures should not be trusted"
                % (
                    dev,
                    format_bytes(peak),
                    format_bytes(bound),
                    "the device's total" if total else "any device holds",
                )
            )
    return out


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


def build_report(
    a: Analysis,
    at: str = "peak",
    by: str = "site",
    depth: int = 1,
    top: int = 10,
    device: int | None = None,
) -> Report:
    """The report: the --json output (docs/report-json.md). Each part is made by its own
    function below (and read by its own section of present/report.py). Its type is the
    schema's (documents.py; tests/unit/test_schemas.py validates what this builds)."""
    m = a.model
    _check_device(a, device)
    mom = a.moment(at, device)
    live = a.live(mom)
    total = live.bytes
    sites = a.sites(live, by, depth)
    end_live = m.groups_at_end(device)
    end_sites = a.sites(end_live, "site", depth)
    warnings = depth_note(lambda d: a.sites(live, by, d), depth, len(sites)) if by == "site" else []
    processes, truncated = _processes_json(a, live, warnings)
    limits = a.budget_limits()
    devices = _devices_json(a, live, device, limits)
    failed, denied = _failures_json(a, device, depth)
    mq = _memory_queries(a, device)
    obs = _observed_json(a, mom, device)
    sc = stack_counts(a.traces)
    lost = lost_json(a)
    warnings += _coverage_notes(a, mom, truncated, sc, lost)
    agg = aggregate_notes(a)  # --aggregate traces (and damaged ones): what they lack
    warnings.extend(agg["warnings"])
    budget = _budget_json(a, limits)
    c = m.counts
    argv = a.td.run.get("argv") or (a.traces[0].argv if a.traces else [])
    # one numbering of sites in every table: a site never freed keeps its number of the table
    # of the moment; one not in it is numbered after that table's sites
    numbers = {x.key: i for i, x in enumerate(sites, 1)} if by == "site" else {}
    never = _never_freed_json(a, end_live, end_sites, top, numbers)
    r = {
        "schema": SCHEMA,
        "cudatrace_version": __version__,
        "path": str(a.path),
        "command": list(argv),
        "start_ns": a.start_ns,
        "start_time": a.td.run.get("start_time"),
        "duration": a.seconds(m.t_end) if m.n_events else 0.0,
        "run_seconds": a.run_seconds(),
        "exit_status": a.td.run.get("exit_status"),
        "versions": _versions(a),
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
        **_peak_json(a, device),
        "total_live_bytes": total,
        "total_live_count": live.count,
        "sites": [site_json(a, s, total, i) for i, s in enumerate(sites[:top], 1)],
        "more_sites": max(0, len(sites) - top),
        "never_freed": never,
        "failed": failed,
        "denied": denied,
        "processes": processes,
        "devices": devices,
        "host_pinned": {
            "peak_bytes": m.host_peak,
            "peak_time": a.seconds(m.host_peak_ts) if m.host_peak else None,
            "end_bytes": m.host_end,
            "allocs": c.get("host_allocs", 0),
        },
        "memory_queries": mq,
        "observed": obs,
        "budget": budget,
        "counts": {**c, **sc},
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


def _check_device(a: Analysis, device: int | None) -> None:
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


def _peak_json(a: Analysis, device: int | None) -> dict[str, Any]:
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


def _never_freed_json(
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


def _ended_seen(t: Trace) -> bool:
    """A trace with no exit record of a process the launcher saw end (not an image exec
    replaced, not one whose trace stopped early)."""
    return bool(not t.complete and t.exit_seen_ns and t.status != "exec" and not t.stopped_ns)


def _processes_json(a: Analysis, live: Groups, warnings: list[Any]) -> tuple[list[Any], list[Any]]:
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


def _devices_json(
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


def _failures_json(a: Analysis, device: int | None, depth: int) -> tuple[list[Any], list[Any]]:
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


def _observed_json(a: Analysis, mom: dict[str, Any], device: int | None) -> dict[str, Any]:
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


def _coverage_notes(
    a: Analysis, mom: dict[str, Any], truncated: list[Any], sc: dict[str, Any], lost: list[Any]
) -> list[Any]:
    """What the report cannot see, or sees with a caveat: the notes under it."""
    m = a.model
    warnings: list[str] = []
    warnings.extend(unrecorded(a))
    warnings.extend(n for t in a.traces for n in t.notes)  # sealed chunks lost, sidecar damage
    c = m.counts
    if c.get("unmatched_frees"):
        warnings.append(
            "%d free(s) matched no traced allocation (memory allocated before tracing "
            "began, or through a path not hooked)" % c["unmatched_frees"]
        )
    if c.get("reused"):
        warnings.append(
            "%d allocation(s) returned an address still live in the trace (its free "
            "was not seen): the older one is counted as freed then" % c["reused"]
        )
    if c.get("unsorted_traces"):
        warnings.append(
            "%d trace file(s) had events out of time order (threads publishing out "
            "of order; a free is stamped before its driver call); they were replayed sorted "
            "by time" % c["unsorted_traces"]
        )
    if any(t.stack_depth == 0 for t in a.traces):
        warnings.append(
            "stacks were off (--stack-depth 0) in %d trace file(s): no call sites there"
            % sum(1 for t in a.traces if t.stack_depth == 0)
        )
    warn = stack_cache_note(sc)
    if warn:
        warnings.append(warn)
    if a.symbolizer is None:
        warnings.append("no symbolizer: frames are shown as module+offset")
    else:
        w = getattr(a.symbolizer, "warnings", None)
        for line in (w() if callable(w) else [])[:10]:
            warnings.append(f"symbols: {line}")
    for e in a.stacks.errors[:5]:
        warnings.append(f"symbolizing {e}")
    if mom["kind"] == "time" and m.n_events and mom["ts_ns"] > m.t_end:
        warnings.append(
            f"--at {mom['spec']} is after the last event ({a.seconds(m.t_end):.3f} s): what is "
            "shown was live at the end"
        )
    if getattr(a.td, "bad_samples", 0):
        warnings.append("%d malformed line(s) of samples*.jsonl were skipped" % a.td.bad_samples)
    warnings.extend(implausible(a))
    if lost:
        warnings.append(
            "%d process(es) lost events when their trace could not be written (see Events "
            "lost): memory they freed after that moment is still counted as live" % len(lost)
        )
    if truncated and mom["kind"] == "end":
        warnings.append(
            "truncated traces end where the process stopped writing: what is live "
            "at their end may have been freed later, unseen"
        )
    return warnings


def _budget_json(a: Analysis, limits: dict[int, int]) -> dict[str, Any] | None:
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


def stack_counts(traces: Sequence[Trace]) -> dict[str, int]:
    """How the shim took the events' stacks, summed over the trace files (header counters)."""
    return {
        "stack_unwinds_full": sum(getattr(t, "stack_unwinds_full", 0) for t in traces),
        "stack_cache_hits": sum(getattr(t, "stack_cache_hits", 0) for t in traces),
    }


def stack_cache_note(
    sc: dict[str, Any], min_events: int = 200, min_rate: float = 0.9
) -> str | None:
    full, hits = sc["stack_unwinds_full"], sc["stack_cache_hits"]
    if full + hits < min_events or hits >= min_rate * (full + hits):
        return None
    return (
        f"stacks: {full} of {full + hits} events took a full unwind (stack cache hit rate "
        f"{100.0 * hits / (full + hits):.0f}%): the call sites did not repeat, or their frames are "
        "ones the cache does not describe; each such event costs a libgcc unwind (docs/aarch64.md)"
    )


def _same_site(a: Analysis, x: Alloc, s: Site, depth: int) -> bool:
    fr = a.stacks.site_frames(x.trace, x.stack)[:depth] if x.stack else []
    return tuple(f.key() for f in fr) == s.key


def _memory_queries(a: Analysis, device: int | None) -> dict[str, Any]:
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
