"""native/include/cuda_abi.h declares the CUDA driver and NVML types the shim uses by hand (no
CUDA headers at build time). These tests hold its layouts to cuda.h / nvml.h:

- always: a C file of _Static_asserts with the sizes and offsets of the LP64 (x86-64, aarch64)
  layouts of CUDA 12/13's cuda.h and nvml.h, compiled with the shim's flags;
- where a CUDA toolkit is installed (cuda.h found): the same offsets compared field by field with
  the real header's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
while not (REPO / "native" / "include" / "cuda_abi.h").is_file() and REPO != REPO.parent:
    REPO = REPO.parent
INCLUDE = REPO / "native" / "include"

# (type, field or None for sizeof, expected value) from cuda.h / nvml.h, LP64
LAYOUT = [
    ("CUmemLocation", None, 8),
    ("CUmemLocation", "id", 4),
    ("CUmemAllocationProp", None, 32),
    ("CUmemAllocationProp", "requestedHandleTypes", 4),
    ("CUmemAllocationProp", "location", 8),
    ("CUmemAllocationProp", "win32HandleMetaData", 16),
    ("CUmemAllocationProp", "allocFlags", 24),
    ("CUmemPoolProps", None, 88),
    ("CUmemPoolProps", "location", 8),
    ("CUmemPoolProps", "win32SecurityAttributes", 16),
    ("CUmemPoolProps", "maxSize", 24),
    ("CUmemPoolProps", "usage", 32),
    ("CUDA_MEM_ALLOC_NODE_PARAMS", None, 120),
    ("CUDA_MEM_ALLOC_NODE_PARAMS", "accessDescs", 88),
    ("CUDA_MEM_ALLOC_NODE_PARAMS", "accessDescCount", 96),
    ("CUDA_MEM_ALLOC_NODE_PARAMS", "bytesize", 104),
    ("CUDA_MEM_ALLOC_NODE_PARAMS", "dptr", 112),
    ("CUDA_ARRAY_DESCRIPTOR", None, 24),
    ("CUDA_ARRAY_DESCRIPTOR", "Format", 16),
    ("CUDA_ARRAY_DESCRIPTOR", "NumChannels", 20),
    ("CUDA_ARRAY3D_DESCRIPTOR", None, 40),
    ("CUDA_ARRAY3D_DESCRIPTOR", "Depth", 16),
    ("CUDA_ARRAY3D_DESCRIPTOR", "Format", 24),
    ("CUDA_ARRAY3D_DESCRIPTOR", "NumChannels", 28),
    ("CUDA_ARRAY3D_DESCRIPTOR", "Flags", 32),
    ("CUDA_EXTERNAL_MEMORY_HANDLE_DESC", None, 104),
    ("CUDA_EXTERNAL_MEMORY_HANDLE_DESC", "handle", 8),
    ("CUDA_EXTERNAL_MEMORY_HANDLE_DESC", "size", 24),
    ("CUDA_EXTERNAL_MEMORY_HANDLE_DESC", "flags", 32),
    ("CUipcMemHandle", None, 64),
    ("nvmlMemory_t", None, 24),
    ("nvmlMemory_t", "free", 8),
    ("nvmlMemory_t", "used", 16),
    ("nvmlMemory_v2_t", None, 40),
    ("nvmlMemory_v2_t", "total", 8),
    ("nvmlMemory_v2_t", "free", 24),
    ("nvmlMemory_v2_t", "used", 32),
    ("nvmlProcessInfo_v2_t", None, 24),
    ("nvmlProcessInfo_v2_t", "usedGpuMemory", 8),
    ("nvmlProcessInfo_v2_t", "gpuInstanceId", 16),
]
# constants the shim relies on, as cuda.h defines them
CONSTANTS = [
    ("CUDA_SUCCESS", 0),
    ("CUDA_ERROR_INVALID_VALUE", 1),
    ("CUDA_ERROR_OUT_OF_MEMORY", 2),
    ("CUDA_ERROR_NOT_INITIALIZED", 3),
    ("CUDA_ERROR_NOT_FOUND", 500),
    ("CUDA_ERROR_NOT_PERMITTED", 800),
    ("CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM", 2),
    ("CU_DEVICE_ATTRIBUTE_INTEGRATED", 18),
    ("CU_MEM_LOCATION_TYPE_DEVICE", 1),
    ("CU_MEM_LOCATION_TYPE_HOST", 2),
    ("CU_MEM_LOCATION_TYPE_HOST_NUMA", 3),
    ("CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT", 4),
    ("CU_MEM_ALLOCATION_TYPE_PINNED", 1),
    ("CU_MEM_ALLOCATION_TYPE_MANAGED", 2),
]


def _cc() -> str:
    cc = os.environ.get("CC", "cc")
    assert shutil.which(cc), f"no C compiler ({cc}): the suite needs one"
    return cc


def _asserts() -> str:
    lines = ["#include <stddef.h>", '#include "cuda_abi.h"']
    for typ, field, want in LAYOUT:
        expr = f"sizeof({typ})" if field is None else f"offsetof({typ}, {field})"
        lines.append('_Static_assert(%s == %d, "%s");' % (expr, want, expr))
    for name, want in CONSTANTS:
        lines.append('_Static_assert(%s == %d, "%s");' % (name, want, name))
    return "\n".join(lines) + "\n"


def test_cuda_abi_matches_documented_layouts(tmp_path):
    src = tmp_path / "abi_check.c"
    src.write_text(_asserts())
    r = subprocess.run(
        [
            _cc(),
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
            str(INCLUDE),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_a_wrong_layout_fails_the_check(tmp_path):
    """The check can fail: one wrong expectation makes the compile fail, naming it."""
    src = tmp_path / "abi_bad.c"
    src.write_text(
        _asserts().replace("sizeof(CUipcMemHandle) == 64", "sizeof(CUipcMemHandle) == 65")
    )
    r = subprocess.run(
        [_cc(), "-std=gnu11", "-fsyntax-only", "-I", str(INCLUDE), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "CUipcMemHandle" in r.stderr


def _cuda_include() -> Path | None:
    for d in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr"):
        if d and (Path(d) / "include" / "cuda.h").is_file():
            return Path(d) / "include"
    return None


@pytest.mark.skipif(
    _cuda_include() is None,
    reason="needs cuda.h (a CUDA toolkit); the documented layouts are checked above",
)
def test_cuda_abi_matches_installed_cuda_h(tmp_path):
    """Where cuda.h exists, every offset, size and constant above is measured in the real header too."""
    inc = _cuda_include()
    lines = ["#include <stddef.h>", "#include <cuda.h>"]
    if (inc / "nvml.h").is_file():
        lines.append("#include <nvml.h>")
    for typ, field, want in LAYOUT:
        if typ.startswith("nvml") and not (inc / "nvml.h").is_file():
            continue
        expr = f"sizeof({typ})" if field is None else f"offsetof({typ}, {field})"
        lines.append('_Static_assert(%s == %d, "%s");' % (expr, want, expr))
    for name, want in CONSTANTS:
        lines.append('_Static_assert(%s == %d, "%s");' % (name, want, name))
    src = tmp_path / "abi_real.c"
    src.write_text("\n".join(lines) + "\n")
    r = subprocess.run(
        [_cc(), "-std=gnu11", "-fsyntax-only", "-I", str(inc), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
