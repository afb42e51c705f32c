"""What runs being traced hold right now: live bytes per device and their top sites, for
`cudatrace metrics --traces DIR...` (docs/metrics.md).

A DIR is a trace directory (it holds .ctrace files or a run.json) or a folder of them (each
subfolder that is one). A run is "being traced" until its run.json says it ended, or, whatever
run.json says (a launcher killed before it could write its end), while its launcher or one of
its traced processes lives: a writer holds a lock on its trace while it lives (the shim's
CT_FH_LIVE_LOCK, told in any pid namespace); a launcher holds one on the directory. A process
that is gone without its exit record ends there: its memory is no longer counted.

Reading a trace never touches the traced program: the files are read as they are, holes never
faulted (analyze/read/unseal.py). `signature` tells, without analyzing, whether anything was written
since: the chunks below a trace's `sealed_chunks` are never written again, so it reads the rest
(a few chunks) and the sizes.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import native, sidecar, tracedir
from ...record_types import TopRun, TopRunDevice, TopSite
from ...units import lossless
from ..read.rundir import TraceDir, read_dir, trace_files
from ..read.trace import C

if TYPE_CHECKING:
    from ...symbols import Symbolizer

LABEL_MAX = 120  # characters of a site label (longer ones are cut, with "...")
OTHER = "other"


def run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every trace directory named by or directly under paths, in name order, each once (two
    spellings of one directory are one)."""
    out: dict[Path, Path] = {}
    for p in map(Path, paths):
        found = [p] if _is_run(p) else []
        if not found and p.is_dir():
            try:
                found = [q for q in sorted(p.iterdir()) if q.is_dir() and _is_run(q)]
            except OSError:
                continue
        for q in found:
            try:
                key = q.resolve()
            except OSError:
                key = q
            out.setdefault(key, q)
    return list(out.values())


def _is_run(p: Path) -> bool:
    try:
        return p.is_dir() and ((p / tracedir.RUN).is_file() or bool(trace_files(p)))
    except OSError:
        return False


def run_info(p: Path) -> dict[str, Any]:
    """run.json (or {} while it is missing or being written)."""
    try:
        info = json.loads((p / tracedir.RUN).read_text(errors="surrogateescape"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _header(fd: int) -> dict[str, int]:
    ffi = native.ffi()
    head = os.pread(fd, 256, 0)

    def u(name: str, fmt: str = "<I") -> int:
        v: int = struct.unpack_from(fmt, head, ffi.offsetof("struct ct_file_header", name))[0]
        return v

    if len(head) < 256 or head[:8] != b"CUDATRC\0" or u("version") < 3:
        return {}
    return {
        "flags": u("flags"),
        "pid": u("pid", "<i"),
        "ticks": u("process_start_ticks", "<Q"),
        "mark": u("sealed_chunks"),
        "chunk": u("chunk_size"),
    }


def writer_alive(path: Path) -> bool:
    """Whether the process writing the trace file lives: its lock (CT_FH_LIVE_LOCK), else its
    pid and start time (a trace of an older shim, this pid namespace only)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        h = _header(fd)
        if not h:
            return False
        if h["flags"] & C()["CT_FH_LIVE_LOCK"]:
            _ffi, lib = native.tools()
            return lib.ct_file_locked(fd) != 0  # -1 (cannot tell): taken as alive
        return _pid_alive(h["pid"], h["ticks"])
    finally:
        os.close(fd)


def _pid_alive(pid: int, ticks: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat.rsplit(b")", 1)[1].split()[19]) == ticks
    except (OSError, IndexError, ValueError):
        return False


def _launcher_alive(p: Path) -> bool | None:
    """Whether a launcher holds the directory (its flock on .cudatrace.lock); None: no lock
    file (a run without a launcher)."""
    try:
        fd = os.open(p / tracedir.LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # a lock taken here goes with the descriptor
    return False


def running(p: Path, info: dict[str, Any] | None = None) -> bool:
    """Whether the run writing into p is still going."""
    info = run_info(p) if info is None else info
    if "exit_status" in info or "end_monotonic_ns" in info:
        return False
    if info and _launcher_alive(p):
        return True
    return any(writer_alive(f) for f in trace_files(p))


def signature(p: Path) -> tuple[Any, ...]:
    """Changes whenever anything is written into the run's traces: per file, its size, its
    sidecar's size, its sealed mark and a checksum of what lies above the mark (the chunks the
    writer may still write; read with pread, holes skipped)."""
    out = []
    for f in trace_files(p):
        try:
            fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            h = _header(fd)
            start = h.get("mark", 0) * h.get("chunk", 0)
            crc = zlib.crc32(os.pread(fd, 256, 0))
            off = max(start, 256)
            while off < st.st_size:
                data = os.pread(fd, min(1 << 20, st.st_size - off), off)
                if not data:
                    break
                crc = zlib.crc32(data, crc)
                off += len(data)
            try:
                side = os.stat(sidecar.path_of(f)).st_size
            except OSError:
                side = -1
            out.append((f.name, st.st_size, side, h.get("mark"), crc, writer_alive(f)))
        finally:
            os.close(fd)
    return tuple(out)


def end_the_gone(td: TraceDir) -> None:
    """Traces without an exit record whose writer is gone (killed) end now: their memory is no
    longer live (the launcher's record of exits does the same for its own runs)."""
    now = time.monotonic_ns()
    for t in td.traces:
        if t.end is None and not t.exit_seen_ns and t.status != "exec" and not writer_alive(t.path):
            t.exit_seen_ns = now


def _cut(label: str) -> str:
    return label if len(label) <= LABEL_MAX else label[: LABEL_MAX - 3] + "..."


def command_of(info: dict[str, Any], td: TraceDir) -> str:
    """The run's program: run.json's argv, else the first traced process's."""
    argv = info.get("argv") or []
    if not argv and td.traces:
        argv = td.traces[0].argv or [td.traces[0].exe]
    return lossless(Path(str(argv[0])).name) if argv and argv[0] else ""


def figures(p: Path, top: int, symbolizer: Symbolizer | None = None) -> dict[str, Any]:
    """top_sites of the run as it is now, its processes that are gone ended."""
    td = read_dir(p)
    end_the_gone(td)
    return top_sites(p, top, symbolizer, td)


def top_sites(
    p: Path, top: int, symbolizer: Symbolizer | None = None, td: TraceDir | None = None
) -> dict[str, Any]:
    """{"run", "path", "command", "devices": [{"device", "gpu", "live", "sites"}]}: what the
    run holds now, per device (CUDA ordinal, and the physical device `gpu` it names in the
    processes that hold the memory: CUDA_VISIBLE_DEVICES's entry, an index or a UUID), its
    `top` largest sites by label and the rest summed under "other". Sites whose labels are
    equal (two stacks ending in one function) are summed, so every label appears once per
    device."""
    from ..read.tags import device_label
    from .analysis import Analysis

    info = run_info(p)
    if td is None:
        td = read_dir(p)
    a = Analysis(p, symbolize=symbolizer is not None, symbolizer=symbolizer, td=td)
    m = a.model
    devices = []
    # now: after the last event and every process end (a killed process's memory is not live)
    now = max(
        [m.t_end] + [t.exit_seen_ns for t in a.traces] + [t.end.ts_ns for t in a.traces if t.end]
    )
    end = m.groups_at(now)
    keys = sorted({(r[4], device_label(a.traces[r[0]], r[4])) for r in end.rows})
    for dev, gpu in keys:
        traces = {i for i, t in enumerate(a.traces) if device_label(t, dev) == gpu}
        groups = m.groups_at(now, dev).only(traces=traces)
        by_label: dict[str, int] = {}
        for s in a.sites(groups):
            lab = _cut(s.label(False))
            by_label[lab] = by_label.get(lab, 0) + s.bytes
        ranked = sorted(by_label.items(), key=lambda kv: (-kv[1], kv[0]))
        sites = dict(ranked[:top])
        rest = sum(b for _, b in ranked[top:])
        if rest or OTHER in sites:
            sites[OTHER] = sites.get(OTHER, 0) + rest
        devices.append({"device": dev, "gpu": gpu, "live": groups.bytes, "sites": sites})
    return {
        "run": lossless(p.name),
        "path": lossless(str(p)),
        "command": command_of(info, td),
        "devices": devices,
    }


class Runs:
    """The runs being traced, each as top_sites reads it now, analyzed again only when
    something was written into its traces since (signature): what `cudatrace top` asks once a
    second. A run that ended (or never ran) reads None."""

    def __init__(self, top: int, symbolizer: Symbolizer | None = None) -> None:
        self.top = top
        self.symbolizer = symbolizer
        self._seen: dict[Path, tuple[tuple[Any, ...], TopRun]] = {}

    def read(self, p: Path) -> TopRun | None:
        """The run in p now, or None once it is not running."""
        if not running(p):
            self._seen.pop(p, None)
            return None
        sig = signature(p)
        old = self._seen.get(p)
        if old is not None and old[0] == sig:
            return old[1]
        run = _top_run(p, self.top, self.symbolizer)
        self._seen[p] = (sig, run)
        return run

    def among(self, paths: Iterable[Path]) -> tuple[list[TopRun], list[str]]:
        """The runs being traced in paths (trace directories, or folders of them: run_dirs),
        each once, and what could not be read of them now (a run starting, a file being
        replaced: read again next time); the runs not among them are forgotten."""
        dirs = run_dirs(paths)
        out: list[TopRun] = []
        errors: list[str] = []
        for p in dirs:
            try:
                run = self.read(p)
            except Exception as e:
                errors.append(f"{lossless(str(p))}: cannot be read now: {e}")
                continue
            if run is not None:
                out.append(run)
        wanted = set(dirs)
        self._seen = {p: v for p, v in self._seen.items() if p in wanted}
        return out, errors


def _top_run(p: Path, top: int, symbolizer: Symbolizer | None) -> TopRun:
    """figures of the run in p as record_types.TopRun: sites the largest first, "other" last."""
    fig = figures(p, top, symbolizer)
    devices: list[TopRunDevice] = []
    for row in fig["devices"]:
        sites: dict[str, int] = dict(row["sites"])
        rest = sites.pop(OTHER, None)
        listed: list[TopSite] = [{"label": k, "bytes": v} for k, v in sites.items()]
        if rest is not None:
            listed.append({"label": OTHER, "bytes": rest})
        devices.append(
            {
                "device": row["device"],
                "gpu": str(row["gpu"] or ""),
                "live": row["live"],
                "sites": listed,
            }  # fmt: skip
        )
    return {"run": fig["run"], "path": fig["path"], "command": fig["command"], "devices": devices}
