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
from pathlib import Path

from .. import tracedir

CLEAR = "\033[2J\033[1;1H"  # the screen cleared, the cursor home (as click.clear)


def run_ended(path) -> tuple[bool, str]:
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
        return False, "the run is still going"
    try:
        from ..analyze.trace import read_dir, read_trace

        traces = [read_trace(p)] if p.is_file() else read_dir(p).traces
    except Exception:
        return False, "no readable trace yet"
    if traces and all(t.complete for t in traces):
        return True, "every traced process has exited (no run.json)"
    return False, "no run.json; some traced process has not exited"


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except Exception:
        return False


def _show(text: str, head: str, out, tty: bool) -> None:
    if tty:
        out.write(CLEAR + head + "\n\n" + text)
    else:
        out.write(f"==== {head}\n{text}")
    if not text.endswith("\n"):
        out.write("\n")
    out.flush()


def loop(
    render,
    head,
    ended=lambda: (False, ""),
    interval: float = 1.0,
    out=None,
    max_renders: int | None = None,
) -> int:
    """Render until Ctrl-C, or until ended() says so (then one last render). render() gives
    the text; head(ended, why) the line above it."""
    out = out or sys.stdout
    tty = _is_tty(out)
    n = 0
    try:
        while True:
            done, why = ended()
            _show(render(), head(done, why), out, tty)
            n += 1
            if done or (max_renders is not None and n >= max_renders):
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        out.write("\n")
        return 0
