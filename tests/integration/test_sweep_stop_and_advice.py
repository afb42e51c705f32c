"""Sweep: a stopped run's whole process tree is stopped; the budget --predict advises includes
the CUDA context the budget counts and works when used; --from reads only its own copy;
numbers too large for a float are refused clearly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

MiB = 1 << 20


def _env(sim, base: Path, **opts) -> dict:
    opts.setdefault("state", sim.new_state())
    env = sim.env(**opts)
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
    for run in json.loads(r.stdout)["runs"]:
        assert run["ended"]["signal"] in ("SIGTERM", "SIGKILL"), run["ended"]


def test_predicted_budget_counts_contexts_and_works(sim, tmp_path):
    # each process's context costs 48 MiB on this simulated device; the budget counts it
    ctx = 48 * MiB
    env = _env(sim, tmp_path, ctx_bytes=ctx)
    hold = sim.progs["hold"]
    r = sweep(
        env, "--values", "2MiB,4MiB,6MiB", "--stop-after", "1s", "--predict", "8MiB",
        "-o", tmp_path / "sw", "--json", "--", hold, "2", "{}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)["prediction"]["budget"]
    assert b["context_bytes"] is not None and b["context_bytes"] >= ctx, b
    assert b["bytes"] >= 16 * MiB + ctx, b
    # the advice works when used: the same program at 8 MiB under it is never denied, and the
    # device (the simulator's own mark, context included) stayed within it
    state = sim.new_state()
    env = _env(sim, tmp_path, ctx_bytes=ctx, state=state)
    run = subprocess.run(
        [sys.executable, "-m", "cudatrace", "run", "-q", "-o", tmp_path / "t"]
        + ["--budget", b["spec"], "--", hold, "--exit-after-ms", "300", "2", "8MiB"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "budget exceeded" not in run.stderr
    assert sim.stats(state)[0]["hwm"] <= b["bytes"]


def test_short_runs_predict_a_budget_with_their_contexts(sim, tmp_path):
    # runs of a few milliseconds end between two of the launcher's NVML samples: the context
    # comes from the shim's own measurement (each process records what a budget would count,
    # INFO context.<dev>), and the advised budget holds the program at the predicted value
    ctx = 48 * MiB
    env = _env(sim, tmp_path, ctx_bytes=ctx)
    hold = sim.progs["hold"]
    r = sweep(
        env, "--values", "2MiB,4MiB,6MiB", "--predict", "8MiB", "-o", tmp_path / "sw",
        "--json", "--", hold, "--exit-after-ms", "1", "2", "{}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert all(run["seconds"] < 5 for run in doc["runs"]), doc["runs"]
    b = doc["prediction"]["budget"]
    assert b["context_bytes"] == ctx, b
    assert b["bytes"] >= 16 * MiB + ctx, b
    state = sim.new_state()
    env = _env(sim, tmp_path, ctx_bytes=ctx, state=state)
    run = subprocess.run(
        [sys.executable, "-m", "cudatrace", "run", "-q", "-o", tmp_path / "t"]
        + ["--budget", b["spec"], "--", hold, "--exit-after-ms", "1", "2", "8MiB"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0 and "budget exceeded" not in run.stderr, run.stdout + run.stderr


def test_numbers_too_large_are_refused_clearly(sim, tmp_path):
    env = _env(sim, tmp_path)
    hold = sim.progs["hold"]
    for args in (
        ["--values", "1e400,2"],
        ["--values", "1,2", "--predict", "1e400"],
        ["--values", "1,2", "--expect", "1e400"],
    ):
        r = sweep(env, *args, "-o", tmp_path / "x", "--", hold, "1", "{}m", timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr and "not a finite number" in r.stderr, r.stderr


def test_from_a_copy_never_reads_the_original(sim, tmp_path):
    env = _env(sim, tmp_path)
    orig = tmp_path / "sw"
    r = sweep(
        env, "--values", "1MiB,2MiB,3MiB", "-o", orig, "--json", "--",
        sim.progs["hold"], "--exit-after-ms", "1", "1", "{}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)["runs"]
    copy = tmp_path / "copy"
    shutil.copytree(orig, copy)
    gone = Path(runs[1]["directory"]).name
    shutil.rmtree(copy / gone)
    r = sweep(env, "--from", copy, "--json")
    doc = json.loads(r.stdout)
    dirs = [Path(x["directory"]) for x in doc["runs"]]
    assert all(d.parent == copy for d in dirs), dirs
    lost = doc["runs"][1]
    assert not lost["included"] and lost["ended"]["how"] == "no_trace", lost
    assert gone in lost["ended"]["text"] or gone in json.dumps(lost["ended"]), lost
    assert lost["peak_bytes"] is None


def test_every_advised_budget_is_one_the_tool_takes(sim, tmp_path):
    from cudatrace.record.budget import parse_budget

    env = _env(sim, tmp_path)
    sw = tmp_path / "sw"
    r = sweep(
        env, "--values", "1,2,3", "-o", sw, "--json", "--",
        sim.progs["hold"], "--exit-after-ms", "1", "{}", "1m",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for at in ("0", "-5", "1e15", "1e30"):
        r = sweep(env, "--from", sw, "--predict", at, "--json")
        assert r.returncode == 0, (at, r.stderr)
        b = json.loads(r.stdout)["prediction"]["budget"]
        if b is None:  # beyond any budget: said, never advised
            continue
        assert b["bytes"] > 0 and "e+" not in b["spec"], (at, b)
        parse_budget(b["spec"])
