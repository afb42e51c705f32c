"""Issue 24 #3: budgets without the launcher. A process that has only the environment an
integration sets (LD_PRELOAD, CUDATRACE_GROUP, CUDATRACE_BUDGET, CUDATRACE_LEDGER_DIR; no
`cudatrace run`) joins the group that two launcher-started members share, at its first CUDA call,
and is denied over the shared budget; a shell in the same environment that never calls CUDA takes
no member slot; the ledger directory is a shared one (sticky, root's) and the env process runs as
another uid than the directory's owner.

Runs as root (CI does): the env-only processes run as uid 65534 through setpriv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cudatrace import native
from support import children

GiB = 1 << 30
NOBODY = 65534


def _need_root():
    if os.geteuid() != 0:
        pytest.fail("this test runs processes as another uid: run it as root (CI does)")
    if not shutil.which("setpriv"):
        pytest.fail("setpriv (util-linux) is needed to run a process as another uid")


@pytest.fixture
def shared(sim):
    """A shared ledger directory (root's, mode 1777, marked for ledgers) and a world-readable copy of the simulated
    driver and the hold program, so that uid 65534 can run them."""
    _need_root()
    base = Path(tempfile.mkdtemp(prefix="ct-envbudget-"))
    try:
        base.chmod(0o755)
        ledgers = base / "ledgers"
        ledgers.mkdir()
        ledgers.chmod(0o1777)
        (ledgers / ".cudatrace-shared").touch()  # root made it for ledgers (docs/budgets.md)
        pub = base / "pub"
        pub.mkdir()
        for f in sim.lib.iterdir():
            shutil.copy2(f, pub / f.name, follow_symlinks=True)
        shutil.copy2(sim.progs["hold"], pub / "hold")
        shutil.copy2(native.shim_path(), pub / "libcudatrace.so")  # the checkout may be private
        for f in pub.iterdir():
            f.chmod(0o755)
        state = base / "state"
        yield {"ledgers": ledgers, "pub": pub, "state": state, "base": base}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _env(ct, sh, **extra):
    env = ct.env(total_bytes=10 * GiB)
    env["CUDASIM_STATE"] = str(sh["state"])
    env["LD_LIBRARY_PATH"] = str(sh["pub"])
    env["CUDATRACE_LEDGER_DIR"] = str(sh["ledgers"])
    env.update(extra)
    return env


def _status(ct, env):
    r = ct.cli("status", "grp", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ledgers"][0]


def _as_nobody(cmd, env, **kw):
    return children.popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _wait_ready(p, what):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = children.readline(p)
        if not line:
            break
        if line.strip() == "ready":
            return
    p.kill()
    raise AssertionError(f"{what} never became ready: {children.said(p)}")


def test_env_only_process_joins_the_group_and_is_denied(ct, sim, shared, tmp_path):
    sh = shared
    env = _env(ct, sh)
    # the simulated GPU's state file, made by root and opened to the other uid
    sim.run("simstat", env=env, check=True)
    sh["state"].chmod(0o666)
    members = []
    try:
        for i in range(2):  # two members started by the launcher, 1 GiB each, budget 3 GiB
            p = children.popen(
                [sys.executable, "-m", "cudatrace", "run", "-q", "--no-trace", "--group", "grp",
                 "--budget", "3GiB", "--", str(sh["pub"] / "hold"), "1", "1g"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            members.append(p)
            _wait_ready(p, f"launcher member {i}")
        st = _status(ct, env)
        assert len([m for m in st["members"] if m["state"] == "alive"]) == 2
        ledger = Path(st["path"])
        assert ledger.parent == sh["ledgers"]
        assert ledger.name == "grp@0.ledger"  # root's part of the group, its own
        assert ledger.stat().st_mode & 0o777 == 0o644  # the others read it, only root writes it
        assert sh["ledgers"].stat().st_uid == 0 != NOBODY  # owned by another uid than the job's

        only_env = {
            "LD_PRELOAD": str(sh["pub"] / "libcudatrace.so"),
            "CUDATRACE_GROUP": "grp",
            "CUDATRACE_BUDGET": "3GiB",
        }
        envo = _env(ct, sh, **only_env)
        # a shell that never calls CUDA: alive, preloaded, and no member slot
        shell = _as_nobody(["sh", "-c", "echo started; sleep 3; echo done"], envo)
        assert children.readline(shell).strip() == "started"
        maps = Path(f"/proc/{shell.pid}/maps").read_text()
        assert "libcudatrace.so" in maps  # the shell did load the preload library
        st = _status(ct, envo)
        pids = {m["pid"] for m in st["members"]}
        assert len(st["members"]) == 2, st["members"]
        assert shell.pid not in pids
        out, err = shell.communicate(timeout=30)
        assert shell.returncode == 0 and out.strip() == "done", err

        # the env-only process: 1 GiB fits beside the members' 2 GiB, the next does not
        p = _as_nobody([str(sh["pub"] / "hold"), "--exit-after-ms", "1500", "2", "1g"], envo)
        _wait_ready(p, "the env-only process")
        st = _status(ct, envo)
        alive = [m for m in st["members"] if m["state"] == "alive"]
        assert len(alive) == 3, st["members"]
        # one group of two users' parts: root's (the launchers') and nobody's (its own)
        assert {p["uid"] for p in st["parts"]} == {0, NOBODY}
        assert (sh["ledgers"] / f"grp@{NOBODY}.ledger").stat().st_uid == NOBODY
        dev0 = st["devices"][0]
        assert dev0["limit"] == 3 * GiB and dev0["in_use"] == 3 * GiB and dev0["denials"] == 1
        out, err = p.communicate(timeout=30)
        assert p.returncode == 1, (out, err)  # hold exits 1 after a failed allocation
        assert "cudatrace: budget exceeded: cuMemAlloc_v2 of 1.00 GiB on device 0" in err, err
        assert "budget 3.00 GiB, in use 3.00 GiB" in err and "hold_alloc" in err, err
        assert "CUDA_ERROR_OUT_OF_MEMORY" in err
    finally:
        for m in members:
            m.terminate()
        for m in members:
            m.communicate(timeout=30)


def test_shares_of_one_group(ct, sim, shared):
    """Two jobs in one group (one GPU), each with its share: the one over its share is denied and
    its line names it; the other gets its whole share."""
    sh = shared
    base = {
        "LD_PRELOAD": str(native.shim_path()),
        "CUDATRACE_GROUP": "grp",
        "CUDATRACE_BUDGET": "8GiB",
    }
    a = _env(ct, sh, **base, CUDATRACE_SHARE="41", CUDATRACE_SHARE_BUDGET="2GiB",
             CUDATRACE_SHARE_LABEL="slurm job 41")  # fmt: skip
    b = _env(ct, sh, **base, CUDATRACE_SHARE="42", CUDATRACE_SHARE_BUDGET="6GiB",
             CUDATRACE_SHARE_LABEL="slurm job 42")  # fmt: skip
    pa = children.popen([str(sh["pub"] / "hold"), "3", "1g"], env=a, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    _wait_ready(pa, "job 41")
    rb = sim.run("hold", "--exit-after-ms", "1", "6", "1g", env=b)
    st = _status(ct, b)
    pa.terminate()
    _oa, ea = pa.communicate(timeout=30)
    assert rb.returncode == 0, rb.stderr  # job 42's 6 GiB fit beside job 41's 2 GiB
    assert "budget 2.00 GiB (share of slurm job 41), in use 2.00 GiB" in ea, ea
    shares = {m["share"]: m for m in st["members"]}
    assert shares["41"]["share_limit"] == 2 * GiB
    assert shares["41"]["devices"]["0"]["held"] == 2 * GiB
