"""Budgets across containers, on the simulated driver: members in different PID namespaces
(`unshare --pid --fork --mount-proc`, as a container runtime makes them) share one group through
--ledger-dir, and launchers with the same pid in two namespaces keep their private ledgers apart.

Making a PID namespace needs root (the suite runs as root: README, .ci/run); without it these
tests fail, saying why (they never pass by skipping).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudatrace.procfs import tree_pids
from support import children
from support.paths import REPO

MiB = 1 << 20


def _need_unshare():
    why = None
    if os.geteuid() != 0:
        why = "making a PID namespace (unshare --pid) needs root"
    elif not shutil.which("unshare"):
        why = "no unshare(1) (util-linux)"
    else:
        r = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True
        )
        if r.returncode != 0:
            why = "unshare --pid does not work here: " + r.stderr.strip()
    if why:
        pytest.fail(why + " (run the tests as root, as .ci/run does)")


NS = ["unshare", "--pid", "--fork", "--mount-proc"]


@pytest.fixture
def shared_dir(tmp_path):
    _need_unshare()
    d = tmp_path / "shared-ledgers"  # what a bind mount would give each container
    d.mkdir(mode=0o700)
    return d


def ns_run(ct, env, *args):
    """`cudatrace run ARGS` as the first process of a new PID namespace."""
    return NS + [sys.executable, "-m", "cudatrace", "run", *map(str, args)]


def pid_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def find_proc(root: int, comm: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in tree_pids(root):
            try:
                if Path(f"/proc/{p}/comm").read_text().strip() == comm:
                    return p
            except OSError:
                pass
        time.sleep(0.02)
    raise AssertionError(f"no {comm} under pid {root}")


POLLER = r"""
import sys, time
from cudatrace.record.ledger import Ledger
led = Ledger.open(sys.argv[1]); led.join()
print("joined", flush=True)
deadline = time.monotonic() + 20
while not led.reserve(0, int(sys.argv[2])):
    if time.monotonic() > deadline:
        sys.exit("never granted")
    time.sleep(0.01)
print("granted %d" % time.monotonic_ns(), flush=True)
"""


def test_group_shared_across_pid_namespaces(ct, sim, shared_dir):
    env = ct.env()  # private simulated state: each process its own GPU
    env.pop("CUDATRACE_LEDGER_DIR", None)
    out_a = ct.new_dir()
    a = children.popen(
        ns_run(
            ct,
            env,
            "-q",
            "-o",
            out_a,
            "--ledger-dir",
            shared_dir,
            "--group",
            "team",
            "--budget",
            "1GiB",
            "--",
            sim.progs["hold"],
            "1",
            "700m",
        ),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in children.lines(a):
            if line.strip() == "ready":
                break
        hold_a = find_proc(a.pid, "hold")
        assert pid_ns(hold_a) != pid_ns(os.getpid())
        st = json.loads(
            ct.cli("status", "team", "--json", "--ledger-dir", shared_dir, env=env).stdout
        )
        (led,) = st["ledgers"]
        assert [m["state"] for m in led["members"]] == ["alive"]
        assert led["members"][0]["other_pidns"]
        assert led["devices"][0]["in_use"] == 700 * MiB

        # B, in a namespace of its own, is held to what A left: 324 MiB
        b = subprocess.run(
            ns_run(
                ct,
                env,
                "-o",
                ct.new_dir(),
                "--ledger-dir",
                shared_dir,
                "--group",
                "team",
                "--",
                sim.progs["hold"],
                "--exit-after-ms",
                "10",
                "--free",
                "1",
                "700m",
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert b.returncode == 1 and "budget exceeded" in b.stderr, b.stderr
        assert "in use 700.00 MiB" in b.stderr, b.stderr

        # C waits in a third namespace for 700 MiB; A's process is SIGKILLed
        c = children.popen(
            NS + [sys.executable, "-c", POLLER, str(shared_dir / "team.ledger"), str(700 * MiB)],
            env=dict(env, PYTHONPATH=str(REPO)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert children.readline(c).strip() == "joined", children.said(c)
        t_kill = time.monotonic_ns()
        os.kill(hold_a, signal.SIGKILL)
        line = children.readline(c).split()
        c.wait(timeout=30)
        assert line and line[0] == "granted", children.said(c)
        assert int(line[1]) >= t_kill  # granted from the dead member's bytes, after the kill
    finally:
        a.kill()
        a.communicate(timeout=60)


def test_same_launcher_pid_in_two_namespaces(ct, sim, shared_dir):
    """Both launchers are pid 1 of their namespace: each keeps its own private ledger and its
    own budget (before: one unlinked the other's `@run-1.ledger`)."""
    env = ct.env()
    outs = [ct.new_dir(), ct.new_dir()]
    procs = [
        children.popen(
            ns_run(
                ct,
                env,
                "-o",
                out,
                "--ledger-dir",
                shared_dir,
                "--budget",
                "100MiB",
                "--",
                sim.progs["hold"],
                "--exit-after-ms",
                "1500",
                "3",
                "50m",
            ),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in outs
    ]
    res = [p.communicate(timeout=120) for p in procs]
    paths = set()
    for p, (so, se), out in zip(procs, res, outs):
        assert "unusable" not in se and "NOT enforced" not in se, se
        assert p.returncode == 1, se  # the third 50 MiB is denied
        assert se.count("cudatrace: budget exceeded:") == 1, se
        assert [l.split()[4] for l in so.splitlines() if l.startswith("alloc ")] == ["0", "0", "2"]
        info = json.loads((out / "run.json").read_text())
        assert info["budget"]["path"].startswith(str(shared_dir) + "/@run-1-")
        paths.add(info["budget"]["path"])
    assert len(paths) == 2
    assert not [n for n in os.listdir(shared_dir) if n.endswith(".ledger")]  # both cleaned up


# ---- CUDA contexts count against a budget ------------------------------------------------------


def test_context_counted_by_the_budget(ct, sim, tmp_path):
    """The simulated driver charges 300 MiB when a process first uses a context (CUDASIM_CTX_BYTES,
    seen by NVML's per-process figure, by no hooked call). Under a 1 GiB budget, 300 MiB of
    context and three 300 MiB allocations do not fit: the third is denied."""
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env(state=sim.new_state(), ctx_bytes=300 * MiB)
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    r = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "--free", "3", "300m"],
        "--budget",
        "1GiB",
        env=env,
    )
    assert r.returncode == 1, r.stderr
    assert [l.split()[4] for l in r.stdout.splitlines() if l.startswith("alloc ")] == [
        "0",
        "0",
        "2",
    ]
    assert "in use 900.00 MiB" in r.stderr, r.stderr  # 300 context + 2 x 300
    from cudatrace.analyze.read.trace import read_dir

    t = read_dir(r.out).traces[0]
    assert t.info.get("context.0") == str(300 * MiB)
    rep = ct.cli("report", r.out, env=env)
    assert (
        "contexts    300.0 MiB on device 0 of CUDA context counted by the budget" in rep.stdout
    ), rep.stdout
    js = json.loads(ct.cli("report", r.out, "--json", env=env).stdout)
    assert js["budget"]["contexts"] == {"0": 300 * MiB}
    # NVML's readings are set beside the trace over the span they were read in: the untraced
    # figure is the context, never the context plus an allocation a reading raced (a run long
    # enough to be sampled, everything freed before it exits)
    r2 = ct.run([sim.progs["hold"], "--exit-after-ms", "600", "--free", "2", "300m"], env=env)
    assert r2.returncode == 0, r2.stderr
    samples = [json.loads(l) for l in (r2.out / "samples.jsonl").read_text().splitlines()]
    read = [s for s in samples if "tree_device_bytes" in s]
    assert read and all(s["t"] <= s["nvml_t"][0] <= s["nvml_t"][1] for s in read), samples
    js2 = json.loads(ct.cli("report", r2.out, "--json", env=env).stdout)
    assert js2["observed"]["max"]["untraced_max_bytes"] == 300 * MiB, js2["observed"]
    # off: the same run fits (what budgets did before)
    env["CUDATRACE_COUNT_CONTEXTS"] = "0"
    r = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "--free", "3", "300m"],
        "--budget",
        "1GiB",
        env=env,
    )
    assert r.returncode == 0, r.stderr


def test_status_shows_contexts_apart(ct, sim, tmp_path):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env(state=sim.new_state(), ctx_bytes=200 * MiB)
    a = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "-o",
            str(ct.new_dir()),
            "--ledger-dir",
            str(d),
            "--group",
            "svc",
            "--budget",
            "2GiB",
            "--",
            str(sim.progs["hold"]),
            "2",
            "100m",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in children.lines(a):
            if line.strip() == "ready":
                break
        st = ct.cli("status", "svc", "--json", "--ledger-dir", d, env=env)
        led = json.loads(st.stdout)["ledgers"][0]
        dev = led["devices"][0]
        assert (dev["in_use"], dev["contexts"], dev["allocations"]) == (
            400 * MiB,
            200 * MiB,
            200 * MiB,
        ), dev
        (m,) = led["members"]
        assert m["devices"]["0"]["context"] == 200 * MiB
        text = ct.cli("status", "svc", "--ledger-dir", d, env=env).stdout
        assert "contexts" in text, text
        assert "400.0 MiB = 200.0 MiB allocations + 200.0 MiB CUDA context" in text, text
    finally:
        a.terminate()
        a.communicate(timeout=60)


# ---- a program that closes cudatrace's descriptor ----------------------------------------------


def test_lost_membership_is_joined_again_with_what_it_holds(ct, sim, tmp_path):
    """closefds allocates 100 MiB, closes every descriptor (its liveness lock goes), another
    member reclaims its slot as dead; its next allocation must rejoin with the 100 MiB still
    counted, so a second 100 MiB under a 150 MiB budget is denied."""
    from cudatrace.record.ledger import Ledger

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env()
    p = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "-o",
            str(ct.new_dir()),
            "--ledger-dir",
            str(d),
            "--group",
            "g",
            "--budget",
            "150MiB",
            "--",
            str(sim.progs["closefds"]),
            "100m",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in children.lines(p):
        lines.append(line)
        if line.strip() == "closed":
            break
    other = Ledger.open(d / "g.ledger")
    other.join()
    assert other.reclaim() == 1  # judged dead: its lock is gone
    assert other.in_use(0) == 0
    out, err = p.communicate("go\n", timeout=60)
    lines += out.splitlines()
    res = [l.split()[4] for l in lines if l.startswith("alloc ")]
    assert res == ["0", "2"], (lines, err)
    assert "joined again" in err, err
    other.close()


FORKER = r"""
import os, sys, time
from cudatrace.record.ledger import Ledger
led = Ledger.open(sys.argv[1]); led.join(); led.reserve(0, 10 << 20)
if os.fork() == 0:          # the child joins as the shim does after fork, and lives on
    led.join(); led.reserve(0, 1 << 20)
    print("child", os.getpid(), flush=True)
    time.sleep(30)
    os._exit(0)
time.sleep(0.5)
os._exit(0)                 # the parent dies first
"""


def test_dead_parent_reclaimed_while_its_forked_child_lives(tmp_path):
    """The child inherits the parent's mapping and descriptor; neither may keep the parent's
    liveness lock alive once the parent is gone."""
    from cudatrace.record.ledger import Ledger

    d = tmp_path / "l"
    d.mkdir(mode=0o700)
    led = Ledger.create(d / "f.ledger", {0: 1 << 30})
    p = children.popen(
        [sys.executable, "-c", FORKER, str(led.path)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    word, child = children.readline(p).split()
    try:
        assert word == "child"
        p.wait(timeout=30)
        deadline = time.monotonic() + 5
        while led.in_use(0) != 1 << 20 and time.monotonic() < deadline:
            led.reclaim()
            time.sleep(0.05)
        assert led.in_use(0) == 1 << 20, led.snapshot()["members"]  # the child's MiB only
    finally:
        os.kill(int(child), signal.SIGKILL)
        led.close()
