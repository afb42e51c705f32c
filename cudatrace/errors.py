"""The one error type cudatrace reports to its user.

Every error a command can meet derives from `CudatraceError`: its message says what is wrong
without any "cudatrace: " prefix, and `status` is the exit status to give back (2 unless the
error says otherwise). The command line catches it once (`cli.Main.invoke`), prints
`cudatrace: MESSAGE` on stderr and exits with the status. A library caller catches it as any
exception. This module is the ground floor: every floor may import it and it imports nothing.
"""

from __future__ import annotations


class CudatraceError(Exception):
    """An error for the user: the message, and the exit status (default 2: bad input)."""

    status = 2

    def __init__(self, message: str = "", status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class OptionError(CudatraceError):
    """An option value that cannot be used; the message starts with the option's name."""
