"""What runs being traced hold right now: live bytes per device and their top sites, for
`cudatrace metrics --traces DIR...` (docs/metrics.md).

A DIR is a trace directory (it holds .ctrace files or a run.json) or a folder of them (each
subfolder that is one). A run is "being traced" until its run.json says it ended; runs without a
run.json count as long as one of their traced processes has not exited. Reading a trace never
touches the traced program: the files are read as they are, sealed chunks only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import tracedir
from .trace import trace_files

if TYPE_CHECKING:
    from ..symbols import Symbolizer

LABEL_MAX = 120  # characters of a site label (longer ones are cut, with "...")
OTHER = "other"


def run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every trace directory named by or directly under paths, in name order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if _is_run(p):
            out.append(p)
        elif p.is_dir():
            try:
                subs = sorted(q for q in p.iterdir() if q.is_dir())
            except OSError:
                continue
            out += [q for q in subs if _is_run(q)]
    return list(dict.fromkeys(out))  # each once, in order


def _is_run(p: Path) -> bool:
    try:
        return p.is_dir() and ((p / tracedir.RUN).is_file() or bool(trace_files(p)))
    except OSError:
        return False


def run_info(p: Path) -> dict[str, Any]:
    """run.json (or {} while it is missing or being written)."""
    try:
        result: dict[str, Any] = json.loads((p / tracedir.RUN).read_text())
        return result
    except (OSError, ValueError):
        return {}


def running(p: Path, info: dict[str, Any] | None = None) -> bool:
    """Whether the run writing into p is still going."""
    info = run_info(p) if info is None else info
    if info:
        return not ("exit_status" in info or "end_monotonic_ns" in info)
    from .trace import read_dir

    try:
        traces = read_dir(p).traces
    except Exception:
        return False
    return bool(traces) and not all(t.complete for t in traces)


def signature(p: Path) -> tuple[Any, ...]:
    """Changes whenever a trace file of the run grows or appears."""
    out = []
    try:
        for f in trace_files(p):
            st = f.stat()
            out.append((f.name, st.st_size, st.st_mtime_ns))
    except OSError:
        pass
    return tuple(out)


def _cut(label: str) -> str:
    return label if len(label) <= LABEL_MAX else label[: LABEL_MAX - 3] + "..."


def top_sites(p: Path, top: int, symbolizer: Symbolizer | None = None) -> dict[str, Any]:
    """{"run", "command", "devices": {dev: {"live": bytes, "sites": {label: bytes}}}}: what the
    run holds now, per device, its `top` largest sites by label and the rest summed under
    "other". Sites whose labels are equal (two stacks ending in one function) are summed, so
    every label appears once per device."""
    from .analysis import Analysis

    info = run_info(p)
    a = Analysis(p, symbolize=symbolizer is not None, symbolizer=symbolizer)
    m = a.model
    devices: dict[int, dict[str, Any]] = {}
    devs = sorted({r[4] for r in m.groups_at_end(None).rows})
    for dev in devs:
        groups = m.groups_at_end(dev)
        by_label: dict[str, int] = {}
        for s in a.sites(groups):
            lab = _cut(s.label(False))
            by_label[lab] = by_label.get(lab, 0) + s.bytes
        ranked = sorted(by_label.items(), key=lambda kv: (-kv[1], kv[0]))
        sites = dict(ranked[:top])
        rest = sum(b for _, b in ranked[top:])
        if rest or OTHER in sites:
            sites[OTHER] = sites.get(OTHER, 0) + rest
        devices[dev] = {"live": groups.bytes, "sites": sites}
    argv = info.get("argv") or []
    command = Path(str(argv[0])).name if argv else ""
    return {"run": p.name, "path": str(p), "command": command, "devices": devices}
