"""The launcher's signals, whatever thread the kernel hands them to.

A signal sent to the launcher (kill PID, systemctl stop, a CI runner's timeout) is the whole
process's: the kernel delivers it to any of its threads that does not block it, and prefers
another thread when the main one has a signal pending already. CPython's C handler only notes
it there; the Python handler that forwards it to CMD runs in the main thread, the next time that
thread runs Python. A main thread asleep in waitpid() would sleep through it while CMD waits for
the signal it never gets: the launcher hung so once, SIGTERM never forwarded.

Two guards, each enough alone for the other's gap:
- `blocked()`: the threads the launcher starts (sampler, sealer, exit and denial watchers, a
  sweep's stop watcher, and whatever threads a library starts from them: a thread inherits its
  creator's mask) are started with CAUGHT blocked, so the kernel hands these signals to the
  main thread, whose system calls they interrupt;
- `wait()`: the wait for CMD sleeps in select() on CMD's pidfd and on the interpreter's wakeup
  pipe (signal.set_wakeup_fd), which the C handler writes to in whatever thread it ran: a signal
  taken by a thread that does not block it (one a library started before) still wakes the main
  thread, which runs the handler at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from collections.abc import Iterator

# the signals the launcher forwards to CMD, and the shim's --on-exceed abort (SIGUSR2)
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGINT)
CAUGHT = (*FORWARDED, signal.SIGUSR2)

POLL_S = 0.05  # without a pidfd (Linux before 5.3): how often the wait looks at CMD


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """CAUGHT blocked in the calling thread while the block runs: threads started inside it
    inherit the mask and never take these signals. A signal that comes meanwhile is held for
    the process and delivered once the block ends."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def wait(proc: subprocess.Popen[bytes]) -> int:
    """CMD's return code. Sleeps until CMD ends or a signal comes to any thread of the
    launcher; a handled signal runs its handler (in this, the main thread) before the wait goes
    on. Must run in the main thread (set_wakeup_fd)."""
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    before = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    pidfd = _pidfd(proc.pid)
    try:
        while (rc := proc.poll()) is None:
            watched = [rfd] if pidfd is None else [rfd, pidfd]
            select.select(watched, [], [], POLL_S if pidfd is None else None)
            _drain(rfd)
        return rc
    finally:
        signal.set_wakeup_fd(before)
        for fd in (rfd, wfd) if pidfd is None else (rfd, wfd, pidfd):
            os.close(fd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # an old kernel (or CMD already reaped): poll instead
        return None


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass
