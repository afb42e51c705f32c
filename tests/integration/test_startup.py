"""`cudatrace run` loads only what a run needs: the analysis and the symbolizer come after the
command has ended (for the summary), never before it starts. Checked on what Python imported,
not on time (tools/bench_startup.py measures the time)."""

from __future__ import annotations

import os
import subprocess
import sys

from support.paths import REPO

NOT_FOR_A_RUN = (
    "cudatrace.analyze",
    "cudatrace.present",
    "cudatrace.symbols",
    "elftools",
    "pycparser",
)


def imported(args: list[str], tmp_path) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cudatrace", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    return [
        line.split("|")[-1].strip()
        for line in r.stderr.splitlines()
        if line.startswith("import time:")
    ]


def test_a_quiet_run_loads_no_analysis(tmp_path):
    mods = imported(["run", "-q", "-o", str(tmp_path / "t"), "--", "true"], tmp_path)
    assert "cudatrace.record.launcher" in mods
    late = [m for m in mods if m.startswith(NOT_FOR_A_RUN)]
    assert not late, f"a plain run imported {late}"


def test_the_summary_is_loaded_after_the_launcher(tmp_path):
    mods = imported(["run", "-o", str(tmp_path / "t"), "--", "true"], tmp_path)
    assert "cudatrace.present.summary" in mods
    assert mods.index("cudatrace.present.summary") > mods.index("cudatrace.record.launcher")
