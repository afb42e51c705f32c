"""Builds that every pytest-xdist worker of a session shares: built once, by the first worker
that asks, into a folder of the session's base temporary directory (every worker's lies in
it), the others waiting on a lock and reading what was built.

    paths = shared_build(tmp_path_factory, "asan", lambda d: {"dir": str(d)})

build(folder) returns a JSON-able value (paths as strings), which every asker gets back; a
build that raised is raised again in each asker (none is half-used)."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this session sees (the parent of the workers' base
    temporaries under xdist, the base temporary itself without it)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if base.name.startswith("popen-gw") else base
    shared = root / "shared-builds"
    shared.mkdir(exist_ok=True)
    return shared


def shared_build(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Any]
) -> Any:
    """build(folder) once per session, whichever worker asks first; its value for every one."""
    root = session_root(tmp_path_factory)
    folder, done = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            saved = json.loads(done.read_text())
            if "error" in saved:
                pytest.fail(
                    f"the shared build {name} failed (in another worker):\n{saved['error']}"
                )
            return saved["value"]
        folder.mkdir(exist_ok=True)
        try:
            value = build(folder)
        except BaseException as e:
            done.write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
            raise
        done.write_text(json.dumps({"value": value}))
        return value
