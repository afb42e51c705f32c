"""When traced processes ended, as the launcher saw it (run.json "exits").

A process killed by SIGKILL (or one that crashed) writes no exit record, so its trace cannot
say when its memory went back to the device. This watcher opens a pidfd for every process that
starts a trace file in the run's directory and notes the moment the kernel reports its exit,
on the clock the traces use (CLOCK_MONOTONIC). The kernel closes a process's files, the CUDA
driver's among them, before it reports the exit, so the memory was gone by then: the replay
ends such a process's memory at that moment instead of holding it to the run's end
(analyze/replay/model.py process_ends). The moment is late by the watcher's wake-up (well under a
millisecond on an idle machine, more under load), never early.

A process is named by pid and start time (/proc/PID/stat field 22, as the trace header names
it), read before and after its pidfd is opened, so a reused pid is never taken for it. A process
that ended before the watcher saw its file (it scans every `interval` seconds) gets no entry:
its memory then counts to the run's end, as before. So does one beyond the watcher's share of
the launcher's descriptors (half its limit, leaving at least 128 for everything else).
"""

from __future__ import annotations

import os
import resource
import select
import time
from pathlib import Path
from typing import TypedDict

from .worker import Worker


class ProcessExit(TypedDict):
    """A traced process's end as the launcher saw it (run.json "exits")."""

    pid: int
    start_ticks: int
    exit_monotonic_ns: int


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (the process's start, in clock ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class ExitWatcher(Worker):
    """Notes when each traced process of `out` exits; `exits()` lists them for run.json."""

    def __init__(self, out: Path, interval: float = 0.05):
        super().__init__("cudatrace-exits")
        self.out = Path(out)
        self.interval = interval
        self.known: set[int] = set()  # pids seen (watched, or found gone)
        self.fds: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, start ticks)
        self.ended: list[ProcessExit] = []
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
        self.cap = max(0, min(soft // 2, soft - 128))  # pidfds held at once, at most
        self._poll = select.poll()

    @staticmethod
    def available() -> bool:
        return hasattr(os, "pidfd_open")

    def stop(self) -> None:
        self._halt()
        self._reap(0)
        for fd in list(self.fds):
            os.close(fd)
        self.fds.clear()

    def exits(self) -> list[ProcessExit]:
        return list(self.ended)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._scan()
            self._reap(int(self.interval * 1000))

    def _scan(self) -> None:
        try:
            names = os.listdir(self.out)
        except OSError:
            return
        for name in names:
            head = name.split(".", 1)[0]
            if not name.endswith(".ctrace") or not head.isdigit() or int(head) in self.known:
                continue
            pid = int(head)
            self.known.add(pid)
            self._watch(pid)

    def _watch(self, pid: int) -> None:
        if len(self.fds) >= self.cap:
            return
        before = start_ticks(pid)
        if before is None:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        if start_ticks(pid) != before:  # the pid was reused in between: not our process
            os.close(fd)
            return
        self.fds[fd] = (pid, before)
        self._poll.register(fd, select.POLLIN)

    def _reap(self, timeout_ms: int) -> None:
        if not self.fds:
            if timeout_ms:
                self._stop.wait(timeout_ms / 1000)
            return
        for fd, _ev in self._poll.poll(timeout_ms):
            now = time.monotonic_ns()
            pid, ticks = self.fds.pop(fd)
            self._poll.unregister(fd)
            os.close(fd)
            self.ended.append({"pid": pid, "start_ticks": ticks, "exit_monotonic_ns": now})
            self.known.add(pid)
