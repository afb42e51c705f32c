"""The ledger's C harnesses (tests/ledger/ledger_test.c: processes of one user; parts_test.c:
several users' parts of one group), built with the ledger's own C and run case by case."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ctxhold import ASAN, TSAN
from support.paths import LEDGER_C, LEDGER_SOURCES, REPO

# the plain build: warnings as errors; under the sanitizers, the context hold harness's flags
PLAIN = ["-O2", "-g", "-Wall", "-Wextra", "-Werror"]
__all__ = ["ASAN", "PLAIN", "TSAN", "build", "run"]


def build(exe: Path, harness: str, flags: list[str]) -> Path:
    """tests/ledger/<harness>.c linked with the ledger's C at exe, built with flags."""
    cc = os.environ.get("CC", "cc")
    assert shutil.which(cc), f"no C compiler ({cc}): the suite needs one"
    cmd = [cc, "-std=gnu11", *flags, "-D_GNU_SOURCE", "-pthread", "-I", str(REPO / "native/include"),
           str(LEDGER_C / f"{harness}.c"), *map(str, LEDGER_SOURCES), "-o", str(exe)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def run(
    exe: Path,
    work: Path,
    case: str,
    *args: str,
    mode: int = 0o700,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """One case in a ledger directory of its own under work (mode 0700; parts_test's users,
    uids of their own, need 0755)."""
    d = work / case
    d.mkdir(mode=mode)
    return subprocess.run(
        [str(exe), str(d), case, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@contextlib.contextmanager
def users_dir() -> Iterator[Path]:
    """A folder parts_test's users (children with uids of their own) can reach, removed after;
    as root only."""
    if os.geteuid() != 0:
        pytest.fail("the parts harness runs its users as uids of their own: run as root")
    d = Path(tempfile.mkdtemp(prefix="ct-parts-"))
    try:
        d.chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
