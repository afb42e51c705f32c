"""Issue 11: the reader, fuzzed (hypothesis) on mutated and truncated real traces, in bounded
time and memory (support/fuzz_reader.py, in a subprocess under RLIMIT_AS)."""

from __future__ import annotations

import os
import subprocess
import sys

from support.paths import REPO
from support.tracegen import write_scenario

EXAMPLES = 400  # about 20 s on a 2-core machine
LIMIT = 2 << 30  # address space of the fuzzing process


def test_reader_fuzz(ct, sim, tmp_path):
    r = ct.run([sim.progs["route_link"]])
    assert r.returncode == 0, r.stderr
    real = sorted(r.out.glob("*.ctrace"))
    assert real
    write_scenario(tmp_path / "scen")
    files = [str(p) for p in real] + [str(tmp_path / "scen" / "1000.0.ctrace")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    res = subprocess.run(
        [sys.executable, "-m", "support.fuzz_reader", str(EXAMPLES), str(LIMIT), *files],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    assert "ok: %d examples" % EXAMPLES in res.stdout
