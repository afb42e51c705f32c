"""`cudatrace run --simulated`: a program runs on cudatrace's simulated CUDA driver without a
GPU and without any setting of its own (no LD_LIBRARY_PATH, no CUDASIM_*): a Python program
through ctypes (the shipped examples/tiny-train), a C program linked against libcuda.so.1, a
sweep; the report says the run was simulated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import checkout_env, cudatrace
from support.paths import REPO

TRAIN = REPO / "examples" / "tiny-train" / "train.py"
MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment of someone without a GPU: nothing of the simulator set by hand; one
    cache for the module (the simulator is built once)."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CUDASIM_") and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")
    }
    base["CUDATRACE_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return checkout_env(base)


def _report(env, out) -> dict:
    r = cudatrace(env, "report", out, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_python_program_through_ctypes(env, tmp_path):
    out = tmp_path / "t"
    r = cudatrace(env, "run", "--simulated", "-o", out, "--", sys.executable, TRAIN)
    assert r.returncode == 0, r.stderr
    assert "tiny-train: 3 steps" in r.stdout
    assert "on the simulated CUDA driver: one device of 16.0 GiB, no GPU used" in r.stderr
    rep = _report(env, out)
    assert rep["versions"]["simulated"] == 16 * GiB
    assert rep["peak_bytes"] == 4 * 64 * MiB + 4 * 32 * MiB + 3 * 16 * MiB
    names = [s["frames"][0]["function"] for s in rep["sites"]]
    assert names == ["load_weights", "forward", "remember"], names
    assert rep["never_freed"]["bytes"] == 3 * 16 * MiB
    text = cudatrace(env, "report", out)
    assert (
        "driver      cudatrace's simulated CUDA driver (--simulated: one device of 16.0 GiB)"
        in (text.stdout)
    )
    # the state of the simulated device is the run's own, gone with it
    assert not list(Path(env["CUDATRACE_CACHE"]).glob("simdriver-*/.device-*.state"))


def test_c_program_linked_against_libcuda(env, sim, tmp_path):
    prog = sim.progs["route_link"]  # -lcuda: needs libcuda.so.1 from the loader
    bare = subprocess.run([prog], env=env, capture_output=True, text=True)
    assert bare.returncode != 0 and "libcuda.so.1" in bare.stderr, bare.stderr
    out = tmp_path / "t"
    r = cudatrace(env, "run", "--simulated", "-o", out, "--", prog)
    assert r.returncode == 0, r.stderr
    rep = _report(env, out)
    assert rep["counts"]["allocs"] > 0 and rep["versions"]["simulated"] == 16 * GiB


def test_sim_memory_sizes_the_device(env, tmp_path):
    # 4 layers of 64 MiB weights do not fit a device of 128 MiB: the driver says out of memory
    out = tmp_path / "t"
    r = cudatrace(
        env, "run", "--simulated", "--sim-memory", "128MiB", "-o", out, "--", sys.executable, TRAIN
    )
    assert r.returncode == 1, r.stderr
    assert "CUresult 2" in r.stderr  # CUDA_ERROR_OUT_OF_MEMORY
    rep = _report(env, out)
    assert rep["versions"]["simulated"] == 128 * MiB
    assert rep["failed"] and rep["failed"][0]["errors"][0]["name"] == "CUDA_ERROR_OUT_OF_MEMORY"


@pytest.mark.parametrize(
    "opts, said",
    [
        (["--sim-memory", "1GiB"], "--sim-memory sizes the simulated device: add --simulated"),
        (["--simulated", "--sim-memory", "16"], "--sim-memory 16: 16 bytes is no device"),
    ],
)
def test_sim_memory_mistakes_are_refused(env, tmp_path, opts, said):
    r = cudatrace(env, "run", *opts, "-o", tmp_path / "t", "--", "true")
    assert r.returncode == 125 and said in r.stderr, r.stderr
    assert not (tmp_path / "t").exists()


def test_aggregate_run_says_so_at_the_top(env, tmp_path):
    out = tmp_path / "t"
    r = cudatrace(env, "run", "--simulated", "--aggregate", "-o", out, "--", sys.executable, TRAIN)
    assert r.returncode == 0, r.stderr
    head = cudatrace(env, "report", out).stdout.splitlines()[:4]
    assert any(line.startswith("  aggregate   an --aggregate trace") for line in head), head


def test_report_of_a_sweep_folder_says_what_to_run(env, tmp_path):
    sw = tmp_path / "sw"
    r = cudatrace(
        env, "sweep", "--simulated", "--values", "2,4", "-o", sw, "--",
        sys.executable, TRAIN, "--batch", "{}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "16.0 MiB per 1 of --batch" in r.stdout, r.stdout  # forward: 4 layers x 4 MiB
    rep = cudatrace(env, "report", sw)
    assert rep.returncode == 2, rep.stdout
    assert f"{sw} is a sweep" in rep.stderr, rep.stderr
    assert f"cudatrace sweep --from {sw}" in rep.stderr
    assert f"cudatrace report {sw}/batch=2" in rep.stderr
    assert f"cudatrace diff {sw}/batch=2 {sw}/batch=4" in rep.stderr
