"""Issue 11, rough edges: budget lines are rate-limited per call site; -q silences chatter but
never the denial (issue 20: the reason a program failed always prints)."""

from __future__ import annotations

import pytest

from support import children


@pytest.fixture
def env(ct, tmp_path):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    e = ct.env()
    e["CUDATRACE_LEDGER_DIR"] = str(d)
    return e


def test_denial_lines_rate_limited_per_site(ct, sim, env):
    # 200 allocations of 1 MiB under a 10 MiB budget: 190 denials at one call site
    r = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "--free", "200", "1m"],
        "--budget",
        "10MiB",
        env=env,
    )
    assert r.returncode == 1, r.stderr
    lines = [x for x in r.stderr.splitlines() if "budget exceeded" in x]
    assert 3 <= len(lines) <= 5, "\n".join(lines)
    assert "rate-limited" in lines[-1] or "further lines" in lines[-1]
    # the trace still has every denial
    from cudatrace.analyze.read.trace import read_dir
    from cudatrace.analyze.replay.model import build

    assert build(read_dir(r.out)).counts["denied"] == 190


def test_quiet_keeps_denial_lines(ct, sim, env):
    r = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "--free", "20", "1m"],
        "-q",
        "--budget",
        "10MiB",
        env=env,
    )
    assert r.returncode == 1, r.stderr
    shim = [x for x in r.stderr.splitlines() if "budget exceeded" in x]
    assert 1 <= len(shim) <= 5, r.stderr  # rate-limited as without -q
    assert any(x.startswith("cudatrace: denied ") for x in r.stderr.splitlines()), r.stderr
    # the chatter is gone: no progress line, no summary
    assert "cudatrace: tracing" not in r.stderr and "full report" not in r.stderr


def test_the_attributed_line_counts_the_groups_contexts(ct, sim, env):
    """Two runs in one group, each process's CUDA context 64 MiB: the second run's denial. The
    shim's line says the contexts of both processes; so does the launcher's attributed line
    (it said this run's own context alone: 64 MiB where the shim said 128 MiB of 2)."""
    import subprocess
    import sys

    e = dict(env, **ct.sim.env(state=ct.sim.new_state(), ctx_bytes=64 << 20))
    a = children.popen(
        [sys.executable, "-m", "cudatrace", "run", "-q", "--no-trace", "--group", "g", "--budget",
         "200MiB", "--", str(sim.progs["hold"]), "1", "8m"],
        env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while children.readline(a).strip() != "ready":
            assert a.poll() is None, children.said(a)
        r = ct.run([sim.progs["hold"], "--exit-after-ms", "1", "2", "64m"], "--group", "g", env=e)
    finally:
        a.terminate()
        a.communicate(timeout=30)
    assert r.returncode == 1, r.stderr
    shim = [x for x in r.stderr.splitlines() if "budget exceeded" in x]
    named = [x for x in r.stderr.splitlines() if x.startswith("cudatrace: denied ")]
    assert "CUDA contexts 128.00 MiB of 2 processes" in shim[0], r.stderr
    assert len(named) == 1 and "CUDA contexts 128.0 MiB)" in named[0], r.stderr
