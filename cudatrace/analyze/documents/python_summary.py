"""What the report says of Python in the traced processes (docs/python-frames.md)."""

from __future__ import annotations

from typing import Any

from ..read.trace import Trace


def python_summary(
    traces: list[Trace], stack_totals: dict[tuple[int, int], Any], view: str
) -> dict[str, Any] | None:
    """Python in the traced processes: versions, status, and device allocations with Python frames
    and without (by reason), from the model's totals per (trace, stack); `view` the stacks' view.
    None when no process ran Python."""
    from ...symbols import python as pyframes

    procs = [t for t in traces if "python.status" in t.info]
    if not procs:
        return None
    with_frames = 0
    without: dict[str, int] = {}
    for (ti, leaf), (count, _nbytes) in stack_totals.items():
        t = traces[ti]
        if "python.status" not in t.info:
            continue
        link = t.py_link(leaf)
        if link and link[0] == pyframes.LINK_FRAMES:
            with_frames += count
        else:
            why = (
                pyframes.WHY.get(link[1], f"reason {link[1]}")
                if link
                else "no stack recorded (stacks off or the stack table full)"
            )
            without[why] = without.get(why, 0) + count
    return {
        "view": view,
        "processes": [
            {
                "pid": t.pid,
                "version": t.info.get("python.version"),
                "status": t.info.get("python.status"),
            }
            for t in procs
        ],
        "allocs_with_frames": with_frames,
        "allocs_without_frames": without,
    }
