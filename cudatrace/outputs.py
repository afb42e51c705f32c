"""Every file cudatrace writes for its user (exports, --html, --svg, sweep.json) goes through
one function here, so that an output path is written, never replaced when it is not a regular
file we may replace:

- a new path, or a regular file: written to a temporary file beside it and renamed over it, so
  the path holds the whole output or what it held before (a regular file keeps its mode);
- `-`: the output goes to standard output;
- an existing character device or FIFO (/dev/null, /dev/stdout, a pipe a reader waits on): the
  output is written through to it, never replaced by a regular file; a FIFO that no process
  opens for reading within FIFO_WAIT seconds is an error, not a wait without end;
- a symbolic link: refused (a link in a shared directory could send the output anywhere; name
  its target instead); a directory, a block device or a socket: refused;
- a write that fails (a full disk: ENOSPC, a quota, /dev/full) is an error with the reason and
  a non-zero exit status, and leaves no temporary file behind.

A leaf: it imports only errors.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import CudatraceError

STDOUT = "-"
FIFO_WAIT = 10.0  # seconds a FIFO's reader has to open it


class OutputError(CudatraceError):
    """An output that cannot be written where it was asked for (exit status 2, as every
    error of cudatrace's own)."""


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def _kind(path: Path) -> str:
    """'new', 'file', 'through' (a character device or FIFO), or raise OutputError."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "new"
    except OSError as e:
        raise OutputError(f"cannot write {path}: {_why(e)}") from None
    m = st.st_mode
    if stat.S_ISREG(m):
        return "file"
    if stat.S_ISCHR(m) or stat.S_ISFIFO(m):
        return "through"
    if stat.S_ISLNK(m):
        raise OutputError(
            f"{path} is a symbolic link; cudatrace does not write through links: "
            + (
                "write `-` for standard output"
                if str(path) in ("/dev/stdout", "/dev/stderr") or str(path).startswith("/dev/fd/")
                else f"name its target ({os.readlink(path)}) instead"
            )
        )
    if stat.S_ISDIR(m):
        raise OutputError(f"{path} is a directory: name a file")
    raise OutputError(f"{path} is a block device or a socket: refused as an output")


@contextmanager
def output_path(path: str | Path) -> Iterator[Path]:
    """A path to write the whole output to (by a writer that opens it by name); on leaving
    without an error the output lands at `path` by the rules above. OSError while writing
    becomes OutputError; the temporary file is removed whatever happens."""
    target = str(path)
    if not target:
        raise OutputError("an empty path names no file")
    kind = "stdout" if target == STDOUT else _kind(Path(target))
    if kind in ("new", "file"):
        p = Path(target)
        tmp_dir = str(p.parent)
        prefix = "." + p.name + "."
    else:  # the output is copied to its target at the end: build it in the temporary dir
        tmp_dir, prefix = None, ".cudatrace-output."
    try:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=tmp_dir)
    except OSError as e:
        raise OutputError(f"cannot write {target}: {_why(e)}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        if kind == "stdout":
            _copy_to_stdout(tmp)
        elif kind == "through":
            _copy_through(tmp, target)
        else:
            _land(tmp, Path(target), kind)
    except OSError as e:
        raise OutputError(f"cannot write {target}: {_why(e)}") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def write_output(path: str | Path, data: str | bytes) -> None:
    """Write all of data (text as UTF-8) to path by the rules above."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with output_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(raw)


def check_output(path: str | Path) -> None:
    """Raise OutputError now for a path the rules above will refuse (a link, a directory, a
    block device or a socket), or a new file whose directory is missing or not writable: for an
    output written only at the end of a long run (pytest's --cudatrace-json)."""
    target = str(path)
    if not target:
        raise OutputError("an empty path names no file")
    if target == STDOUT or _kind(Path(target)) == "through":
        return
    parent = Path(os.path.abspath(target)).parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {target}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {target}: the directory {parent} is not writable")


def describe(path: str | Path) -> str:
    """How a message names an output: 'standard output' for -, else the path."""
    return "standard output" if str(path) == STDOUT else str(path)


def _land(tmp: str, target: Path, kind: str) -> None:
    mode = None
    if kind == "file":
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except OSError:
            mode = None
    if mode is None:  # a new file: what open() would have made (0666 less the umask)
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)
    # a regular file (or nothing) stood there when we looked; if something else was put there
    # meanwhile, rename replaces only a name in this directory, never a device or a link target
    os.replace(tmp, target)


def _open_through(target: str) -> int:
    """target opened for writing; a FIFO without a reader is waited on FIFO_WAIT seconds."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    deadline = time.monotonic() + FIFO_WAIT
    while True:
        try:
            fd = os.open(target, flags)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: a FIFO that no process has open for reading
                raise
            if time.monotonic() >= deadline:
                raise OutputError(
                    f"cannot write {target}: no process opened the FIFO for reading within "
                    f"{FIFO_WAIT:g} s"
                ) from None
            time.sleep(0.05)
    os.set_blocking(fd, True)
    return fd


def _copy_through(tmp: str, target: str) -> None:
    fd = _open_through(target)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise OutputError(f"{target} changed while it was written: not written")
        with open(tmp, "rb") as src, os.fdopen(os.dup(fd), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    finally:
        os.close(fd)


def _copy_to_stdout(tmp: str) -> None:
    sys.stdout.flush()
    out = sys.stdout.buffer
    with open(tmp, "rb") as src:
        shutil.copyfileobj(src, out, 1 << 20)
    out.flush()
