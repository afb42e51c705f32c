"""A run loaded: one trace directory or .ctrace file, or several read as one run of many ranks
(docs/ranks.md): refused where they are separate runs, put on one clock where they ran on
several hosts. Every error a ReportError naming what is wrong."""

from __future__ import annotations

import json
import time
from array import array
from pathlib import Path
from typing import Any, Union

from ... import native, tracedir
from ...errors import CudatraceError
from ...units import shell_quote
from .aggregate import apply_snapshots
from .rundir import TraceDir, read_dir, read_dirs, run_dirs
from .tags import tag_of
from .trace import Trace, TraceError, host_of, layout, read_trace


class ReportError(CudatraceError):
    """A trace that cannot be reported on: exit status 2, with a message naming the file."""


# a trace directory or .ctrace file, or several (one run of many ranks)
PathArg = Union[str, Path, "list[Path]", "list[str]", "tuple[Path, ...]"]


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
