"""`cudatrace run` inside an integration's fence (the environment a Slurm TaskProlog gives a job:
the preload library, CUDATRACE_GROUP of the GPU, the job's share): the run reports the share as
its budget and the device's real size, is no member itself (its own Python reads NVML past the
preload library the environment put into it), and `--budget` lowers the command's share without
leaving the GPU's group, so the other jobs stay fenced from it. Before, the report said "budget
none" and "2.00 GiB of 2.00 GiB" on an 8 GiB GPU, the launcher's Python counted in the share,
and `--budget` made a private ledger the other jobs on the GPU never saw."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cudatrace import native
from cudatrace.errors import RUN_FAILED
from support import children

GiB = 1 << 30


@pytest.fixture
def job(ct, sim, tmp_path):
    """A job's environment on a shared 8 GiB GPU: share 41 of 2 GiB in group slurm-gpu0."""
    d = tmp_path / "ledgers"
    d.mkdir()
    d.chmod(0o1777)
    (d / ".cudatrace-shared").touch()  # a shared ledger directory root made (docs/budgets.md)
    env = ct.env(state=sim.new_state(), total_bytes=8 * GiB)
    env.update(
        LD_PRELOAD=str(native.shim_path()),
        CUDATRACE_LEDGER_DIR=str(d),
        CUDATRACE_GROUP="slurm-gpu0",
        CUDATRACE_BUDGET=str(8 * GiB),
        CUDATRACE_SHARE="41",
        CUDATRACE_SHARE_BUDGET=str(2 * GiB),
        CUDATRACE_SHARE_LABEL="slurm job 41 (alice)",
        CUDATRACE_ON_FENCE_ERROR="refuse",
    )
    return env


def _plain(env):
    return {k: v for k, v in env.items() if k != "LD_PRELOAD"}


def _group(ct, env) -> dict:
    r = ct.cli("status", "slurm-gpu0", "--json", env=_plain(env))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ledgers"][0]


def _start(ct, sim, env, *opts, n="3"):
    out = ct.new_dir()
    p = children.popen(
        [sys.executable, "-m", "cudatrace", "run", "-o", str(out), *opts, "--",
         str(sim.progs["hold"]), n, "1g"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = []
    while True:
        line = children.readline(p)
        lines.append(line)
        if not line or line.strip() == "ready":
            break
    return p, out, "".join(lines)


def test_a_run_in_a_job_reports_its_share_and_is_no_member(ct, sim, job):
    p, out, stdout = _start(ct, sim, job)
    try:
        assert stdout.count(" 0\n") == 2 and " 0x0 2\n" in stdout, stdout  # the 3rd GiB denied
        st = _group(ct, job)
        pids = {m["pid"] for m in st["members"] if m["state"] == "alive"}
        assert p.pid not in pids and len(pids) == 1, st["members"]  # hold alone
        assert st["members"][0]["share"] == "41"
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
    assert "budget 2.00 GiB (share of slurm job 41 (alice)), in use 2.00 GiB" in err, err
    r = json.loads(ct.cli("report", out, "--json", env=_plain(job)).stdout)
    b = r["budget"]
    assert b["limits"]["0"] == 2 * GiB and b["share"] == "slurm job 41 (alice)", b
    assert b["group"] == "slurm-gpu0"
    text = ct.cli("report", out, env=_plain(job)).stdout
    assert "share of slurm job 41 (alice)" in text and "of 8.00 GiB" in text, text
    assert "of 2.00 GiB near the peak" not in text, text


def test_budget_in_a_job_lowers_the_share_and_stays_in_the_group(ct, sim, job):
    p, out, stdout = _start(ct, sim, job, "--budget", "1GiB", n="2")
    try:
        assert stdout.count(" 0\n") == 1 and " 0x0 2\n" in stdout, stdout  # the 2nd GiB denied
        st = _group(ct, job)  # the command counts in the GPU's group: the others see it
        alive = [m for m in st["members"] if m["state"] == "alive"]
        assert len(alive) == 1 and alive[0]["share"] == "41", alive
        assert alive[0]["share_limit"] == GiB and st["devices"][0]["in_use"] == GiB
        # another job of the GPU (6 GiB share) gets its 6 GiB beside it, and no more
        other = dict(job, CUDATRACE_SHARE="42", CUDATRACE_SHARE_BUDGET=str(6 * GiB),
                     CUDATRACE_SHARE_LABEL="slurm job 42")  # fmt: skip
        r = sim.run("hold", "--exit-after-ms", "1", "7", "1g", env=other)
        assert r.stdout.count(" 0\n") == 6 and "share of slurm job 42" in r.stderr, (
            r.stdout,
            r.stderr,
        )
    finally:
        p.terminate()
        p.communicate(timeout=60)


def test_budget_above_the_share_is_bounded_by_it(ct, sim, job):
    p, out, stdout = _start(ct, sim, job, "--budget", "5GiB")
    p.terminate()
    _, err = p.communicate(timeout=60)
    assert " 0x0 2\n" in stdout, stdout  # still the share's 2 GiB
    assert "the share bounds it" in err, err


def test_group_in_a_job_is_refused(ct, sim, job):
    r = ct.run([sim.progs["hold"], "1", "1m"], "--group", "mine", "--budget", "1GiB", env=job)
    assert r.returncode == RUN_FAILED, r.stderr
    assert "inside the fence of group slurm-gpu0" in r.stderr, r.stderr
