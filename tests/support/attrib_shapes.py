"""Builds the attribution shapes of tests/progs/attrib/ (tests/integration/test_attrib_shapes.py)
against the simulated driver: each program with its shared libraries, at one optimization
level. `build(name, out, libdir, release)` returns the executable's path."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .paths import PROGS

SRC = PROGS / "attrib"
DEBUG = ["-O0", "-g", "-fno-omit-frame-pointer"]
RELEASE = ["-O2", "-g", "-fomit-frame-pointer"]

# name -> (executable, [(library, [sources], compiler, [libraries it links])], exe sources, cc,
#          exe links)
SHAPES = {
    "vt_server": ([], ["vt_server.cpp"], "g++", []),
    "vt_server_static": ([], ["vt_server.cpp"], "g++", ["-static-libstdc++", "-static-libgcc"]),
    "trt_server": ([], ["trt_server.cpp"], "g++", []),
    "llamaish-cli": (
        [
            ("libggmlish-cuda.so", ["ggmlish_cuda.c"], "cc", ["-lcuda"]),
            ("libggmlish-base.so", ["ggmlish_base.c"], "cc", []),
            ("libllamaish.so", ["llamaish.cpp"], "g++", ["-lggmlish-base", "-lggmlish-cuda"]),
        ],
        ["llamaish_cli.c"],
        "cc",
        ["-lllamaish"],
    ),
    "torchapp": (
        [
            ("libmc10.so", ["mc10.cpp"], "g++", ["-lcuda"]),
            ("libmat.so", ["mat.cpp"], "g++", ["-lmc10"]),
        ],
        ["torchapp.cpp"],
        "g++",
        ["-lmat", "-lmc10"],
    ),
    # libtorch's split: the caching allocator, the CUDA kernels, the dispatcher and generic code
    "llm_server": (
        [
            ("libc10_cuda.so", ["c10_cuda.cpp"], "g++", ["-lcuda"]),
            ("libtorch_cpu.so", ["torch_cpu.cpp"], "g++", []),
            ("libtorch_cuda.so", ["torch_cuda.cpp"], "g++", ["-ltorch_cpu", "-lc10_cuda"]),
        ],
        ["llm_server.cpp"],
        "g++",
        ["-Wl,--no-as-needed", "-ltorch_cuda", "-ltorch_cpu", "-lc10_cuda"],
    ),
    # the same libraries under tools/gpu/libtorch_kv.cpp's program, whose file name starts
    # like one of libtorch's (libtorch_kv): the program's code, not the framework's
    "libtorch_kv": (
        [
            ("libc10_cuda.so", ["c10_cuda.cpp"], "g++", ["-lcuda"]),
            ("libtorch_cpu.so", ["torch_cpu.cpp"], "g++", []),
            ("libtorch_cuda.so", ["torch_cuda.cpp"], "g++", ["-ltorch_cpu", "-lc10_cuda"]),
        ],
        ["libtorch_kv.cpp"],
        "g++",
        ["-Wl,--no-as-needed", "-ltorch_cuda", "-ltorch_cpu", "-lc10_cuda"],
    ),
    # ONNX Runtime's split, with onnxruntime-genai over its C API
    "ort_chat": (
        [
            ("libonnxruntime_providers_cuda.so", ["ort_providers_cuda.cpp"], "g++", ["-lcuda"]),
            ("libonnxruntime.so", ["ort_runtime.cpp"], "g++", ["-lonnxruntime_providers_cuda"]),
            ("libonnxruntime-genai.so", ["ort_genai.cpp"], "g++", ["-lonnxruntime"]),
        ],
        ["ort_chat.c"],
        "cc",
        ["-lonnxruntime-genai"],
    ),
    # the same, genai's KV cache through a static helper that only forwards to the C API
    "ort_fwd": (
        [
            ("libonnxruntime_providers_cuda.so", ["ort_providers_cuda.cpp"], "g++", ["-lcuda"]),
            ("libonnxruntime.so", ["ort_runtime.cpp"], "g++", ["-lonnxruntime_providers_cuda"]),
            ("libonnxruntime-genai.so", ["ort_genai_fwd.cpp"], "g++", ["-lonnxruntime"]),
        ],
        ["ort_chat.c"],
        "cc",
        ["-lonnxruntime-genai"],
    ),
    # TensorFlow's split: tsl/tensorflow in the framework library, stream_executor in the C++ one
    "tf_serving": (
        [
            ("libtensorflow_framework.so.2", ["tf_framework.cpp"], "g++", []),
            (
                "libtensorflow_cc.so.2",
                ["tf_cc.cpp"],
                "g++",
                ["-l:libtensorflow_framework.so.2", "-lcuda"],
            ),
        ],
        ["tf_serving.cpp"],
        "g++",
        ["-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2"],
    ),
    # issue 44's engine: one namespace, a templated buffer under three callers and a lambda
    "eng": ([], ["eng.cpp"], "g++", []),
    "bigalloc": ([], ["bigalloc.c"], "cc", []),
    "plain_c": ([], ["plain_c.c"], "cc", []),
    "kvgrow": ([], ["kvgrow.c"], "cc", []),
}


def _cc(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stderr}")


def build_clang(name: str, out: Path, libdir: Path) -> Path:
    """Build the one-source C++ shape `name` with clang (zig c++, -O2 -g): zig compiles, g++
    links, so a fresh machine never builds libc++ from source (tests/integration/
    test_dwarf_inlines.py does the same); -fno-exceptions keeps libc++'s throwing helpers out."""
    import sys

    libs, srcs, _compiler, links = SHAPES[name]
    assert not libs and len(srcs) == 1, name
    out.mkdir(parents=True, exist_ok=True)
    obj = out / (name + ".o")
    _cc(
        [sys.executable, "-m", "ziglang", "c++", "-c", "-O2", "-g", "-fno-exceptions"]
        + [f"-I{SRC}", "-o", str(obj), str(SRC / srcs[0])]
    )
    exe = out / name
    _cc(["g++", "-o", str(exe), str(obj), f"-L{libdir}", "-Wl,-rpath,$ORIGIN", *links, "-lcuda"])
    return exe


def build(name: str, out: Path, libdir: Path, release: bool = False) -> Path:
    """Build shape `name` into out/ (its libraries beside it, found through $ORIGIN)."""
    libs, srcs, cc, links = SHAPES[name]
    out.mkdir(parents=True, exist_ok=True)
    flags = RELEASE if release else DEBUG
    common = [f"-I{SRC}", f"-L{libdir}", f"-L{out}", "-Wl,-rpath,$ORIGIN"]
    for lib, lsrcs, lcc, llinks in libs:
        _cc(
            [lcc, *flags, "-shared", "-fPIC", f"-Wl,-soname,{lib}", "-o", str(out / lib)]
            + [str(SRC / s) for s in lsrcs]
            + common
            + llinks
        )
    exe = out / name
    _cc([cc, *flags, "-o", str(exe)] + [str(SRC / s) for s in srcs] + common + links + ["-lcuda"])
    return exe
