"""The one error type cudatrace reports to its user, and the exit statuses (docs/exit-codes.md).

Every error a command can meet derives from `CudatraceError`: its message says what is wrong
without any "cudatrace: " prefix, and `status` is the exit status to give back (BAD_INPUT unless
the error says otherwise). The command line catches it once (`cli.Main.invoke`), prints
`cudatrace: MESSAGE` on stderr and exits with the status. A library caller catches it as any
exception. This module is the ground floor: every floor may import it and it imports nothing.

`cudatrace run` exits with CMD's own status, so its own statuses lie apart from the ones a
program uses (as env, timeout and nice do): RUN_FAILED when the run could not be set up or CMD
could not be started (bad input included), CANNOT_EXECUTE and NOT_FOUND for CMD itself, ABORTED
when --on-exceed abort stopped the tree and CMD still exited 0. `cli.Main.invoke` turns any
other error of `run` into RUN_FAILED.
"""

from __future__ import annotations

FAILED = 1  # a command did its work and found a failure (a sweep with too few runs, ...)
BAD_INPUT = 2  # bad options or arguments, an unreadable trace: nothing was done
ABORTED = 124  # run: --on-exceed abort stopped the tree (CMD itself exited 0)
RUN_FAILED = 125  # run: cudatrace could not set up the run or start CMD
CANNOT_EXECUTE = 126  # run: CMD was found but cannot be executed
NOT_FOUND = 127  # run: CMD was not found
RUN_STATUSES = (ABORTED, RUN_FAILED, CANNOT_EXECUTE, NOT_FOUND)
INTERRUPTED = 130  # any command stopped by Ctrl-C (SIGINT), as a shell says it: 128 + 2


class CudatraceError(Exception):
    """An error for the user: the message, and the exit status (default BAD_INPUT)."""

    status = BAD_INPUT

    def __init__(self, message: str = "", status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class Signalled(CudatraceError):
    """A signal to stop (SIGINT, SIGTERM) that came before the work began, which was then not
    done: 128+N for signal N, as a shell says it, for every command (`run`'s too: CMD was not
    started)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message, 128 + signum)


class OptionError(CudatraceError):
    """An option value that cannot be used; the message starts with the option's name."""
