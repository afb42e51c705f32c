"""Budgets: group names, damaged ledgers, shares on integrated devices, a reset under live
members."""

from __future__ import annotations

from cudatrace.errors import RUN_FAILED
from support import children


def test_dot_group_refused(ct, sim, tmp_path):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    r = ct.run([sim.progs["route_link"]], "--group", ".hidden", "--budget", "1GiB", env=env)
    assert r.returncode == RUN_FAILED, r.stderr
    assert "invalid budget group name" in r.stderr and "'.'" in r.stderr
    assert not list(d.iterdir())


def test_ledger_with_garbage_fields_refused_before_any_write(ct, sim, tmp_path):
    """Valid magic, garbage fields: refused, unchanged, and the message says
    which file to delete."""
    from cudatrace.record.ledger import Ledger, group_path

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    import os

    os.environ["CUDATRACE_LEDGER_DIR"] = str(d)
    try:
        p = group_path("g", create_dir=True)
        Ledger.create(p, {0: 1 << 30}, group="g").close()
    finally:
        del os.environ["CUDATRACE_LEDGER_DIR"]
    b = bytearray(p.read_bytes())
    b[28:36] = b"\xff" * 8  # on_exceed and flags
    p.write_bytes(bytes(b))
    before = p.read_bytes()
    r = ct.run([sim.progs["route_link"]], "--group", "g", "--budget", "2GiB", env=env)
    assert r.returncode == RUN_FAILED, r.stderr
    assert "damaged" in r.stderr and f"rm {p}" in r.stderr, r.stderr
    assert p.read_bytes() == before


def test_share_budget_on_an_integrated_device(ct, sim, tmp_path):
    """--budget 60% on a unified-memory device (NVML: NOT_SUPPORTED), the README's
    headline platform: a share of the system memory the device uses."""
    import json

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env(integrated=1, total_bytes=24 << 30)
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    r = ct.run([sim.progs["route_link"]], "--budget", "60%", env=env)
    assert r.returncode == 0, r.stderr
    lim = json.loads((r.out / "run.json").read_text())["budget"]["limits"]["0"]
    # a share of what the driver reports as the device's memory (the simulated device's total)
    assert abs(lim - 0.6 * (24 << 30)) < 1 << 20, lim


def test_status_reset_is_safe_against_live_members(ct, sim, tmp_path):
    import subprocess
    import sys

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    a = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "-o",
            str(tmp_path / "a"),
            "--group",
            "g",
            "--budget",
            "1GiB",
            "--",
            str(sim.progs["hold"]),
            "1",
            "1m",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in children.lines(a):
        if line.strip() == "ready":
            break
    try:
        r = ct.cli("status", "g", "--reset", env=env)
        assert r.returncode == 2 and "in use by pids" in r.stderr, r.stderr
        assert (d / "g.ledger").exists()
    finally:
        a.terminate()
        a.communicate(timeout=60)
    r = ct.cli("status", "g", "--reset", env=env)
    assert r.returncode == 0, r.stderr
    assert not (d / "g.ledger").exists()
    r = ct.cli("status", "g", env=env)
    assert r.returncode == 2 and r.stderr.startswith("cudatrace: no budget group")
