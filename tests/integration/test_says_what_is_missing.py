"""A run or sweep in which no process used the CUDA driver says so, names --simulated where
there is no driver, and a sweep gives no --expect verdict without laws (issue 44, item 3)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import sys

from cudatrace.record.cudadrv import driver_library
from support import children
from support.paths import REPO

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


# ---- text fits the terminal ------------------------------------------------------------------


def _in_a_terminal(ct, *args, columns: int = 80) -> str:
    """What `cudatrace ARGS` prints on a terminal of that many columns (a pty), both streams."""
    m, s = pty.openpty()
    env = dict(ct.env(), COLUMNS=str(columns), NO_COLOR="1")
    p = children.popen(
        [sys.executable, "-m", "cudatrace", *map(str, args)], stdin=s, stdout=s, stderr=s, env=env
    )
    os.close(s)
    out = b""
    while select.select([m], [], [], 120)[0]:
        try:
            chunk = os.read(m, 65536)
        except OSError:  # the other end closed: the command is done
            break
        if not chunk:
            break
        out += chunk
    os.close(m)
    children.wait(p, 60)
    return out.decode(errors="replace").replace("\r\n", "\n")


def _prose_too_wide(text: str, columns: int) -> list[str]:
    """Lines wider than the terminal that are not a table's row (two column gaps or more) and
    that could have been broken (a line of one word, a long path alone, cannot)."""
    return [
        x
        for x in text.splitlines()
        if len(x) > columns and len(x.split()) > 1 and len(re.findall(r"\S {2,}\S", x.lstrip())) < 2
    ]


def test_text_wraps_at_the_terminals_width(ct, sim, tmp_path):
    # at COLUMNS=80 the summary, the report and doctor printed lines of 102 to 143 columns
    prog = [sys.executable, REPO / "examples" / "tiny-train" / "train.py"]
    run = _in_a_terminal(ct, "run", "--simulated", "-o", tmp_path / "t1", "--", *prog)
    report = _in_a_terminal(ct, "report", tmp_path / "t1")
    doctor = _in_a_terminal(ct, "doctor", sim.progs["route_dlsym"])
    for text in (run, report, doctor):
        assert not _prose_too_wide(text, 80), text
    # wrapped, not cut: the words are all there, on lines that go on under their value
    assert "cudatrace: tracing " in run and "/t1\n" in run, run
    assert (
        "device allocations 19, frees 16, failed 0, denied by budget 0; pinned host\n    allocations 0"
        in run
    ), run
    # written to a pipe, a line stays whole
    piped = ct.cli("report", tmp_path / "t1", env=dict(ct.env(), COLUMNS="80")).stdout
    assert any(len(x) > 80 for x in piped.splitlines()), piped
