"""The loop of `report --watch` and `status --watch` (their bodies are in commands/): the text
re-rendered every second.

On a terminal the screen is cleared before each render; elsewhere (a pipe, a log file) each
render follows the last under a line with the time. `report --watch` stops on Ctrl-C, or once
the run has ended (run.json carries its exit status; without a run.json, every trace file has
its exit record) after one last render; `status --watch` stops on Ctrl-C.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from .. import tracedir

CLEAR = "\033[2J\033[1;1H"  # the screen cleared, the cursor home (as click.clear)


def run_ended(path: str | Path) -> tuple[bool, str]:
    """(ended, why): whether the run that writes into `path` is over."""
    p = Path(path)
    run_json = (p.parent if p.is_file() else p) / tracedir.RUN
    if run_json.is_file():
        try:
            run = json.loads(run_json.read_text())
        except (OSError, ValueError):
            return False, "run.json is being written"
        if "exit_status" in run or "end_monotonic_ns" in run:
            st = run.get("exit_status")
            return True, "the run ended%s" % (f" with exit status {st}" if st is not None else "")
        if not _launcher_alive(run):
            return True, "the launcher is gone (killed?): the run ended without an exit status"
        return False, "the run is still going"
    try:
        from ..analyze.read.trace import read_dir, read_trace

        traces = [read_trace(p)] if p.is_file() else read_dir(p).traces
    except Exception:
        return False, "no readable trace yet"
    if traces and all(t.complete for t in traces):
        return True, "every traced process has exited (no run.json)"
    return False, "no run.json; some traced process has not exited"


def _launcher_alive(run: Mapping[str, object]) -> bool:
    """Whether the launcher that writes this run.json still runs (True when unknown: an older
    run.json, or one written in another pid namespace that this /proc cannot judge)."""
    import os

    pid, start = run.get("launcher_pid"), run.get("start_monotonic_ns")
    if not isinstance(pid, int) or not isinstance(start, int) or pid <= 0:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read().decode(errors="replace")
        fields = s[s.rindex(")") + 2 :].split()
    except OSError:
        return False  # no such process: gone
    except ValueError:
        return True
    if fields[0] in ("Z", "X"):
        return False
    try:  # a pid reused by a process that started after the run: not the launcher
        started_ns = int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError, OSError):
        return True
    return started_ns <= start + 1_000_000_000


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except Exception:
        return False


def _show(text: str, head: str, out: TextIO, tty: bool) -> None:
    if tty:
        out.write(CLEAR + head + "\n\n" + text)
    else:
        out.write(f"==== {head}\n{text}")
    if not text.endswith("\n"):
        out.write("\n")
    out.flush()


def loop(
    render: Callable[[], str],
    head: Callable[[bool, str], str],
    ended: Callable[[], tuple[bool, str]] = lambda: (False, ""),
    interval: float = 1.0,
    out: TextIO | None = None,
    max_renders: int | None = None,
) -> int:
    """Render until Ctrl-C, or until ended() says so (then one last render). render() gives
    the text; head(ended, why) the line above it. Returns the number of renders shown."""
    out = out or sys.stdout
    tty = _is_tty(out)
    n = 0
    try:
        while True:
            done, why = ended()
            _show(render(), head(done, why), out, tty)
            n += 1
            if done or (max_renders is not None and n >= max_renders):
                return n
            time.sleep(interval)
    except KeyboardInterrupt:
        out.write("\n")
        return n
