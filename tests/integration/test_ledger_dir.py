"""Issue 11 #9: another local user creating /dev/shm/cudatrace-<your uid> cannot block your
budgets: the ledger directory falls back to $XDG_RUNTIME_DIR/cudatrace (then /tmp), both checked
alike. Run as a spare uid (root here) so that the real /dev/shm directory of anyone is untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support.paths import REPO

UID = 54321

CODE = r"""
import os, sys
from cudatrace import native
from cudatrace.record.ledger import ledger_dir, LedgerError
native.tools()                   # loaded as root: the spare uid cannot read root's Python
os.setgid(%d); os.setuid(%d)
try:
    print(ledger_dir(create=True))
except LedgerError as e:
    print("ERROR", e)
"""


@pytest.fixture
def squatted():
    if os.geteuid() != 0:
        pytest.fail("needs root to act as two users (.ci/run runs as root)")
    squat = Path("/dev/shm/cudatrace-%d" % UID)
    if squat.exists() or squat.is_symlink():
        pytest.fail(f"{squat} exists already: remove it to run this test")
    squat.mkdir(mode=0o700)  # owned by root: "another user"
    base = Path(tempfile.mkdtemp(prefix="ctxdg-"))
    base.chmod(0o755)
    xdg = base / "run"
    xdg.mkdir(mode=0o700)
    os.chown(xdg, UID, UID)
    try:
        yield xdg
    finally:
        squat.rmdir()
        shutil.rmtree(base, ignore_errors=True)


def test_squatted_shm_dir_falls_back_to_xdg_runtime_dir(squatted):
    env = {k: v for k, v in os.environ.items() if k != "CUDATRACE_LEDGER_DIR"}
    env["XDG_RUNTIME_DIR"] = str(squatted)
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run(
        [sys.executable, "-c", CODE % (UID, UID)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(squatted / "cudatrace"), r.stdout


def test_explicit_ledger_dir_is_never_replaced(squatted, tmp_path):
    bad = tmp_path / "foreign"
    bad.mkdir(mode=0o700)  # root's, not UID's
    env = dict(
        os.environ,
        CUDATRACE_LEDGER_DIR=str(bad),
        XDG_RUNTIME_DIR=str(squatted),
        PYTHONPATH=str(REPO),
    )
    r = subprocess.run(
        [sys.executable, "-c", CODE % (UID, UID)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.startswith("ERROR"), r.stdout
