"""Random call trees for checking the shim's stack cache against full unwinds.

    build(cc, outdir, libdir, seed, arch) -> Path of the program

generate() writes a C program of `nfuncs` functions spread over translation units built with
different code shapes: frame pointers kept or omitted, -O0/-O1/-O2, one unit in a shared
library, and on aarch64 one unit with return-address signing (-mbranch-protection=pac-ret).
Functions have random shapes: large fixed frames, alloca and VLAs of a size drawn at run time
(the same call site at a different stack depth), tail calls, calls through function pointers,
choices among several call sites, bounded self-recursion. The leaves call the simulated
driver's cuMemAlloc_v2 / cuMemFree_v2 / cuMemAllocAsync / cuMemFreeAsync.

usage of the program: calltree EVENTS SEED [THREADS]
Each event walks a random path from main to a leaf (a small PRNG, seeded), so call sites repeat
with different stack layouts. It prints "done N" with the number of driver calls it made.
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

from .paths import PROGS, SHIM  # noqa: F401

HEADER = r"""#include <alloca.h>
#include <stdint.h>
#include "cudasim_api.h"
typedef int (*fn_t)(uint64_t *, int);
static inline uint64_t next(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
extern volatile long g_calls;
"""


def _units(arch: str) -> list[tuple[str, list[str], bool]]:
    """(name, cflags, in the shared library)"""
    u = [
        ("fp_o0", ["-O0", "-fno-omit-frame-pointer"], False),
        ("fp_o2", ["-O2", "-fno-omit-frame-pointer"], False),
        ("nofp_o2", ["-O2", "-fomit-frame-pointer"], False),
        ("nofp_o1", ["-O1", "-fomit-frame-pointer"], False),
        ("lib_o2", ["-O2", "-fomit-frame-pointer", "-fPIC"], True),
    ]
    if arch == "aarch64":
        u.append(("pac_o2", ["-O2", "-fomit-frame-pointer", "-mbranch-protection=pac-ret"], False))
    return u


def generate(outdir: Path, seed: int, arch: str, nfuncs: int = 48) -> dict:
    rnd = random.Random(seed)
    units = _units(arch)
    owner = [rnd.randrange(len(units)) for _ in range(nfuncs)]
    bodies: dict[int, list[str]] = {i: [] for i in range(len(units))}
    protos = "".join("int f%d(uint64_t *s, int d);\n" % i for i in range(nfuncs))
    protos += (
        "int leaf_alloc(uint64_t *s, int d);\nint leaf_async(uint64_t *s, int d);\n"
        "int leaf_pair(uint64_t *s, int d);\n"
    )
    leaves = ["leaf_alloc", "leaf_async", "leaf_pair"]
    for i in range(nfuncs):
        kids = [j for j in range(i + 1, nfuncs)]
        rnd.shuffle(kids)
        kids = kids[: rnd.randint(1, 4)]
        calls = ["f%d(s, d + 1)" % j for j in kids] or [f"{rnd.choice(leaves)}(s, d + 1)"]
        if i >= nfuncs - 6:
            calls = [f"{rnd.choice(leaves)}(s, d + 1)" for _ in range(rnd.randint(1, 3))]
        shape = rnd.choice(["plain", "big", "alloca", "vla", "tail", "ptr", "rec"])
        b = [
            "__attribute__((noinline%s)) int f%d(uint64_t *s, int d)\n{\n"
            % (", noclone" if "gcc" else "", i)
        ]
        pick = "    unsigned k = (unsigned)(next(s) %% %d);\n" % len(calls)
        if shape == "plain":
            b.append(pick)
            b.append("    int r = 0;\n    switch (k) {\n")
            for n, c in enumerate(calls):
                b.append("    case %d: r = %s; break;\n" % (n, c))
            b.append("    }\n    return r + 1;\n}\n")
        elif shape == "big":
            size = rnd.choice([64, 512, 3000, 20000])
            b.append("    volatile char buf[%d];\n    buf[0] = (char)d;\n" % size)
            b.append(pick)
            b.append("    int r = 0;\n    switch (k) {\n")
            for n, c in enumerate(calls):
                b.append("    case %d: r = %s; break;\n" % (n, c))
            b.append("    }\n    return r + buf[0];\n}\n")
        elif shape in ("alloca", "vla"):
            if shape == "alloca":
                b.append("    volatile char *p = alloca(1 + next(s) % 3000);\n")
            else:
                b.append(
                    "    unsigned n = 1 + (unsigned)(next(s) % 777);\n    volatile char v[n];\n"
                    "    volatile char *p = v;\n"
                )
            b.append("    p[0] = (char)d;\n")
            b.append(pick)
            b.append("    int r = 0;\n    switch (k) {\n")
            for n, c in enumerate(calls):
                b.append("    case %d: r = %s; break;\n" % (n, c))
            b.append("    }\n    return r + p[0];\n}\n")
        elif shape == "tail":
            b.append(pick)
            b.append("    switch (k) {\n")
            for n, c in enumerate(calls):
                b.append("    case %d: return %s;\n" % (n, c))
            b.append("    }\n    return 0;\n}\n")
        elif shape == "ptr":
            b.append(
                "    static fn_t const tab[] = {{{}}};\n".format(
                    ", ".join(c.split("(")[0] for c in calls)
                )
            )
            b.append(pick)
            b.append("    return tab[k](s, d + 1) + 2;\n}\n")
        else:  # rec: bounded self-recursion, then a callee
            b.append(
                "    if (d < 40 && next(s) %% 3 == 0)\n        return f%d(s, d + 1) + 1;\n" % i
            )
            b.append(pick)
            b.append("    int r = 0;\n    switch (k) {\n")
            for n, c in enumerate(calls):
                b.append("    case %d: r = %s; break;\n" % (n, c))
            b.append("    }\n    return r + 1;\n}\n")
        bodies[owner[i]].append("".join(b))
    leaf_src = (
        HEADER
        + protos
        + r"""
__attribute__((noinline)) int leaf_alloc(uint64_t *s, int d)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, 256 + next(s) % 4096) == CUDA_SUCCESS) {
        g_calls++;
        cuMemFree_v2(p);
        g_calls++;
    }
    return d;
}
__attribute__((noinline)) int leaf_async(uint64_t *s, int d)
{
    CUdeviceptr p = 0;
    if (cuMemAllocAsync(&p, 512, 0) == CUDA_SUCCESS) {
        g_calls++;
        cuMemFreeAsync(p, 0);
        g_calls++;
    }
    return d + 1;
}
__attribute__((noinline)) int leaf_pair(uint64_t *s, int d)
{
    return leaf_alloc(s, d) + leaf_async(s, d);
}
"""
    )
    main_src = (
        HEADER
        + protos
        + r"""
#include <pthread.h>
volatile long g_calls;
static long g_events;
static void *run(void *arg)
{
    uint64_t s = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
    for (long e = 0; e < g_events; e++)
        f0(&s, 0);
    return NULL;
}
int main(int argc, char **argv)
{
    if (argc < 3) { fprintf(stderr, "usage: calltree EVENTS SEED [THREADS]\n"); return 2; }
    g_events = atol(argv[1]);
    unsigned long seed = strtoul(argv[2], NULL, 10);
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (cuInit(0) != CUDA_SUCCESS) { fprintf(stderr, "cuInit failed\n"); return 1; }
    pthread_t t[16];
    for (int i = 1; i < threads && i < 16; i++)
        pthread_create(&t[i], NULL, run, (void *)(uintptr_t)(seed + i));
    run((void *)(uintptr_t)seed);
    for (int i = 1; i < threads && i < 16; i++)
        pthread_join(t[i], NULL);
    printf("done %ld\n", (long)g_calls);
    return 0;
}
"""
    )
    outdir.mkdir(parents=True, exist_ok=True)
    files = {
        "main": (outdir / "ct_main.c", ["-O1", "-fno-omit-frame-pointer"], False, main_src),
        "leaf": (outdir / "ct_leaf.c", ["-O2"], False, leaf_src),
    }
    for k, (name, flags, in_lib) in enumerate(units):
        files[name] = (
            outdir / (f"ct_{name}.c"),
            flags,
            in_lib,
            HEADER + protos + "\n".join(bodies[k]),
        )
    for path, _, _, src in files.values():
        path.write_text(src)
    return files


def build(cc: str, outdir: Path, libdir: Path, seed: int, arch: str) -> Path:
    files = generate(outdir, seed, arch)
    common = [
        "-std=gnu11",
        "-g",
        "-D_GNU_SOURCE",
        "-pthread",
        "-w",
        f"-I{SHIM}",
        f"-I{PROGS}",
    ]
    objs: list[str] = []
    lib_objs: list[str] = []
    for path, flags, in_lib, _ in files.values():
        obj = path.with_suffix(".o")
        subprocess.run([cc, *common, *flags, "-fPIC", "-c", "-o", str(obj), str(path)], check=True)
        (lib_objs if in_lib else objs).append(str(obj))
    lib = outdir / "libcalltree.so"
    subprocess.run([cc, "-shared", "-o", str(lib), *lib_objs, f"-L{libdir}", "-lcuda"], check=True)
    exe = outdir / "calltree"
    subprocess.run(
        [
            cc,
            "-rdynamic",
            "-o",
            str(exe),
            *objs,
            str(lib),
            "-Wl,-rpath,$ORIGIN",
            f"-L{libdir}",
            "-lcuda",
            "-pthread",
        ],
        check=True,
    )
    return exe
