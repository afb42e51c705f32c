"""Processes a test starts, never left behind: the one way tests start a program they do not
wait for at once (`popen`), stop one (`stop`), or run one to its end with a time limit (`run`).

subprocess leaves a process behind in three ways: `Popen.communicate(timeout=)` and
`Popen.wait(timeout=)` raise on the timeout and leave the process running; a test that fails
before its `terminate()` leaves it running; and `subprocess.run(timeout=)` kills its child alone,
not the program that child started (a launcher's command, a shell's jobs). A test once hung
here: `cudatrace run` ignored SIGTERM and pytest left it and its command alive.

So every process `popen` starts is remembered until the test ends: the autouse fixture
`no_process_left` (tests/conftest.py) kills what is still running then, its descendants with it
(read from /proc before the kill, so a command reparented by its parent's death is caught too).
`stop` and `run` kill the whole tree when their time is up, then fail saying so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

_started: list[subprocess.Popen] = []  # this test's processes (cleared by leftovers())


def popen(args: Any, **kw: Any) -> subprocess.Popen:
    """subprocess.Popen, remembered: killed with its descendants when the test ends."""
    p = subprocess.Popen(args, **kw)
    _started.append(p)
    return p


def descendants(pid: int) -> list[int]:
    """pid's descendants (children first, then theirs), from /proc; [] once it is gone."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop(0)
        for kid in _children(p):
            if kid not in out:
                out.append(kid)
                todo.append(kid)
    return out


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return kids


def kill_tree(p: subprocess.Popen) -> list[int]:
    """SIGKILL p and every descendant it still has (stopped first, so none starts another
    meanwhile) and reap p; returns the pids that were still running."""
    if p.poll() is not None and not descendants(p.pid):
        return []
    tree = ([p.pid] if p.poll() is None else []) + descendants(p.pid)
    for pid in tree:
        _signal(pid, signal.SIGSTOP)
    tree += [pid for pid in descendants(p.pid) if pid not in tree]
    for pid in tree:
        _signal(pid, signal.SIGKILL)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return tree


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def communicate(p: subprocess.Popen, timeout: float, what: str = "") -> tuple[Any, Any]:
    """p.communicate(timeout=), but a process still running then is killed with its tree,
    and the test fails saying what did not end."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p)
        out, err = p.communicate()
        raise AssertionError(
            f"{what or _name(p)} did not end within {timeout:g} s; killed with its "
            f"descendants\nstdout:\n{_text(out)}\nstderr:\n{_text(err)}"
        ) from None


def stop(
    p: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60, what: str = ""
) -> tuple[Any, Any]:
    """Send sig to p (if it still runs) and wait for its end and output (communicate)."""
    if p.poll() is None:
        _signal(p.pid, sig)
    return communicate(p, timeout, what)


def wait(p: subprocess.Popen, timeout: float, what: str = "") -> int:
    """p.wait(timeout=), killing its tree and failing when it does not end in time."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p)
        raise AssertionError(
            f"{what or _name(p)} did not end within {timeout:g} s; killed with its descendants"
        ) from None


def readline(p: subprocess.Popen, stream: Any = None, timeout: float = 60, what: str = "") -> Any:
    """One line of p's stdout (or of stream, one of p's pipes), as stream.readline() gives it;
    a program that prints none within timeout seconds is killed with its tree (which ends the
    read) and the test fails saying so."""
    stream = p.stdout if stream is None else stream
    box: list[Any] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        kill_tree(p)
        reader.join(10)
        raise AssertionError(
            f"{what or _name(p)} printed no line within {timeout:g} s; killed with its descendants"
        )
    return box[0]


def lines(p: subprocess.Popen, stream: Any = None, timeout: float = 60) -> Iterator[Any]:
    """`for line in p.stdout`, each line within timeout seconds (readline): ends at the end of
    the stream."""
    while line := readline(p, stream, timeout):
        yield line


def said(p: subprocess.Popen) -> Any:
    """What p wrote to its stderr pipe, for a failure's message: read to its end once p is over
    (a running p is killed with its tree first; a read would wait for it for ever)."""
    if p.poll() is None:
        kill_tree(p)
    return p.stderr.read() if p.stderr is not None else ""


def run(args: Any, timeout: float, **kw: Any) -> subprocess.CompletedProcess:
    """subprocess.run(args, timeout=): on the timeout the whole tree is killed, not the child
    alone, and subprocess.TimeoutExpired is raised as subprocess.run raises it."""
    inp = kw.pop("input", None)
    if kw.pop("capture_output", False):
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    if inp is not None:
        kw["stdin"] = subprocess.PIPE
    check = kw.pop("check", False)
    p = popen(args, **kw)
    try:
        out, err = p.communicate(input=inp, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        kill_tree(p)
        e.output, e.stderr = p.communicate()
        raise
    finally:
        if p in _started and p.returncode is not None:
            _started.remove(p)
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if check:
        r.check_returncode()
    return r


def leftovers() -> list[str]:
    """Kill what this test started and left running (and its descendants); forget them all.
    Returns one line for each that was still running."""
    left = []
    while _started:
        p = _started.pop()
        killed = kill_tree(p)
        if killed:
            left.append(f"{_name(p)}: pids {killed}")
    return left


def _name(p: subprocess.Popen) -> str:
    args = p.args if isinstance(p.args, (list, tuple)) else [p.args]
    return " ".join(os.path.basename(str(a)) if i == 0 else str(a) for i, a in enumerate(args))[
        :200
    ]


def _text(data: Any) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def wait_until(pred: Any, timeout: float, what: str, step: float = 0.02) -> Any:
    """pred()'s first true value within timeout seconds, else the test fails saying what."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(step)
