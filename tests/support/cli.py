"""`python -m cudatrace ...` of this checkout in a child process: the one way tests run the
command line from outside (the `ct` fixture of tests/conftest.py, the kvpool walkthrough, the
layers, exports and goldens)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import children
from .paths import REPO


def checkout_env(env: dict | None = None, cache: Path | None = None) -> dict:
    """env (default os.environ) for a child that imports this checkout's cudatrace first, with
    the symbolizer's cache under cache when given (unless env sets one)."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    if cache is not None:
        out.setdefault("CUDATRACE_CACHE", str(cache))
    return out


def cudatrace(
    env: dict[str, str], *args: object, timeout: float = 180, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run `python -m cudatrace ARGS` (text, output captured) and return its result; past the
    timeout it is killed with what it started (children.run)."""
    return children.run(
        [sys.executable, "-m", "cudatrace", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )
