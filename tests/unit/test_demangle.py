"""The shim's own Itanium C++ demangler (native/shim/demangle.c), checked against c++filt.

The denial line of a program that links the C++ runtime statically has no __cxa_demangle to
call; the shim demangles by itself. tests/progs/demangle_cli.c reads mangled names and writes
ct_demangle's answer (the mangled name when it fails). Each name it answers must read exactly
as c++filt writes it; a name it cannot read comes back unchanged, never wrong."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support.paths import PROGS, REPO

SHIM = REPO / "native" / "shim"

# real symbols of engines' allocation paths (vllm.cpp, ONNX Runtime, PyTorch, our shapes) and
# of the C++ runtime: nested names, anonymous namespaces (GCC's and nvcc's), constructors,
# destructors, templates, substitutions, lambdas, clones, operators, special names
NAMES = [
    "_ZN2vt4cuda47_GLOBAL__N__db57ad4a_14_cuda_dropin_cu_acac122913AllocOnDeviceENS_6DeviceEm",
    "_ZN4vllm2v114GPUModelRunner11CacheBufferC1EN2vt6DeviceERNS3_5QueueEmb",
    "_ZN2vt4cuda12_GLOBAL__N_113AllocOnDeviceENS_6DeviceEm",
    "_ZZN11onnxruntime8BFCArena6ExtendEmENKUlvE_clEv",
    "_ZZN11onnxruntime8BFCArena6ExtendEmENKUlvE0_clEv",
    "_ZN4vllm2v114GPUModelRunner19initialize_kv_cacheERKNS_13KVCacheConfigE.cold",
    "_ZN4vllm2v114GPUModelRunner19initialize_kv_cacheERKNS_13KVCacheConfigE.isra.0",
    "_ZN3eng6TensorIfEC2EmRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZN3eng7Backend7acquireIfEEyfmRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZN3trt7runtime13BaseAllocatorINS0_13CudaAllocatorEE8allocateEm",
    "_ZN3trt7runtime13GenericBufferINS0_13CudaAllocatorEEC1Em",
    "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator6mallocEPPvimP11CUstream_st",
    "_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11alloc_blockERNS2_10AllocParamsEbRKSt10shared_ptrINS_13GatheredContextEERSt11unique_lockISt15recursive_mutexE",
    "_ZNSt6vectorIiSaIiEE9push_backERKi",
    "_ZlsRSoRKN3foo3BarE",
    "_ZNK3foo3Bar3getEv",
    "_ZN3fooD0Ev",
    "_ZN3fooD2Ev",
    "_ZN12_GLOBAL__N_111build_tableERSt6vectorISt10unique_ptrIN3eng6TensorIfEESt14default_deleteIS4_EESaIS7_EE",
    "_ZN3eng6TensorIfEC1EmRKSs",
    "_ZTVN3foo3BarE",
    "_ZTIN3foo3BarE",
    "_ZN3foo3barIiLi3ELb1EEEvT_",
    "_ZSt4moveIRN3mat6TensorEEONSt16remove_referenceIT_E4typeEOS4_",
    "_ZN3mat6detail13empty_genericEm",
    "_ZN4mc104cuda16CachingAllocator11alloc_blockEm",
    "_ZNKSt8functionIFvvEEclEv",
    "_ZL28read_encoded_value_with_basehmPKhPm",
    "_ZN5torch8autograd17THPVariable_emptyEP7_objectS2_S2_",
]


@pytest.fixture(scope="module")
def demangle(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler: the suite needs one")
    exe = tmp_path_factory.mktemp("demangle") / "demangle_cli"
    r = subprocess.run(
        [cc, "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", f"-I{SHIM}"]
        + ["-fsanitize=address,undefined", "-o", str(exe), str(PROGS / "demangle_cli.c")]
        + [str(SHIM / "demangle.c")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr

    def run(names: list[str]) -> list[str]:
        out = subprocess.run(
            [str(exe)], input="\n".join(names) + "\n", capture_output=True, text=True, check=True
        )
        return out.stdout.splitlines()

    return run


def cxxfilt(names: list[str]) -> list[str]:
    tool = shutil.which("c++filt")
    if not tool:
        pytest.fail("no c++filt (binutils): the suite needs it")
    r = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    return r.stdout.splitlines()


def test_engine_names_read_as_cxxfilt_writes_them(demangle):
    mine, ref = demangle(NAMES), cxxfilt(NAMES)
    assert len(mine) == len(ref) == len(NAMES)
    diff = [(n, m, r) for n, m, r in zip(NAMES, mine, ref) if m != r]
    assert not diff, "\n".join(f"{n}\n  ours:     {m}\n  c++filt:  {r}" for n, m, r in diff)
    assert mine[0] == "vt::cuda::(anonymous namespace)::AllocOnDevice(vt::Device, unsigned long)"
    assert mine[3] == (
        "onnxruntime::BFCArena::Extend(unsigned long)::{lambda()#1}::operator()() const"
    )


def test_what_it_cannot_read_comes_back_unchanged(demangle):
    names = [
        "_Z1fPFviE",  # a pointer to function
        "_Z1fA3_i",  # an array
        "_ZN3FoocviEv",  # a conversion operator
        "_Z1fM3FooFviE",  # a pointer to member
        "_ZN3foo3barE_junk",  # trailing garbage
        "_Z",
        "_ZN",
        "_ZN3foo",  # cut short
        "_ZN999fooE",  # a length past the end
        "main",
        "alloc_big_device",
        "_ZSt1" + "I" * 400,  # deep nesting
    ]
    assert demangle(names) == names


def test_cxx_runtime_symbols_never_wrong(demangle):
    """Every dynamic symbol of the C++ runtime this machine has: each answer is c++filt's or
    the mangled name (never a third spelling), and most are read."""
    lib = next(
        (
            p
            for p in (
                Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
                Path("/usr/lib/aarch64-linux-gnu/libstdc++.so.6"),
                Path("/usr/lib64/libstdc++.so.6"),
            )
            if p.exists()
        ),
        None,
    )
    if lib is None:
        r = subprocess.run(
            ["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True
        )
        lib = Path(r.stdout.strip())
    assert lib.exists(), "no libstdc++.so.6 to read"
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
    names = sorted({ln.split()[-1].split("@")[0] for ln in nm.stdout.splitlines() if "_Z" in ln})
    names = [n for n in names if n.startswith("_Z")]
    assert len(names) > 1000
    mine, ref = demangle(names), cxxfilt(names)
    wrong = [(n, m, r) for n, m, r in zip(names, mine, ref) if m not in (r, n)]
    assert not wrong, "\n".join(f"{n}\n  ours:     {m}\n  c++filt:  {r}" for n, m, r in wrong[:10])
    read = sum(m == r for m, r in zip(mine, ref))
    assert read >= 0.8 * len(names), f"read {read} of {len(names)}"
