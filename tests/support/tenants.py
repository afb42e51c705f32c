"""Users of one node, for the tests of ledgers several users share (docs/budgets.md, "Shared
ledger directories"): a shared ledger directory (root's, sticky), a copy of the preload library,
the simulated driver and the test programs that any uid can run, one simulated GPU whose state
any uid can write, and processes started as a uid of their own through setpriv (the suite runs
as root, as CI does). Only C runs as those users: the readers (`cudatrace status`, `metrics`,
the node agent) run as root, as they do on a node."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cudatrace import native

from . import simbuild

if TYPE_CHECKING:
    from .sim_fixtures import Sim

GiB = 1 << 30
ALICE, BOB = 61011, 61012  # two users of the node: nobody's uids, no accounts needed


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("these tests run processes as other uids: run them as root (CI does)")
    if not shutil.which("setpriv"):
        pytest.fail("setpriv (util-linux) is needed to run a process as another uid")


class Tenants:
    def __init__(self, base: Path, sim: Sim) -> None:
        self.base = base
        self.ledgers = base / "ledgers"  # the node's shared ledger directory
        self.pub = base / "pub"
        self.state = base / "gpu"
        self.sim = sim

    def plain_env(self) -> dict[str, str]:
        """The simulated GPU, nothing of cudatrace (the readers run with it)."""
        env = self.sim.env(total_bytes=8 * GiB)
        env.update(simbuild.sim_env(self.pub, state=self.state, total_bytes=8 * GiB))
        env["CUDATRACE_LEDGER_DIR"] = str(self.ledgers)
        return env

    def env(self, group: str = "g", budget: str = "1GiB", **extra: str) -> dict[str, str]:
        """A job's environment: the preload library, the group, its budget."""
        env = self.plain_env()
        env.update(
            LD_PRELOAD=str(self.pub / "libcudatrace.so"),
            CUDATRACE_LEDGER_DIR=str(self.ledgers),
            CUDATRACE_GROUP=group,
            CUDATRACE_BUDGET=budget,
        )
        env.update(extra)
        return env

    def part(self, uid: int, group: str = "g") -> Path:
        return self.ledgers / f"{group}@{uid}.ledger"

    def popen(self, uid: int, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        """cmd as uid, its stdin, stdout and stderr pipes of text."""
        pre = [] if uid == 0 else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        return subprocess.Popen(
            [*pre, *cmd],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def sh(self, uid: int, script: str) -> subprocess.CompletedProcess:
        """A shell command run as uid (what a user of the node can do to files)."""
        return subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def prog(self, name: str) -> str:
        return str(self.pub / name)


def wait_line(p: subprocess.Popen, want: str, timeout: float = 30) -> list[str]:
    """Lines of p's stdout up to one that is want (AssertionError with its stderr otherwise)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline() if p.stdout else ""
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if lines[-1] == want:
            return lines
    p.kill()
    raise AssertionError(
        f"no {want!r} line: {lines}; stderr: {p.stderr.read() if p.stderr else ''}"
    )


class Steps:
    """tests/progs/steps.c as a user: one command a line, each answered."""

    def __init__(self, t: Tenants, uid: int, env: dict[str, str]) -> None:
        self.p = t.popen(uid, [t.prog("steps")], env)
        wait_line(self.p, "ready")

    def do(self, cmd: str) -> str:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline().strip()
        assert line, f"steps ended at {cmd!r}: {self.p.stderr.read() if self.p.stderr else ''}"
        return line

    def quit(self) -> tuple[int, str]:
        assert self.p.stdin
        self.p.stdin.write("q\n")
        self.p.stdin.flush()
        _, err = self.p.communicate(timeout=30)
        return self.p.returncode, err


@contextmanager
def tenants(sim: Sim) -> Iterator[Tenants]:
    need_root()
    base = Path(tempfile.mkdtemp(prefix="ct-tenants-"))
    try:
        base.chmod(0o755)
        t = Tenants(base, sim)
        t.ledgers.mkdir()
        t.ledgers.chmod(0o1777)
        (t.ledgers / ".cudatrace-shared").touch()  # root made it for ledgers (docs/budgets.md)
        t.pub.mkdir()
        for f in sim.lib.iterdir():
            shutil.copy2(f, t.pub / f.name, follow_symlinks=True)
        for name in ("hold", "steps", "simstat"):
            prog = sim.progs[name]
            assert prog is not None, f"the simulator's build has no {name}"
            shutil.copy2(prog, t.pub / name)
        shutil.copy2(native.shim_path(), t.pub / "libcudatrace.so")
        for f in t.pub.iterdir():
            f.chmod(0o755)
        subprocess.run(
            [str(t.pub / "simstat")], env=t.plain_env(), capture_output=True, check=True, timeout=60
        )
        t.state.chmod(0o666)  # one GPU for every user
        yield t
    finally:
        shutil.rmtree(base, ignore_errors=True)
