"""record/exits.py: the launcher notes when a traced process exits (a kill leaves no exit
record), never before it did, and never for another process that took a reused pid."""

from __future__ import annotations

import time

from cudatrace.record.exits import ExitWatcher, start_ticks
from support import children


def test_a_killed_process_exit_is_noted_after_the_kill(tmp_path):
    child = children.popen(["sleep", "60"])
    (tmp_path / f"{child.pid}.0.ctrace").write_bytes(b"")
    (tmp_path / "999999999.0.ctrace").write_bytes(b"")  # no such process: nothing noted
    w = ExitWatcher(tmp_path, interval=0.01)
    w.start()
    try:
        deadline = time.monotonic() + 10
        while not w.fds and time.monotonic() < deadline:
            time.sleep(0.01)
        ticks = start_ticks(child.pid)
        assert ticks is not None
        killed_at = time.monotonic_ns()
        child.kill()
        child.wait()
        deadline = time.monotonic() + 10
        while not w.exits() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        w.stop()
    assert w.exits() == [
        {
            "pid": child.pid,
            "start_ticks": ticks,
            "exit_monotonic_ns": w.exits()[0]["exit_monotonic_ns"],
        }
    ]
    assert w.exits()[0]["exit_monotonic_ns"] >= killed_at
    assert not w.fds  # every pidfd closed


def test_a_reused_pid_is_not_taken_for_the_traced_process(tmp_path, monkeypatch):
    # the start time read before and after the pidfd is opened differ: another process
    child = children.popen(["sleep", "60"])
    try:
        seq = iter([1, 2])
        monkeypatch.setattr("cudatrace.record.exits.start_ticks", lambda pid: next(seq))
        w = ExitWatcher(tmp_path)
        w._watch(child.pid)
        assert not w.fds
    finally:
        child.kill()
        child.wait()


def test_the_watcher_keeps_to_its_share_of_descriptors(tmp_path):
    child = children.popen(["sleep", "60"])
    try:
        w = ExitWatcher(tmp_path)
        assert 0 < w.cap < 1 << 20
        w.cap = 0
        w._watch(child.pid)
        assert not w.fds
        w.cap = 1
        w._watch(child.pid)
        assert len(w.fds) == 1
        w.stop()
        assert not w.fds
    finally:
        child.kill()
        child.wait()
