"""The KV-pool walkthrough (examples/kv-pool, `cudatrace demo`) on the simulated driver.

kvpool sizes its KV cache as the original server did: --num-blocks verbatim, else
--kv-cache-memory / bytes per block (counting ONE layer: the defect), else 256 blocks, then
allocates one pool per layer (28). On a simulated 122 GiB integrated device (a Jetson Thor):
the three sizing settings are traced, the report names allocate_layer_kv with 28
allocations, the diff shows that site shrinking under --num-blocks 64, and --budget 12GiB stops
the oversized pool with a line naming the function and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from support.cli import cudatrace as cli
from support.kvpool import (  # noqa: F401  (kvpool: a fixture)
    LAYERS,
    PAGE,
    THOR,
    WEIGHTS,
    WORKSPACE,
    GiB,
    kvpool,
    thor_env,
    trace,
)
from support.paths import REPO

SITE = ("allocate_layer_kv", "allocate_kv_cache")


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def walk(sim, kvpool, tmp_path_factory):
    """The walkthrough's three traced runs, once for the module."""
    base = tmp_path_factory.mktemp("kvwalk")
    env = thor_env(sim, base)
    runs = {
        "big": trace(env, base / "kv-1GiB", kvpool, "--kv-cache-memory", "1GiB"),
        "small": trace(env, base / "blocks-64", kvpool, "--num-blocks", "64"),
        "fallback": trace(env, base / "fallback", kvpool),
    }
    runs["env"] = env
    return runs


def _ok(r):
    return f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


def model_sites(trace_dir: Path):
    from cudatrace.analyze.read.trace import read_dir
    from cudatrace.analyze.replay.model import build
    from cudatrace.analyze.sites.group import group
    from cudatrace.analyze.sites.stacks import Stacks, make_symbolizer

    td = read_dir(trace_dir)
    m = build(td)
    return m, group(m, m.live_at_peak, Stacks(td.traces, make_symbolizer()), "site", 1)


# ---- kvpool itself --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags,blocks",
    [
        (["--kv-cache-memory", "1GiB"], 16384),  # 1 GiB / 64 KiB: the defect
        (["--kv-cache-memory", "512MiB"], 8192),
        (["--kv-cache-memory=1073741824"], 16384),
        (["--num-blocks", "64"], 64),
        (["--num-blocks", "64", "--kv-cache-memory", "1GiB"], 64),  # --num-blocks wins
        ([], 256),  # the fallback
        (["--kv-cache-memory", "1GiB", "--fixed-sizing"], GiB // (PAGE * LAYERS)),
    ],
)
def test_kvpool_sizing_precedence(sim, kvpool, flags, blocks):
    r = subprocess.run(
        [str(kvpool), *flags],
        env=sim.env(total_bytes=THOR, integrated=1),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, _ok(r)
    assert re.search(r"num_blocks = %d\b" % blocks, r.stdout), r.stdout
    pool = blocks * PAGE * LAYERS
    assert "(%d bytes;" % pool in r.stdout, r.stdout
    assert re.search(r"^ready\b", r.stdout, re.M), r.stdout
    assert "shut down cleanly" in r.stdout


def test_kvpool_failure_names_function_and_exits_1(sim, kvpool):
    """On a 12 GiB device the oversized pool fails: CUresult and function, exit 1, not ready."""
    r = subprocess.run(
        [str(kvpool), "--kv-cache-memory", "1GiB"],
        env=sim.env(state=sim.new_state(), total_bytes=12 * GiB),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, _ok(r)
    assert "allocate_layer_kv: cuMemAlloc_v2" in r.stderr
    assert "CUDA_ERROR_OUT_OF_MEMORY" in r.stderr and "CUresult 2" in r.stderr
    assert "layer 10" in r.stderr  # 1.3 + 0.25 + 10 x 1 GiB fit, the 11th not
    assert not re.search(r"^ready\b", r.stdout, re.M)


def test_kvpool_bad_arguments(sim, kvpool):
    for args in (["--kv-cache-memory", "lots"], ["--num-blocks", "0"], ["--frobnicate", "1"]):
        r = subprocess.run(
            [str(kvpool), *args], env=sim.env(), capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 2, (args, _ok(r))


# ---- the walkthrough: run, report, diff, budget ---------------------------------------------


def test_three_runs_are_traced(walk):
    expect = {"big": 16384, "small": 64, "fallback": 256}
    for name, blocks in expect.items():
        r = walk[name]
        assert r.returncode == 0, _ok(r)
        assert list(r.out.glob("*.ctrace")), name
        assert "num_blocks = %d " % blocks in r.stdout
        m, sites = model_sites(r.out)
        pool = blocks * PAGE * LAYERS
        assert m.peak_bytes == WEIGHTS + WORKSPACE + pool, (name, m.peak_bytes)
        assert m.end_bytes == 0  # kvpool frees everything
        by_fn = {s.frames[0].function: s for s in sites if s.frames}
        kv = by_fn["allocate_layer_kv"]
        assert kv.count == LAYERS and kv.bytes == pool, name
        assert kv.sizes == [blocks * PAGE] * LAYERS
        if name == "big":  # 28 GiB: by far the biggest site
            assert sites[0] is kv
        fns = set(by_fn)
        assert {"load_weights", "reserve_workspace"} <= fns


def test_run_summary_names_per_layer_site(walk):
    err = walk["big"].stderr
    assert re.search(r"28 x\s+allocate_layer_kv \(kvpool\.c:\d+\) via tensor_make", err), err
    assert not re.search(r" x  (device_carve|backend_acquire|tensor_make) ", err), err


def test_report_json_top_site_is_per_layer_allocation(walk):
    r = cli(walk["env"], "report", walk["big"].out, "--json")
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    assert doc["peak_bytes"] == WEIGHTS + WORKSPACE + LAYERS * GiB
    top = doc["sites"][0]
    assert top["frames"][0]["function"] in SITE, top["label"]
    assert top["count"] == LAYERS and top["bytes"] == LAYERS * GiB, top
    assert top["sizes"]["min"] == top["sizes"]["max"] == GiB
    assert top["api"] == ["cuMemAlloc_v2"]
    # the allocator layer it went through, then the stack on through the per-layer loop
    assert [f["function"] for f in top["via"]] == ["device_carve", "backend_acquire", "tensor_make"]
    callers = [f["function"] for f in top["context"]]
    assert callers[:6] == [
        "device_carve",
        "backend_acquire",
        "tensor_make",
        "allocate_layer_kv",
        "allocate_kv_cache",
        "main",
    ], callers
    assert doc["attribution"]["layers"] == ["tensor_make"]
    others = {site["frames"][0]["function"] for site in doc["sites"][1:] if site["frames"]}
    assert {"load_weights", "reserve_workspace"} <= others


def test_report_text_names_per_layer_site_first(walk):
    r = cli(walk["env"], "report", walk["big"].out)
    assert r.returncode == 0, _ok(r)
    first = next(
        l for l in r.stdout.splitlines() if "allocate_layer_kv" in l or "load_weights" in l
    )
    assert "allocate_layer_kv" in first and "28.0 GiB" in first, r.stdout


def test_diff_shows_per_layer_site_shrinking(walk):
    big, small = walk["big"].out, walk["small"].out
    r = cli(walk["env"], "diff", big, small)
    assert r.returncode == 0, _ok(r)
    line = next((l for l in r.stdout.splitlines() if "allocate_layer_kv" in l), None)
    assert line is not None, r.stdout
    assert "shrunk" in line and "-27.9 GiB" in line, line
    r = cli(walk["env"], "diff", big, small, "--json")
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    site = next(x for x in doc["sites"] if x["label"].startswith("allocate_layer_kv"))
    assert site["status"] == "shrunk"
    assert site["peak"]["a_bytes"] == LAYERS * GiB
    assert site["peak"]["b_bytes"] == LAYERS * 64 * PAGE
    assert site["peak"]["a_count"] == site["peak"]["b_count"] == LAYERS
    # the largest change of the diff is this site
    assert doc["sites"][0] is site or doc["sites"][0]["label"] == site["label"]


@pytest.mark.parametrize("on_exceed", ["fail", "abort"])
def test_budget_stops_oversized_pool(sim, kvpool, tmp_path, on_exceed):
    env = thor_env(sim, tmp_path)
    r = trace(
        env,
        tmp_path / "budget",
        kvpool,
        "--kv-cache-memory",
        "1GiB",
        opts=("--budget", "12GiB", "--on-exceed", on_exceed),
    )
    assert r.returncode != 0, _ok(r)
    line = next((l for l in r.stderr.splitlines() if "budget exceeded" in l), None)
    assert line is not None, _ok(r)
    assert "allocate_layer_kv" in line and "cuMemAlloc_v2" in line, line
    # the shim names the report's site: the call graph of the stacks recorded so far
    assert re.search(
        r"; at allocate_layer_kv \(kvpool\.c:\d+\) via "
        r"tensor_make > backend_acquire > device_carve",
        line,
    ), line
    named = next((l for l in r.stderr.splitlines() if l.startswith("cudatrace: denied ")), None)
    assert named is not None and " at allocate_layer_kv (kvpool.c:" in named, _ok(r)
    assert "via tensor_make > backend_acquire > device_carve" in named
    assert not re.search(r"^ready\b", r.stdout, re.M), r.stdout
    if on_exceed == "fail":
        assert "kvpool: error: allocate_layer_kv: cuMemAlloc_v2" in r.stderr
        assert "CUDA_ERROR_OUT_OF_MEMORY" in r.stderr


def test_budget_allows_corrected_sizing(sim, kvpool, tmp_path):
    """The same budget is no obstacle when the pool is sized right."""
    env = thor_env(sim, tmp_path)
    r = trace(
        env,
        tmp_path / "fixed",
        kvpool,
        "--kv-cache-memory",
        "1GiB",
        "--fixed-sizing",
        opts=("--budget", "12GiB"),
    )
    assert r.returncode == 0, _ok(r)
    assert "budget exceeded" not in r.stderr


# ---- cudatrace demo -------------------------------------------------------------------------


def test_demo_end_to_end_simulated(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CUDASIM_") and k != "LD_PRELOAD"
    }
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / "demo"
    r = cli(env, "demo", "--simulated", "-o", out, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, _ok(r)
    lines = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    assert lines
    unlabelled = [l for l in lines if not l.startswith("[simulated]")]
    assert not unlabelled, unlabelled
    text = "\n".join(lines)
    assert "allocate_layer_kv" in text
    assert "budget exceeded" in text
    assert len(list(out.glob("*/*.ctrace"))) >= 4


def test_demo_gpu_refused_without_gpu(tmp_path):
    from cudatrace.demo import gpu_present

    if gpu_present():
        pytest.skip("this machine has a GPU")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = cli(env, "demo", "--gpu", "-o", tmp_path / "d")
    assert r.returncode == 2, _ok(r)
    assert "no NVIDIA GPU" in r.stderr
