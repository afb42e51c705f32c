"""`cudatrace node --enforce`: a process the watch found in breach is stopped, as the kernel's OOM
killer stops one of a cgroup over its limit: SIGTERM, then SIGKILL if it still runs after the
grace period. The process is held by a pidfd opened before its start time is checked, so a pid
reused in between is never signalled. The agent's own process, its parents and pid 1 are
never stopped.

Each stop is said (the reason, then how it ended and how long after the SIGTERM) and counted;
the agent posts the Event.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .. import procfs

GRACE_S = 5.0  # seconds between SIGTERM and SIGKILL


@dataclass
class Stopping:
    """A process being stopped."""

    pid: int
    start_ticks: int
    reason: str
    began: float  # time.monotonic() of the SIGTERM
    ended: float | None = None  # ... when it was seen gone
    how: str = ""  # "SIGTERM" or "SIGKILL"
    tag: tuple[str, ...] = ()  # the caller's (the agent's: gpu, UUID, kind)


def _protected() -> set[int]:
    """This process, its ancestors and pid 1."""
    out, pid = {1, os.getpid()}, os.getpid()
    while pid > 1:
        parent = procfs.parent_of(pid)
        if parent is None or parent in out:
            break
        out.add(parent)
        pid = parent
    return out


class Enforcer:
    def __init__(
        self,
        say: Callable[[str], None],
        grace: float = GRACE_S,
        proc: str = "/proc",
        on_end: Callable[[Stopping], None] | None = None,
    ):
        self.say = say
        self.grace = grace
        self.proc = proc
        self.on_end = on_end
        self.stopping: dict[tuple[int, int], Stopping] = {}
        self.done: list[Stopping] = []
        self._lock = threading.Lock()
        self._protected = _protected()

    def wait(self, timeout: float | None = None) -> None:
        """Until the stops under way have ended (a SIGKILLed process included)."""
        end = time.monotonic() + (self.grace + 65.0 if timeout is None else timeout)
        while time.monotonic() < end:
            with self._lock:
                if not self.stopping:
                    return
            time.sleep(0.05)

    def busy(self, pid: int, start_ticks: int) -> bool:
        with self._lock:
            return (pid, start_ticks) in self.stopping

    def stop(
        self, pid: int, start_ticks: int, reason: str, tag: tuple[str, ...] = ()
    ) -> Stopping | None:
        """SIGTERM now, SIGKILL after the grace period; None when it is not stopped (gone,
        protected, already being stopped, the pid now another process's)."""
        if pid in self._protected or self.busy(pid, start_ticks):
            return None
        try:
            fd: int | None = os.pidfd_open(pid)
        except OSError as e:
            if e.errno != errno.ENOSYS:
                return None  # gone
            fd = None  # a kernel before 5.3: the start time is checked at each signal
        st = procfs.proc_stat(pid, self.proc)
        if st is None or (start_ticks and st.start_ticks != start_ticks):
            if fd is not None:
                os.close(fd)
            return None
        s = Stopping(pid, st.start_ticks, reason, time.monotonic(), tag=tag)
        if not self._signal(fd, s, signal.SIGTERM):
            if fd is not None:
                os.close(fd)
            return None
        self.say(f"stopping pid {pid} (SIGTERM; SIGKILL after {self.grace:g} s): {reason}")
        with self._lock:
            self.stopping[(pid, s.start_ticks)] = s
        threading.Thread(target=self._follow, args=(fd, s), daemon=True).start()
        return s

    def _signal(self, fd: int | None, s: Stopping, sig: int) -> bool:
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
                return True
            st = procfs.proc_stat(s.pid, self.proc)
            if st is None or st.start_ticks != s.start_ticks:
                return False
            os.kill(s.pid, sig)
            return True
        except OSError:
            return False

    def _gone(self, fd: int | None, s: Stopping, timeout: float) -> bool:
        """Whether the process ended within timeout seconds."""
        if fd is not None:
            p = select.poll()
            p.register(fd, select.POLLIN)
            return bool(p.poll(max(0, int(timeout * 1000))))
        end = time.monotonic() + timeout
        while True:
            st = procfs.proc_stat(s.pid, self.proc)
            if st is None or st.start_ticks != s.start_ticks or _zombie(s.pid, self.proc):
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)

    def _follow(self, fd: int | None, s: Stopping) -> None:
        try:
            how = "SIGTERM"
            if not self._gone(fd, s, self.grace):
                how = "SIGKILL"
                self._signal(fd, s, signal.SIGKILL)
                self._gone(fd, s, 60.0)
            s.ended, s.how = time.monotonic(), how
        finally:
            if fd is not None:
                os.close(fd)
        self.say(f"pid {s.pid} stopped by {s.how}, {s.ended - s.began:.2f} s after the SIGTERM")
        with self._lock:
            self.stopping.pop((s.pid, s.start_ticks), None)
            self.done.append(s)
        if self.on_end is not None:
            self.on_end(s)


def _zombie(pid: int, proc: str) -> bool:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            s = f.read().decode(errors="replace")
        return s[s.rindex(")") + 2 :].startswith("Z")
    except (OSError, ValueError):
        return True
