"""A small tmpfs of its own for a test (a full disk, memory-backed files), and filling it.

Mounting needs root: the suite runs as root (README, .ci/run); without it such a test fails,
saying why (it never passes by skipping).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax: 16m) at path, unmounted afterwards."""
    if os.geteuid() != 0:
        why = "mounting a tmpfs needs root (.ci/run runs the suite as root)"
        pytest.fail(why)
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs as root: {r.stderr}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def used(path: Path) -> int:
    """Bytes in use on the filesystem of path."""
    s = os.statvfs(path)
    return (s.f_blocks - s.f_bfree) * s.f_frsize


def free(path: Path) -> int:
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


def fill(path: Path, leave: int = 0) -> Path:
    """A file written into path's filesystem until no more than `leave` bytes are free."""
    f = path / "filler"
    with open(f, "ab") as out:
        block = b"\xa5" * (64 << 10)
        while free(path) > leave:
            want = min(len(block), free(path) - leave)
            try:
                out.write(block[: max(want, 1)])
                out.flush()
                os.fsync(out.fileno())
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    return f


def blocks(p: Path) -> int:
    """Bytes a file takes on its filesystem."""
    return os.stat(p).st_blocks * 512
