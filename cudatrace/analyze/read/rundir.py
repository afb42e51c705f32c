"""A run's trace directory read whole: one file per traced process image, `<pid>.<n>.ctrace`
(each read by trace.read_trace), plus the launcher's `run.json` and `samples.jsonl`, each line and
key checked; `read_dirs` reads several directories (one per host or launch, or a folder of them:
`run_dirs`) as one run (docs/ranks.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import tracedir
from ...units import lossless_data, shell_quote
from .trace import Trace, TraceError, read_trace


@dataclass
class TraceDir:
    path: Path
    traces: list[Trace]
    run: dict[str, Any]
    errors: list[str]

    bad_samples: int = 0
    # a run of several trace directories (read_dirs): each directory and its run.json
    dirs: list[Path] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def samples(self) -> list[dict[str, Any]]:
        """The sampler's lines that are well formed, from every sample file there (an
        --aggregate run's bounded set: tracedir.py), in time order, each sample once; others
        are skipped and counted (bad_samples): a line cut by a crash, or a file edited by
        hand."""
        seen: dict[int, dict[str, Any]] = {}
        self.bad_samples = 0
        if len(self.dirs) > 1:  # each host sampled its own devices, on its own clock
            return []
        for name in tracedir.SAMPLE_FILES:
            p = self.path / name
            try:
                text = p.read_text(errors="replace") if p.is_file() else ""
            except OSError:
                text = ""
            for line in text.splitlines():
                try:
                    s = json.loads(line)
                except ValueError:
                    s = None
                if _valid_sample(s):
                    seen.setdefault(s["t"], s)
                else:
                    self.bad_samples += 1
        return [seen[t] for t in sorted(seen)]


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _valid_sample(s: object) -> bool:
    if not isinstance(s, dict) or not _int(s.get("t")):
        return False
    if not isinstance(s.get("pids", []), list) or not all(_int(x) for x in s.get("pids", [])):
        return False
    for k in ("mem_available", "tree_rss"):
        if s.get(k) is not None and not _int(s[k]):
            return False
    devs = s.get("devices")
    if devs is not None and not (
        isinstance(devs, list)
        and all(
            isinstance(d, dict)
            and all(_int(d.get(k)) or d.get(k) is None for k in ("index", "total", "free", "used"))
            for d in devs
        )
    ):
        return False
    tdb = s.get("tree_device_bytes")
    if tdb is not None and not (
        isinstance(tdb, dict) and all(isinstance(k, str) and _int(v) for k, v in tdb.items())
    ):
        return False
    return True


# run.json keys the analysis reads, and the types they must have (None is always allowed)
_RUN_TYPES: dict[str, type | tuple[type, ...]] = {
    "argv": list,
    "executable": str,
    "cwd": str,
    "dir": str,
    "stack_depth": int,
    "budget": dict,
    "group": str,
    "on_exceed": str,
    "start_monotonic_ns": int,
    "start_time": (int, float),
    "returncode": int,
    "exit_status": int,
    "end_monotonic_ns": int,
    "end_time": (int, float),
    "budget_aborted": bool,
    "sampler": dict,
    "ledger_final": dict,
    "pid": int,
    "exits": list,
}


def _valid_run(obj: object) -> tuple[dict[str, Any], list[str]]:
    """run.json checked like a trace: a JSON object whose known keys have their types; what
    does not fit is dropped and said."""
    if not isinstance(obj, dict):
        return {}, [
            f"run.json is not a JSON object ({type(obj).__name__}); its figures are ignored"
        ]
    bad = [
        k
        for k, t in _RUN_TYPES.items()
        if obj.get(k) is not None
        and (not isinstance(obj[k], t) or (t is int and isinstance(obj[k], bool)))
    ]
    if isinstance(obj.get("argv"), list) and not all(isinstance(a, str) for a in obj["argv"]):
        bad.append("argv")
    return {k: v for k, v in obj.items() if k not in bad}, (
        ["run.json: ignored malformed {}".format(", ".join(sorted(set(bad))))] if bad else []
    )


def trace_files(path: Path) -> list[Path]:
    return sorted(
        path.glob("*.ctrace"),
        key=lambda p: tuple(int(x) for x in p.name.split(".")[:2] if x.isdigit()) or (0,),
    )


def read_dir(path: str | os.PathLike[str]) -> TraceDir:
    """Read a trace directory (or a single .ctrace file). Unreadable files are reported in errors."""
    path = Path(path)
    if path.is_file():
        return TraceDir(path.parent, [read_trace(path)], {}, [])
    if not path.is_dir():
        raise TraceError(f"{path}: no such trace directory or file")
    traces, errors = [], []
    for p in trace_files(path):
        try:
            traces.append(read_trace(p))
        except TraceError as e:
            errors.append(str(e))
    run: dict[str, Any] = {}
    rp = path / tracedir.RUN
    if rp.exists():
        try:
            run, why = _valid_run(lossless_data(json.loads(rp.read_text())))
            errors += why
        except (ValueError, OSError) as e:
            errors.append(f"run.json unreadable: {e}")
    if not traces and not errors:
        raise TraceError(f"{path} holds no trace files (*.ctrace)")
    # An image that called exec after using CUDA writes no exit record; when the new image of the
    # same pid wrote a file too, the earlier one ended by exec, not by a kill.
    later: dict[int, int] = {}
    for t in traces:
        later[t.pid] = max(later.get(t.pid, -1), t.exec_index)
    for t in traces:
        if t.status == "truncated" and t.exec_index < later[t.pid]:
            t.status = "exec"
    _exits_seen(traces, run.get("exits") or [])
    return TraceDir(path, traces, run, errors)


def _exits_seen(traces: list[Trace], exits: list[Any]) -> None:
    """The launcher's record of when processes exited (record/exits.py), on their traces,
    matched by pid and start time."""
    seen = {}
    for x in exits:
        if isinstance(x, dict) and all(isinstance(x.get(k), int) for k in _EXIT_KEYS):
            seen[(x["pid"], x["start_ticks"])] = x["exit_monotonic_ns"]
    for t in traces:
        t.exit_seen_ns = max(0, seen.get((t.pid, t.start_ticks), 0))


_EXIT_KEYS = ("pid", "start_ticks", "exit_monotonic_ns")


# ---- a run of several trace directories (docs/ranks.md) ------------------------------------


def run_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """The trace directories a path names: itself (a trace directory or a .ctrace file), or,
    for a directory that holds no trace file but trace directories (one per host: `-o
    run/$(hostname)`), each of those, sorted by name."""
    p = Path(path)
    if not p.is_dir() or any(p.glob("*.ctrace")):
        return [p]
    subs = sorted(
        d for d in p.iterdir() if d.is_dir() and not d.is_symlink() and any(d.glob("*.ctrace"))
    )
    if subs and (p / SWEEP_JSON).is_file():
        raise TraceError(_sweep_folder(p, subs))
    return subs or [p]


SWEEP_JSON = "sweep.json"  # what `cudatrace sweep` writes beside its runs' trace directories


def _sweep_folder(p: Path, subs: list[Path]) -> str:
    """What to run on a sweep's folder, which holds separate runs (one per value), not the
    ranks of one run."""
    q = shell_quote
    out = [
        f"{p} is a sweep (`cudatrace sweep` wrote {SWEEP_JSON} there): its {len(subs)} trace "
        "directories are separate runs of the command, one per value, not the ranks of one run.",
        f"  the laws of the sweep:  cudatrace sweep --from {q([str(p)])}",
        f"  one run:                cudatrace report {q([str(subs[0])])}",
    ]
    if len(subs) > 1:
        out.append(f"  two runs compared:      cudatrace diff {q([str(subs[0]), str(subs[-1])])}")
    return "\n".join(out)


def read_dirs(paths: Iterable[str | os.PathLike[str]]) -> TraceDir:
    """Several trace directories read as one run: the traces of all, in the order given, each
    noting its directory (Trace.source); every error named with its directory. Processes on
    different hosts are put on one clock by load.align_clocks, which load() calls. A path that
    does not exist is refused first, before any is read."""
    given = [Path(p) for p in paths]
    for p in given:
        if not p.exists():
            raise TraceError(f"{p}: no such trace directory or file")
    dirs = [d for p in given for d in run_dirs(p)]
    if len(dirs) == 1:
        return read_dir(dirs[0])
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise TraceError("the same trace directory is named twice")
    traces: list[Trace] = []
    errors: list[str] = []
    runs: list[dict[str, Any]] = []
    for d in dirs:
        try:
            td = read_dir(d)
        except TraceError as e:
            errors.append(str(e))
            runs.append({})
            continue
        for t in td.traces:
            t.source = str(d)
        traces += td.traces
        errors += [f"{d}: {e}" for e in td.errors]
        runs.append(td.run)
    run = dict(runs[0]) if runs else {}
    return TraceDir(dirs[0], traces, run, errors, dirs=dirs, runs=runs)
