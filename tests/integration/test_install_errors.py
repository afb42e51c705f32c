"""`pip install .` on a machine that lacks what the native build needs: the first thing the
build says is what is missing and how to get it, not a hundred lines of setuptools."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from support.paths import REPO


def test_pip_install_without_a_compiler_says_so_first(tmp_path):
    src = tmp_path / "src"  # a copy: pip builds in the source tree
    shutil.copytree(
        REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "tests", "_native")
    )
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--no-index", "-t", str(tmp_path / "site"), str(src)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    backend = out.split("lines of output]\n", 1)[1].split("[end of output]", 1)[0].splitlines()
    assert backend[0].strip() == (
        f"cudatrace: cannot build: missing a C compiler (CC={tmp_path / 'no-such-cc'} not found)."
    ), out
    assert "apt-get install gcc make" in backend[1]
    assert len(backend) <= 3, out  # the cause, and how to mend it: nothing buried
