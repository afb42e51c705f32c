"""Budgets enforced by the shim, on the simulated driver: fail / warn / abort, the hard limit
under many threads and processes, co-tenant groups, dead members, and what sizing code sees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cudatrace.analyze.read.trace import C, iter_events, read_dir
from cudatrace.errors import RUN_FAILED
from support import children

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture
def ledger_dir(tmp_path, monkeypatch):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    return d


def env_for(ct, ledger_dir, **sim):
    env = ct.env(**sim)
    env["CUDATRACE_LEDGER_DIR"] = str(ledger_dir)
    return env


def meminfo_lines(stdout):
    out = []
    for line in stdout.splitlines():
        p = line.split()
        if p and p[0] == "meminfo":
            out.append(
                (
                    p[1],
                    None if p[2] == "-" else int(p[2]),
                    None if p[3] == "-" else int(p[3]),
                    int(p[4]),
                )
            )
    return out


def test_malformed_budget_is_refused_before_starting(ct, sim, ledger_dir, tmp_path):
    marker = tmp_path / "started"
    for spec in ["8XB", "", "-1GiB", "0", "150%", "abc", "0=1GiB,0=2GiB"]:
        r = ct.cli(
            "run",
            "-o",
            ct.new_dir(),
            "--budget",
            spec,
            "--",
            "touch",
            marker,
            env=env_for(ct, ledger_dir),
        )
        assert r.returncode == RUN_FAILED, (spec, r.stderr)
        assert "--budget" in r.stderr and "GiB" in r.stderr, r.stderr  # lists the forms
        assert not marker.exists()


def test_fail_mode_denies_with_one_clear_line(ct, sim, ledger_dir):
    r = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "--free", "3", "1g"],
        "--budget",
        "2GiB",
        env=env_for(ct, ledger_dir),
    )
    assert r.returncode == 1, r.stderr  # hold: one allocation failed
    lines = [l for l in r.stderr.splitlines() if l.startswith("cudatrace: budget exceeded:")]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert "cuMemAlloc_v2 of 1.00 GiB on device 0" in line
    assert "budget 2.00 GiB, in use 2.00 GiB" in line
    assert "hold_alloc" in line  # the call site, named
    assert "CUDA_ERROR_OUT_OF_MEMORY" in line
    results = [int(l.split()[4]) for l in r.stdout.splitlines() if l.startswith("alloc ")]
    assert results == [0, 0, 2]
    t = read_dir(r.out).traces[0]
    denials = [e for e in iter_events(t) if e["op"] == C()["CT_OP_DENY"]]
    assert len(denials) == 1 and denials[0]["size"] == GiB and denials[0]["result"] == 2
    assert denials[0]["stack"] != 0
    assert t.info.get("budget.0") == str(2 * GiB)
    assert t.complete and t.end.exit_code == 1  # the status exit() was given, in END


def test_warn_mode_allows_and_says_so(ct, sim, ledger_dir):
    r = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "--free", "3", "1g"],
        "--budget",
        "2GiB",
        "--on-exceed",
        "warn",
        env=env_for(ct, ledger_dir),
    )
    assert r.returncode == 0, r.stderr
    assert "allowed (--on-exceed warn)" in r.stderr
    t = read_dir(r.out).traces[0]
    K = C()
    allocs = [e for e in iter_events(t) if e["op"] == K["CT_OP_ALLOC"]]
    assert len(allocs) == 3 and all(e["result"] == 0 for e in allocs)
    assert sum(1 for e in allocs if e["flags"] & K["CT_EF_BUDGET_WARN"]) == 1


def test_abort_mode_stops_the_tree(ct, sim, ledger_dir):
    # a shell with two workers: one overshoots, both must end, cudatrace exits non-zero
    script = "{} 1 100m & {} --exit-after-ms 2000 3 1g; wait".format(
        sim.progs["hold"],
        sim.progs["hold"],
    )
    r = ct.run(
        ["/bin/sh", "-c", script],
        "--budget",
        "1GiB",
        "--on-exceed",
        "abort",
        env=env_for(ct, ledger_dir),
        timeout=60,
    )
    assert r.returncode != 0
    assert "stopping the process tree (--on-exceed abort)" in r.stderr
    assert json.loads((r.out / "run.json").read_text())["budget_aborted"] is True


def test_hammer_never_exceeds_budget(ct, sim, ledger_dir):
    """4 processes x 32 threads allocating against one budget: the simulated device's own
    high-water mark never passes it, and everything is given back."""
    state = sim.new_state()
    budget = 64 * MiB
    hammer = sim.progs["hammer" if "hammer" in sim.progs else "budget_hammer"]
    script = " & ".join([f"{hammer} 32 300 1m"] * 4) + "; wait"
    r = ct.run(
        ["/bin/sh", "-c", script],
        "--budget",
        str(budget),
        "--stack-depth",
        "4",
        env=env_for(ct, ledger_dir, state=state),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    oks = [l for l in r.stdout.splitlines() if l.startswith("ok ")]
    assert len(oks) == 4
    n_oom = sum(int(l.split()[3]) for l in oks)
    assert n_oom > 0, "the budget was never reached: the test proves nothing"
    dev = sim.stats(state)[0]
    assert dev["hwm"] <= budget, dev
    assert dev["used"] == 0
    final = json.loads((r.out / "run.json").read_text())["ledger_final"]
    assert all(d["in_use"] == 0 for d in final["devices"]), final["devices"]


def test_group_shared_by_two_runs_and_dead_member_gives_back(ct, sim, ledger_dir):
    state = sim.new_state()
    env = env_for(ct, ledger_dir, state=state)
    out_a = ct.new_dir()
    a = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "-o",
            str(out_a),
            "--group",
            "team",
            "--budget",
            "10GiB",
            "--",
            str(sim.progs["hold"]),
            "1",
            "6g",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in children.lines(a):
        if line.strip() == "ready":
            break
    st = ct.cli("status", "team", "--json", env=env)
    assert st.returncode == 0, st.stderr
    assert "team" in st.stdout
    # B joins the group (no --budget of its own) and is held to what is left: 4 GiB
    b = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "--free", "1", "6g"],
        "--group",
        "team",
        env=env,
    )
    assert b.returncode == 1 and "budget exceeded" in b.stderr, b.stderr
    assert "in use 6.00 GiB" in b.stderr
    # A's process dies by SIGKILL: its bytes go back to the group
    pid = int(next(out_a.glob("*.ctrace")).name.split(".")[0])
    os.kill(pid, signal.SIGKILL)
    a.communicate(timeout=60)
    time.sleep(1.1)  # reclaim runs at most once a second
    c = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "--free", "1", "6g"],
        "--group",
        "team",
        env=env,
    )
    assert c.returncode == 0, c.stderr


def test_sizing_code_sees_the_budget(ct, sim, ledger_dir):
    total = 16 * GiB
    r = ct.run(
        [sim.progs["meminfo"], "--alloc", "1g"],
        "--budget",
        "4GiB",
        env=env_for(ct, ledger_dir, total_bytes=total),
    )
    assert r.returncode == 0, r.stderr + r.stdout
    seen = meminfo_lines(r.stdout)
    assert len(seen) >= 8
    for api, t, f, res in seen:
        if res != 0:
            continue  # NVML's deliberate error cases
        if t is not None:
            assert t == 4 * GiB, (api, t)
        if f is not None:
            assert f == 3 * GiB, (api, f)
    # NULL out-pointers were accepted as the driver accepts them
    assert ("cuMemGetInfo_v2", None, None, 0) in seen
    ev = [e for e in iter_events(read_dir(r.out).traces[0]) if e["op"] == C()["CT_OP_MEMINFO"]]
    assert ev and all(e["flags"] & C()["CT_EF_VIRTUALIZED"] for e in ev if e["result"] == 0)
    assert any(e["aux2"] == total for e in ev)  # the device's own figure is kept too

    r = ct.run(
        [sim.progs["meminfo"], "--alloc", "1g"],
        "--budget",
        "4GiB",
        "--no-virtualize",
        env=env_for(ct, ledger_dir, total_bytes=total),
    )
    assert all(t in (None, total) for api, t, f, res in meminfo_lines(r.stdout) if res == 0)


def test_usage_above_budget_reads_as_zero_free(ct, sim, ledger_dir):
    r = ct.run(
        [sim.progs["meminfo"], "--alloc", "2g", "--no-nvml"],
        "--budget",
        "1GiB",
        "--on-exceed",
        "warn",
        env=env_for(ct, ledger_dir),
    )
    assert r.returncode == 0, r.stderr
    for _api, t, f, _res in meminfo_lines(r.stdout):
        if t is not None:
            assert t == GiB
        if f is not None:
            assert f == 0


def test_percent_budget_resolves_from_device_size(ct, sim, ledger_dir):
    r = ct.run(
        [sim.progs["meminfo"], "--no-nvml"],
        "--budget",
        "25%",
        env=env_for(ct, ledger_dir, total_bytes=16 * GiB),
    )
    assert r.returncode == 0, r.stderr
    assert {t for _, t, _, res in meminfo_lines(r.stdout) if t is not None} == {4 * GiB}


def test_vmm_memory_released_while_mapped_stays_counted(ct, sim, ledger_dir):
    """cuMemRelease of a mapped handle frees nothing until its last cuMemUnmap (real VMM
    semantics): route_link releases its 16 MiB handle while mapped, then asks for 19 MiB of
    graph memory. With 76 MiB live (handle included) a 90 MiB budget must refuse it; counting
    the handle as freed would have allowed it (79 MiB)."""
    r = ct.run([sim.progs["route_link"]], "--budget", "90MiB", env=env_for(ct, ledger_dir))
    lines = [l.split() for l in r.stdout.splitlines() if l.startswith(("alloc ", "free "))]
    graph = [l for l in lines if l[1] == "cuGraphAddMemAllocNode"]
    assert graph and graph[0][4] == "2", r.stdout
    assert "cuGraphAddMemAllocNode of 19.00 MiB" in r.stderr
    # and after the unmap the bytes do come back: the run ends with nothing in use
    final = json.loads((r.out / "run.json").read_text())["ledger_final"]
    assert all(d["in_use"] == 0 for d in final["devices"])


def test_pinned_host_memory_counts_on_integrated_devices(ct, sim, ledger_dir):
    """On a unified-memory device (Jetson) pinned host memory is the same DRAM: it counts.
    route_link has 70.2 MiB of device memory live when it pins 17 MiB, then 18 MiB more."""
    r = ct.run(
        [sim.progs["route_link"]], "--budget", "90MiB", env=env_for(ct, ledger_dir, integrated=True)
    )
    res = {l.split()[1]: l.split()[4] for l in r.stdout.splitlines() if l.startswith("alloc ")}
    assert res["cuMemHostAlloc"] == "0" and res["cuMemAllocHost_v2"] == "2", r.stdout
    assert "cuMemAllocHost_v2 of 18.00 MiB" in r.stderr
    # the same program on a discrete device: host memory is not the device's, nothing denied there
    r = ct.run([sim.progs["route_link"]], "--budget", "90MiB", env=env_for(ct, ledger_dir))
    res = {l.split()[1]: l.split()[4] for l in r.stdout.splitlines() if l.startswith("alloc ")}
    assert res["cuMemAllocHost_v2"] == "0"
    # unless asked: --count-host
    r = ct.run(
        [sim.progs["route_link"]], "--budget", "90MiB", "--count-host", env=env_for(ct, ledger_dir)
    )
    res = {l.split()[1]: l.split()[4] for l in r.stdout.splitlines() if l.startswith("alloc ")}
    assert res["cuMemAllocHost_v2"] == "2"


def test_budget_typos_are_refused_or_read(ct, sim):
    """`--budget 12` was 12 bytes (every allocation denied): refused, with the fix; `--budget 12
    GiB` ran a command named GiB ("command not found"): the unit is read."""
    r = ct.run([sim.progs["hold"], "--exit-after-ms", "1", "1", "1m"], "--budget", "12")
    assert r.returncode == RUN_FAILED and "has no unit" in r.stderr and "write 12GiB" in r.stderr, (
        r.stderr
    )
    out = ct.new_dir()
    r = ct.cli("run", "-o", out, "--budget", "12", "MiB", "--", sim.progs["hold"],
               "--exit-after-ms", "1", "2", "8m")  # fmt: skip
    assert r.returncode == 1 and "budget 12.00 MiB, in use 8.00 MiB" in r.stderr, r.stderr
