"""Issue 21, sweep: a stopped run's whole process tree is stopped (item 7); the budget --predict
advises includes the CUDA context the budget counts and works when used (item 8); --from reads
only its own copy (item 10); numbers too large for a float are refused clearly (item 11)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from support.paths import REPO

MiB = 1 << 20


def _env(sim, base: Path, **opts) -> dict:
    env = sim.env(state=sim.new_state(), **opts)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("CUDATRACE_CACHE", str(base / "symcache"))
    return env


def sweep(env, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cudatrace", "sweep", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_stop_reaches_children_that_ignore_sigint(sim, tmp_path):
    # the top (hold) exits on SIGINT; its child ignores SIGINT and would hold on for a minute
    pids = tmp_path / "pids"
    child = f"sh -c 'trap \"\" INT; echo $$ >> {pids}; exec sleep 60' &"
    cmd = f"{child} exec {sim.progs['hold']} 1 {{}}"
    t0 = time.monotonic()
    r = sweep(
        _env(sim, tmp_path),
        "--values", "1MiB,2MiB", "--stop-after", "1s", "--grace", "1s",
        "-o", tmp_path / "sw", "--json", "--", "sh", "-c", cmd,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    left = [int(x) for x in pids.read_text().split()]
    assert len(left) == 2
    try:
        assert all(_gone(p) for p in left), [p for p in left if not _gone(p)]
    finally:
        for p in left:
            if not _gone(p):
                os.kill(p, 9)
    assert time.monotonic() - t0 < 40
    for run in json.loads(r.stdout)["runs"]:
        assert run["ended"]["signal"] in ("SIGTERM", "SIGKILL"), run["ended"]
