"""Issue 21 items 5 and 14: a trace directory belongs to one run at a time, and `-o ''` is no
directory at all."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from cudatrace.analyze.read.trace import read_dir
from cudatrace.errors import RUN_FAILED
from support import children


def test_a_running_trace_directory_is_never_taken_over(ct, sim, tmp_path):
    out = tmp_path / "t"
    hold = sim.progs["hold"]
    a = children.popen(
        [sys.executable, "-m", "cudatrace", "run", "--force", "-o", out, "--"]
        + [str(hold), "--exit-after-ms", "2500", "1", "3m"],
        env=ct.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 30
    while time.time() < deadline and not list(out.glob("*.ctrace")):
        time.sleep(0.05)
    assert list(out.glob("*.ctrace")), "A never started"
    b = ct.cli("run", "--force", "-o", out, "--", hold, "--exit-after-ms", "1", "1", "5m")
    assert b.returncode == RUN_FAILED, b.stderr
    assert "in use by another cudatrace run" in b.stderr, b.stderr
    _, err = a.communicate(timeout=60)
    assert a.returncode == 0, err
    # A's trace and A's run.json, and A's summary tells A's numbers
    td = read_dir(out)
    assert len(td.traces) == 1 and td.run["pid"] == td.traces[0].pid
    assert json.loads((out / "run.json").read_text())["argv"][-1] == "3m"
    assert "peak of live device memory: 3.00 MiB" in err, err
    assert not (out / ".cudatrace.lock").exists()
    # finished: --force replaces it now
    c = ct.cli("run", "--force", "-q", "-o", out, "--", hold, "--exit-after-ms", "1", "1", "5m")
    assert c.returncode == 0, c.stderr


def test_empty_output_is_refused(ct, sim, tmp_path):
    r = ct.cli(
        "run", "-o", "", "--", sim.progs["hold"], "--exit-after-ms", "1", "1", "1m", cwd=tmp_path
    )
    assert r.returncode == RUN_FAILED, r.stderr
    assert "empty" in r.stderr, r.stderr
    assert not list(tmp_path.glob("*.ctrace")) and not (tmp_path / "run.json").exists()
