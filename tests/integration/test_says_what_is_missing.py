"""A run or sweep in which no process used the CUDA driver says so, names --simulated where
there is no driver, and a sweep gives no --expect verdict without laws (issue 44, item 3)."""

from __future__ import annotations

import json
import sys

from cudatrace.record.cudadrv import driver_library

# a Python program that needs the driver, as a user's ctypes server does
NEEDS_DRIVER = "import ctypes, sys; ctypes.CDLL('libcuda.so.1'); sys.exit(0)"


def _no_driver_env(ct) -> dict:
    """The tests' environment without the simulated driver on the library path."""
    return {k: v for k, v in ct.env().items() if k not in ("LD_LIBRARY_PATH", "CUDASIM_STATE")}


def test_a_run_without_the_driver_says_so_and_names_simulated(ct, tmp_path):
    # it said "no device memory was allocated through the driver", and nothing of why
    env = _no_driver_env(ct)
    r = ct.run([sys.executable, "-c", NEEDS_DRIVER], env=env)
    assert r.returncode == 1, r.stderr  # the program's own: libcuda.so.1 cannot be opened
    where = driver_library(env)
    if where is None:  # a machine without an NVIDIA driver (CI)
        said = (
            "no process used the CUDA driver: libcuda.so.1 is not on this machine (no NVIDIA "
            "driver), so nothing could load it. Without a GPU, run on cudatrace's simulated "
            "driver: cudatrace run --simulated -- "
        )
        assert said in r.stderr, r.stderr
    else:
        assert f"no process used the CUDA driver ({where})" in r.stderr, r.stderr


def test_a_run_that_never_loads_the_driver_it_has_says_so(ct, sim, tmp_path):
    r = ct.run(["true"])
    assert r.returncode == 0, r.stderr
    lib = sim.lib / "libcuda.so.1"
    said = f"no process used the CUDA driver ({lib}): the command never loaded it, or never"
    assert said in r.stderr, r.stderr
    # on the simulated driver it names that one
    r = ct.run(["true"], "--simulated")
    assert "no process used the CUDA driver (cudatrace's simulated libcuda.so.1)" in r.stderr


def test_a_sweep_without_the_driver_says_so_and_gives_no_verdict(ct, tmp_path):
    # it printed "nothing grows more than 10% faster than expected" with no law behind it
    out = tmp_path / "sw"
    env = _no_driver_env(ct)
    cmd = [sys.executable, "-c", NEEDS_DRIVER + "  # {}"]
    r = ct.cli("sweep", "-o", out, "--values", "1,2,3", "--expect", "1", "--", *cmd, env=env)
    assert r.returncode == 1, r.stderr
    assert "no verdict: fewer than two runs went into the laws" in r.stdout, r.stdout
    assert "nothing grows" not in r.stdout
    assert "note: no run used the CUDA driver" in r.stdout, r.stdout
    if driver_library(env) is None:
        assert "add --simulated to the sweep" in r.stdout, r.stdout
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["expect_checked"] is False
    assert any(n.startswith("no run used the CUDA driver") for n in doc["notes"]), doc["notes"]
    # with laws behind it, a verdict
    ok = tmp_path / "ok"
    r = ct.cli("sweep", "-o", ok, "--values", "1,2", "--expect", "1", "--", "true", "{}")
    assert "nothing grows more than 10% faster than expected" in r.stdout, r.stdout
    assert json.loads((ok / "sweep.json").read_text())["expect_checked"] is True
