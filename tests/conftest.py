"""Shared fixtures: the simulated CUDA driver (support/sim_fixtures.py) and a `cudatrace run` helper."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support import children
from support.cli import checkout_env, cudatrace

# `sim`: the session-scoped simulated driver; the CPythons here (a missing one skipped or failed)
pytest_plugins = ["support.sim_fixtures", "support.pyprogs"]


def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="Write tests/golden/ from the current outputs instead of comparing "
        "(also CUDATRACE_UPDATE_GOLDENS=1; support/goldens.py).",
    )
    parser.addoption(
        "--update-docs",
        action="store_true",
        help="Write the parts of docs/ generated from native/include/settings.def and the "
        "outputs of the docs' runnable examples into the pages instead of comparing them "
        "(also CUDATRACE_UPDATE_DOCS=1; tests/unit/test_settings_docs.py, "
        "support/docs_examples.py).",
    )


_PYCACHE: Path | None = None  # the folder this run's bytecode went to, made here (the controller)


def pytest_configure(config):
    # With PYTHONDONTWRITEBYTECODE set (as on many CI images, this one's included) every Python
    # the tests start compiled cudatrace again: ~0.1 s of CPU for each of ~900 starts. The run's
    # processes (xdist's workers, every `python -m cudatrace`) keep their bytecode in one folder
    # of this run instead, never in the tree; the folder goes with the run.
    global _PYCACHE
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        _PYCACHE = Path(tempfile.mkdtemp(prefix="cudatrace-tests-pycache-"))
        del os.environ["PYTHONDONTWRITEBYTECODE"]
        os.environ["PYTHONPYCACHEPREFIX"] = str(_PYCACHE)


def pytest_unconfigure(config):
    if _PYCACHE is not None:
        shutil.rmtree(_PYCACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_process_left():
    """What a test started through support/children.py and left running (a timeout, a failed
    assertion before its stop) is killed when it ends, with its descendants."""
    yield
    children.leftovers()


@pytest.fixture(scope="session", autouse=True)
def native_built():
    from cudatrace import native

    return native.ensure_built()


class CT:
    """Runs `python3 -m cudatrace ...` against the simulated driver."""

    def __init__(self, sim, base: Path):
        self.sim = sim
        self.base = base
        self.n = 0

    def env(self, **sim_opts) -> dict:
        env = dict(os.environ)
        env.update(self.sim.env(**sim_opts))
        return checkout_env(env, cache=self.base / "symcache")

    def new_dir(self) -> Path:
        self.n += 1
        return self.base / ("trace%d" % self.n)

    def cli(self, *args, env=None, timeout=120, **kw) -> subprocess.CompletedProcess:
        return cudatrace(env or self.env(), *args, timeout=timeout, **kw)

    def run(self, cmd, *opts, out=None, env=None, timeout=120, sim_opts=None):
        out = out or self.new_dir()
        r = self.cli(
            "run",
            "-o",
            out,
            *opts,
            "--",
            *map(str, cmd),
            env=env or self.env(**(sim_opts or {})),
            timeout=timeout,
        )
        r.out = out
        return r


@pytest.fixture
def ct(sim, tmp_path):
    return CT(sim, tmp_path)
