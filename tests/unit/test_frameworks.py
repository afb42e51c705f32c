"""Frameworks (cudatrace/frameworks.py, native/include/frameworks.def): the shipped table, a
user's file, which frame belongs to which framework, the binaries' evidence, and the boundary
rule over frameworks split across several libraries and namespaces (docs/attribution.md)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cudatrace import frameworks
from cudatrace.analyze.sites.layers import BFrame, boundary_cut

EXE = "server"
LIBC = ("libc.so.6", "__libc_start_call_main")


def test_shipped_table():
    names = {f.name for f in frameworks.shipped()}
    assert {"pytorch", "tensorflow", "jax", "onnxruntime", "tensorrt", "tvm", "ggml"} <= names
    assert "cuda-libraries" in names
    torch = next(f for f in frameworks.shipped() if f.name == "pytorch")
    assert torch.has_module("libc10_cuda.so") and torch.has_module("libtorch_cuda.so")
    assert torch.has_module("libtorch.so.2") and not torch.has_module("libtorchvision.so")
    assert torch.has_name("at::native::empty_cuda") and torch.has_name("torch::empty")
    assert not torch.has_name("at") and not torch.has_name("attach::x")
    ggml = next(f for f in frameworks.shipped() if f.name == "ggml")
    assert ggml.has_name("ggml_backend_buft_alloc_buffer") and not ggml.has_name("ggmlish_x")
    assert not ggml.has_module("libggmlish-cuda.so")


def test_user_file_adds_replaces_and_turns_off(tmp_path):
    text = "# mine\nmyengine modules=libme namespaces=me,me_c* keep=me::kv::\ntvm off\n"
    text += "pytorch modules=libc10 namespaces=c10\n"
    p = tmp_path / "fw.conf"
    p.write_text(text)
    table = {f.name: f for f in frameworks.table(str(p))}
    assert "tvm" not in table and table["pytorch"].modules == ("libc10",)
    me = table["myengine"]
    assert me.has_name("me::cuda::Pool::take") and me.has_name("me_c_alloc")
    m = frameworks.Membership(table.values())
    assert m.of("server", "me::kv::Cache::Cache") == frozenset()  # kept: the program's code
    assert m.of("libme_core.so", "anything") == {"myengine"}
    assert m.of(EXE, "me::cuda::Pool::take") == {"myengine"}


@pytest.mark.parametrize(
    "line,why",
    [
        ("a modules", "expected modules="),
        ("a colour=red", "expected modules="),
        ("a keep=x", "names no modules= and no namespaces="),
        ("a/b modules=x", "no framework name"),
    ],
)
def test_user_file_errors_name_the_line(tmp_path, line, why):
    with pytest.raises(frameworks.FrameworkError, match=why) as e:
        frameworks.parse_user("ok modules=x\n" + line + "\n", "fw.conf")
    assert "fw.conf:2:" in str(e.value)


def test_parse_def_joins_adjacent_strings():
    got = frameworks.parse_def('CT_FRAMEWORK("x", "liba " "libb", "a b", "")\n')
    assert got == [frameworks.Framework("x", ("liba", "libb"), ("a", "b"), ())]


def _lib(tmp_path, name, needs=()) -> str:
    """A shared library named name that links the libraries needs (DT_NEEDED)."""
    cc = shutil.which("cc")
    if not cc:
        pytest.fail("no C compiler")
    src = tmp_path / "empty.c"
    src.write_text("int cudatrace_test_symbol;\n")
    cmd = [cc, "-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(tmp_path / name), str(src)]
    cmd += [f"-L{tmp_path}"] + [f"-l:{n}" for n in needs]
    subprocess.run(cmd, check=True, capture_output=True)
    return str(tmp_path / name)


def test_a_library_the_framework_links_from_its_directory_joins_it(tmp_path):
    """torch/lib/libgomp-xyz.so is linked by libtorch_cpu.so from the same directory: part of
    PyTorch. onnxruntime-genai beside onnxruntime links it: a client, never a part."""
    gomp = _lib(tmp_path, "libgomp-a34b3233.so.1")
    cpu = _lib(tmp_path, "libtorch_cpu.so", ["libgomp-a34b3233.so.1"])
    ort = _lib(tmp_path, "libonnxruntime.so.1")
    genai = _lib(tmp_path, "libonnxruntime-genai.so", ["libonnxruntime.so.1"])
    got = frameworks.joined_modules([gomp, cpu, ort, genai], frameworks.shipped())
    assert got == {"libgomp-a34b3233.so.1": "pytorch"}


def cut(*spec, table=None, exe=EXE) -> str | None:
    m = frameworks.Membership(frameworks.shipped() if table is None else table)
    fr = [BFrame(mod, n, mod == exe, None, m.of(mod, n, mod == exe)) for mod, n in spec]
    k = boundary_cut(fr)
    return fr[k].name if k else None


def test_libtorch_over_three_libraries():
    """c10's caching allocator, ATen's CUDA kernels, the dispatcher and the header code the
    program compiled in: one framework; the program's function is the site."""
    stack = [
        (
            "libc10_cuda.so",
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block",
        ),
        (
            "libc10_cuda.so",
            "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate",
        ),
        ("libtorch_cpu.so", "at::detail::empty_generic"),
        ("libtorch_cuda.so", "at::detail::empty_cuda"),
        ("libtorch_cuda.so", "at::native::empty_cuda"),
        ("libtorch_cuda.so", "at::(anon)::(anon)::wrapper_CUDA_memory_format_empty"),
        ("libtorch_cpu.so", "at::_ops::empty_memory_format::call"),
        (EXE, "at::empty"),
        (EXE, "torch::empty"),
        (EXE, "llm::KVCache::KVCache"),
        (EXE, "main"),
        LIBC,
    ]
    assert cut(*stack) == "llm::KVCache::KVCache"
    # .to(kCUDA): _to_copy and empty_strided, then the program's loader
    to = [
        (
            "libc10_cuda.so",
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
        ),
        ("libtorch_cpu.so", "at::detail::empty_strided_generic"),
        ("libtorch_cuda.so", "at::native::empty_strided_cuda"),
        ("libtorch_cpu.so", "at::_ops::empty_strided::call"),
        ("libtorch_cpu.so", "at::native::_to_copy"),
        ("libtorch_cpu.so", "at::_ops::to_dtype_layout::call"),
        (EXE, "at::Tensor::to"),
        (EXE, "llm::Model::load_weights"),
        (EXE, "main"),
        LIBC,
    ]
    assert cut(*to) == "llm::Model::load_weights"
    # the interpreter above the binding: the framework's entry is the site (native view)
    py = [
        (
            "libc10_cuda.so",
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
        ),
        ("libtorch_cuda.so", "at::native::empty_cuda"),
        ("libtorch_cpu.so", "at::_ops::empty_memory_format::call"),
        ("libtorch_python.so", "torch::autograd::THPVariable_empty"),
        ("libpython3.11.so.1.0", "cfunction_call"),
    ]
    assert cut(*py) == "torch::autograd::THPVariable_empty"
    # without the table (turned off): ATen's own namespace change stops it, as before
    assert cut(*stack, table=[]) == "at::native::empty_cuda"


def test_program_named_like_a_framework_library():
    """A program whose file is named like one of the framework's libraries (`libtorch_kv`, as
    `libtorch_cuda.so`) is the program: its own functions are no framework's code, only the
    framework's header code compiled into it is. The stack as libtorch 2.11 records it (-O2,
    the dispatcher's kernel wrappers, an inlined overload of empty_cuda)."""
    exe = "libtorch_kv"
    wrap = "c10::impl::wrap_kernel_functor_unboxed_<...>::call"
    caching = "c10::cuda::CUDACachingAllocator::Native::"
    stack = [
        ("libc10_cuda.so", caching + "DeviceCachingAllocator::alloc_block"),
        ("libc10_cuda.so", caching + "DeviceCachingAllocator::malloc"),
        ("libc10_cuda.so", caching + "NativeCachingAllocator::malloc"),
        ("libc10_cuda.so", caching + "NativeCachingAllocator::allocate"),
        ("libtorch_cpu.so", "at::detail::empty_generic"),
        ("libtorch_cuda.so", "at::detail::empty_cuda"),
        ("libtorch_cuda.so", "at::detail::empty_cuda"),
        ("libtorch_cuda.so", "at::native::empty_cuda"),
        ("libtorch_cuda.so", "at::(anon)::(anon)::wrapper_CUDA_memory_format_empty"),
        ("libtorch_cuda.so", wrap),
        ("libtorch_cpu.so", "at::_ops::empty_memory_format::redispatch"),
        ("libtorch_cpu.so", wrap),
        ("libtorch_cpu.so", "at::_ops::empty_memory_format::call"),
        (exe, "at::empty"),
        (exe, "torch::empty"),
        (exe, "llm::KVCache::KVCache"),
        (exe, "main"),
        LIBC,
    ]
    assert cut(*stack, exe=exe) == "llm::KVCache::KVCache"
    m = frameworks.Membership(frameworks.shipped())
    assert m.of(exe, "main", exe=True) == frozenset()
    assert m.of(exe, "llm::KVCache::KVCache", exe=True) == frozenset()
    assert m.of(exe, "torch::empty", exe=True) == {"pytorch"}
    # a library of that name is libtorch's, as its file name says
    assert m.of("libtorch_kv.so", "llm::KVCache::KVCache") == {"pytorch"}


def test_tensorflow_over_two_libraries():
    stack = [
        ("libtensorflow_cc.so.2", "stream_executor::gpu::GpuDriver::DeviceAllocate"),
        ("libtensorflow_cc.so.2", "stream_executor::gpu::GpuExecutor::Allocate"),
        ("libtensorflow_cc.so.2", "stream_executor::DeviceMemAllocator::Alloc"),
        ("libtensorflow_framework.so.2", "tsl::BFCAllocator::Extend"),
        ("libtensorflow_framework.so.2", "tsl::BFCAllocator::AllocateRawInternal"),
        ("libtensorflow_framework.so.2", "tensorflow::(anon)::Buffer<...>::Buffer"),
        ("libtensorflow_framework.so.2", "tensorflow::Tensor::Tensor"),
        (EXE, "serving::KVStore::KVStore"),
        (EXE, "main"),
        LIBC,
    ]
    assert cut(*stack) == "serving::KVStore::KVStore"
    assert cut(*stack, table=[]) == "tsl::BFCAllocator::Extend"


def test_onnxruntime_lambda_and_genai_beside_it():
    """The arena's lambda is scoped by BFCArena::Extend; genai shares onnxruntime's family
    name but is no part of the framework: its KV cache is the site."""
    m = frameworks.Membership(frameworks.shipped())
    spec = [
        ("libonnxruntime_providers_cuda.so", "onnxruntime::CUDAAllocator::Alloc", None),
        (
            "libonnxruntime.so.1.20.0",
            "onnxruntime::BFCArena::Extend::{lambda}",
            "onnxruntime::BFCArena::Extend",
        ),
        ("libonnxruntime.so.1.20.0", "onnxruntime::BFCArena::AllocateRawInternal", None),
        ("libonnxruntime.so.1.20.0", "OrtApis::CreateTensorAsOrtValue", None),
        ("libonnxruntime-genai.so", "Ort::Value::CreateTensor", None),
        ("libonnxruntime-genai.so", "Generators::DefaultKeyValueCache::DefaultKeyValueCache", None),
        ("libonnxruntime-genai.so", "OgaCreateGenerator", None),
        (EXE, "main"),
        LIBC,
    ]
    fr = [
        BFrame(mod, n, mod == EXE, e, m.of(mod, e or n))
        for mod, n, e in [s if len(s) == 3 else (*s, None) for s in spec]
    ]
    assert fr[1].scope == ("onnxruntime",) and fr[1].rule_name == "onnxruntime::BFCArena::Extend"
    assert fr[boundary_cut(fr)].name == "Generators::DefaultKeyValueCache::DefaultKeyValueCache"


def test_tvm_keeps_its_kv_cache():
    lib = "libtvm_runtime.so"
    assert (
        cut(
            (lib, "tvm::runtime::CUDADeviceAPI::AllocDataSpace"),
            (lib, "tvm::runtime::NDArray::Empty"),
            (lib, "tvm::runtime::relax_vm::PagedAttentionKVCacheObj::PagedAttentionKVCacheObj"),
            (EXE, "main"),
            LIBC,
        )
        == "tvm::runtime::relax_vm::PagedAttentionKVCacheObj::PagedAttentionKVCacheObj"
    )


def test_plain_c_helper_stays_the_site():
    """No framework, one executable: the program's own one-caller helper is the site."""
    assert cut((EXE, "alloc_big_device"), (EXE, "main"), LIBC) is None
