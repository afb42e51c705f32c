"""The stack cache on the machine's own architecture: cached CFI rules (shim/unwind.c) give the
stacks a full libgcc unwind gives, repeated call sites are served from it, and every trace
says how many events took which path (header counters, also after SIGKILL)."""

from __future__ import annotations

import bisect
import json
import os
import signal
import subprocess
import sys

import pytest

from cudatrace.analyze.read.trace import read_dir, read_trace
from support import calltree, children
from support import tracegen as tg
from support.paths import PROGS, SHIM


def arch() -> str:
    return os.uname().machine


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_cached_stacks_equal_full_unwinds_on_random_call_trees(ct, sim, tmp_path, seed):
    exe = calltree.build("cc", tmp_path / "prog", sim.lib, seed, arch())
    env = ct.env()
    env["CUDATRACE_STACK_VERIFY"] = "1"
    r = ct.run([exe, 3000, seed, 3], "-q", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MISMATCH" not in r.stderr, r.stderr[-3000:]
    t = read_dir(r.out).traces[0]
    assert t.n_events > 10000
    assert t.stack_mismatches == 0
    assert t.stack_verified == t.n_events  # every event compared
    assert t.stack_unwinds_full + t.stack_cache_hits == t.n_events
    assert t.stack_cache_hits >= 0.98 * t.n_events, (t.stack_cache_hits, t.n_events)


def test_one_call_site_loop_takes_almost_no_full_unwinds(ct, sim):
    env = ct.env()
    env["CUDATRACE_STACK_VERIFY"] = "1"
    r = ct.run([sim.progs["threads"], 1, 10000, 4096], "-q", env=env)
    assert r.returncode == 0, r.stderr
    t = read_dir(r.out).traces[0]
    assert t.n_events == 20000
    assert t.stack_unwinds_full <= 0.01 * t.n_events, t.stack_unwinds_full
    assert t.stack_verified == t.n_events and t.stack_mismatches == 0


def test_counts_in_report_json_and_survive_sigkill(ct, sim):
    out = ct.new_dir()
    p = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-o",
            str(out),
            "-q",
            "--",
            str(sim.progs["hold"]),
            "50",
            "4096",
        ],
        env=ct.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in children.lines(p):
        if line.strip() == "ready":
            break
    else:
        raise AssertionError("hold never said ready")
    trace = next(out.glob("*.ctrace"))
    os.kill(int(trace.name.split(".")[0]), signal.SIGKILL)
    p.communicate(timeout=60)
    t = read_trace(trace)
    assert not t.complete
    assert t.stack_unwinds_full + t.stack_cache_hits == t.n_events == 50
    assert t.stack_cache_hits >= 45
    r = ct.cli("report", out, "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["counts"]
    assert (c["stack_unwinds_full"], c["stack_cache_hits"]) == (
        t.stack_unwinds_full,
        t.stack_cache_hits,
    )
    assert not any("stack cache" in w for w in json.loads(r.stdout)["warnings"])


def test_low_cache_rate_is_noted(tmp_path, ct):
    w = tg.TraceWriter(
        tmp_path / "1.0.ctrace", pid=1, header={"stack_unwinds_full": 900, "stack_cache_hits": 100}
    )
    w.alloc(tg.BASE_TS + 1, 100, 0x1)
    w.close()
    r = ct.cli("report", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["counts"]["stack_unwinds_full"] == 900 and rep["counts"]["stack_cache_hits"] == 100
    assert any("900 of 1000 events took a full unwind" in w for w in rep["warnings"]), rep[
        "warnings"
    ]
    text = ct.cli("report", tmp_path).stdout
    assert "stack cache hit rate 10%" in text


PLUGIN = r"""
#include <alloca.h>
#include "cuda_abi.h"
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuInit(unsigned int flags);
__attribute__((noinline)) int plugin_leaf(int k)
{
    CUdeviceptr p = 0;
    volatile char *pad = alloca(PAD + k);
    pad[0] = 1;
    if (cuMemAlloc_v2(&p, 4096) == 0)
        cuMemFree_v2(p);
    return pad[0];
}
int plugin_run(int n) { int r = cuInit(0); for (int i = 0; i < n; i++) r += plugin_leaf(i % 7); return r; }
"""

LOADER = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    for (int round = 0; round < 4; round++) {
        void *h = dlopen(argv[1 + round % 2], RTLD_NOW);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        int (*run)(int) = (int (*)(int))dlsym(h, "plugin_run");
        printf("round %d at %p\n", round, (void *)run);
        run(200);
        dlclose(h);
    }
    return 0;
}
"""


def test_rules_are_forgotten_when_a_library_is_unloaded(ct, sim, tmp_path):
    """Two plugins built differently (one keeps frame pointers, one does not) loaded in turn at
    the same address: the rules of the first must not serve the second."""
    (tmp_path / "plugin.c").write_text(PLUGIN)
    (tmp_path / "loader.c").write_text(LOADER)
    libs = []
    for name, flags in (
        ("a", ["-O2", "-fno-omit-frame-pointer", "-DPAD=16"]),
        ("b", ["-O2", "-fomit-frame-pointer", "-DPAD=48"]),
    ):
        lib = tmp_path / (f"libplugin_{name}.so")
        subprocess.run(
            [
                "cc",
                "-shared",
                "-fPIC",
                "-g",
                *flags,
                f"-I{SHIM}",
                "-o",
                str(lib),
                str(tmp_path / "plugin.c"),
                f"-L{sim.lib}",
                "-lcuda",
            ],
            check=True,
        )
        libs.append(lib)
    exe = tmp_path / "loader"
    subprocess.run(["cc", "-g", "-o", str(exe), str(tmp_path / "loader.c"), "-ldl"], check=True)
    env = ct.env()
    env["CUDATRACE_STACK_VERIFY"] = "1"
    r = ct.run([exe, *libs], "-q", env=env)
    assert r.returncode == 0, r.stderr
    assert "MISMATCH" not in r.stderr, r.stderr
    t = read_dir(r.out).traces[0]
    assert t.n_events == 1600 and t.stack_mismatches == 0 and t.stack_verified == t.n_events
    # each load is a fresh start for the cache (a few full unwinds per round, not one in all)
    assert 4 <= t.stack_unwinds_full <= 40, t.stack_unwinds_full


STALE = r"""
#include <alloca.h>
#include <stdint.h>
#include <stdio.h>
#include "cudasim_api.h"
static uintptr_t target;
__attribute__((noinline)) void leaf_p(void)
{
    /* grow this frame so the call below always leaves from the same stack address */
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    if (!target)
        target = here - 8192;
    volatile char *p = alloca(here - target);
    p[0] = 1;
    CUdeviceptr d = 0;
    if (cuMemAlloc_v2(&d, 4096) == CUDA_SUCCESS)
        cuMemFree_v2(d);
}
__attribute__((noinline)) void caller_small(void) { volatile char pad[16]; pad[0] = 0; leaf_p(); }
__attribute__((noinline)) void caller_big(void) { volatile char pad[1024]; pad[0] = 0; leaf_p(); }
int main(int argc, char **argv)
{
    void (*const callers[2])(void) = {caller_big, caller_small};
    cuInit(0);
    for (int i = 0; i < 6; i++) {
        void (*volatile f)(void) = callers[i % 2];
        f();                      /* one call site for both callers */
    }
    return 0;
}
"""


def test_same_stack_depth_through_different_callers(ct, sim, tmp_path):
    """leaf_p grows its frame (alloca) so its call leaves from the same stack address whichever
    caller it has, and main reaches both callers from one call site: a cache that only checks
    return-address slots finds the old caller's address still in place (inside the alloca area)
    and repeats its stack (the x86-64 cache before shim/unwind.c did: all six events named
    caller_big). The cached rules read the frame pointers too."""
    (tmp_path / "stale.c").write_text(STALE)
    exe = tmp_path / "stale"
    subprocess.run(
        [
            "cc",
            "-O0",
            "-g",
            "-fno-omit-frame-pointer",
            f"-I{SHIM}",
            f"-I{PROGS}",
            "-o",
            str(exe),
            str(tmp_path / "stale.c"),
            f"-L{sim.lib}",
            "-lcuda",
        ],
        check=True,
    )
    env = ct.env()
    env["CUDATRACE_STACK_VERIFY"] = "1"
    r = ct.run([exe], "-q", env=env)
    assert r.returncode == 0, r.stderr
    t = read_dir(r.out).traces[0]
    syms = {}
    for line in subprocess.run(
        ["nm", str(exe)], capture_output=True, text=True
    ).stdout.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in "tT":
            syms[int(p[0], 16)] = p[2]
    starts = sorted(syms)

    def name(f):
        m = t.module_for(f)
        if m is None or m.path != str(exe):
            return None
        i = bisect.bisect_right(starts, f - 1 - m.base) - 1
        return syms[starts[i]]

    from cudatrace.analyze.read.trace import C, event_fields

    names = event_fields()
    callers = [
        name(t.stack(e[names.index("stack")])[1])
        for e in t.events
        if e[names.index("op")] == C()["CT_OP_ALLOC"]
    ]
    assert callers == ["caller_big", "caller_small"] * 3, callers
    assert t.stack_cache_hits > 0 and t.stack_mismatches == 0
