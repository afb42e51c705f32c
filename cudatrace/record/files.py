"""The launcher's own files (run.json, samples.jsonl): created, never followed.

An output directory may be shared, or may hold a link someone planted; the shim opens its traces
with O_EXCL|O_NOFOLLOW, and so does the launcher: a new file is created or the call fails, a
symlink is never written through. Files are 0600 (they hold argv, cwd and the environment's
shape) unless CUDATRACE_FILE_MODE (octal, e.g. 0644) asks otherwise.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import TextIO

from .. import settings
from ..errors import CudatraceError
from ..tracedir import LOCK
from ..units import lossless_data

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def file_mode() -> int:
    """The mode of the files a run writes: CUDATRACE_FILE_MODE, octal, read as the shim reads it."""
    try:
        m = int(settings.value("FILE_MODE") or "", 8)
    except ValueError:
        m = -1
    if m < 0:
        m = settings.default_int("FILE_MODE", 8)
    return m & 0o666


def create(path: Path) -> TextIO:
    """A new file opened for appending text; FileExistsError if anything (a link included) is
    there already."""
    fd = os.open(path, _FLAGS | os.O_APPEND, file_mode())
    return os.fdopen(fd, "a")


def write_json(path: Path, obj: object) -> None:
    """Write obj to path atomically, its strings lossless (units.lossless: no lone surrogate a
    strict JSON reader refuses) (replace_lines: a fresh file beside it, renamed over it;
    rename replaces a planted link itself, never what it points to)."""
    replace_lines(path, [json.dumps(lossless_data(obj), indent=2)]).close()


def replace_lines(path: Path, lines: list[str]) -> TextIO:
    """Replace path with these lines atomically (a fresh file beside it, renamed over it) and
    return that file open for appending: no second open by name that a planted link could
    redirect."""
    tmp = path.with_name(".%s.%d.tmp" % (path.name, os.getpid()))
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, _FLAGS | os.O_APPEND, file_mode())
    f = os.fdopen(fd, "a")
    try:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return f


class DirectoryBusy(CudatraceError):
    """Another run holds the trace directory."""


def lock_dir(directory: Path) -> int:
    """Hold the trace directory for one run: an exclusive flock on its lock file (the kernel
    drops it when the holder dies, however it dies). Returns the descriptor to keep open until
    the run ends (release_dir); DirectoryBusy when another run holds it. The file is opened
    without following a link, and a lock on a file someone unlinked meanwhile is taken again."""
    path = directory / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryBusy(str(directory)) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder before us removed it as we opened it: lock the new one


def release_dir(directory: Path, fd: int) -> None:
    """End the run's hold: remove the lock file (while still holding it), then let it go."""
    try:
        os.unlink(directory / LOCK)
    except OSError:
        pass
    os.close(fd)
