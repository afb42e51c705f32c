"""The boundary rule (cudatrace/analyze/sites/layers.py boundary_cut, docs/attribution.md): one
client is enough when the stack shows where the allocator's code ends. Stacks are written
innermost first as (module, short name) pairs, the shapes of real engines."""

from __future__ import annotations

import pytest

from cudatrace.analyze.sites.layers import BFrame, boundary_cut, module_family, namespace_scope

EXE = "server"
LIBC = ("libc.so.6", "__libc_start_call_main")


def frames(*spec) -> list[BFrame]:
    return [BFrame(m, n, m == EXE) for m, n in spec]


def site(*spec, keep=None) -> str | None:
    fr = frames(*spec)
    k = boundary_cut(fr, keep)
    return fr[k].name if k else None


def test_one_binary_helper_in_another_namespace():
    """vllm.cpp: vt::cuda::(anon)::AllocOnDevice through a function table (vt::Alloc, inlined
    or a tail call) under vllm::; the only client at start-up is the KV cache."""
    kv = site(
        (EXE, "vt::cuda::(anon)::AllocOnDevice"),
        (EXE, "vt::Alloc"),
        (EXE, "vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer"),
        (EXE, "vllm::v1::GPUModelRunner::initialize_kv_cache"),
        (EXE, "main"),
        LIBC,
    )
    assert kv == "vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer"
    # the tail call dropped vt::Alloc; a virtual backend of an enclosing namespace folds too
    assert (
        site(
            (EXE, "vt::cuda::(anon)::AllocOnDevice"),
            (EXE, "vt::cuda::CudaBackend::Alloc"),
            (EXE, "vt::Tensor::Tensor"),
            (EXE, "vllm::v1::GPUModelRunner::load_weights"),
            (EXE, "main"),
            LIBC,
        )
        == "vllm::v1::GPUModelRunner::load_weights"
    )


def test_allocator_in_shared_c_libraries():
    """llama.cpp: libggml-cuda under libggml-base (one family), under libllama."""
    spec = [
        ("libggml-cuda.so", "ggml_backend_cuda_buffer_type_alloc_buffer"),
        ("libggml-base.so", "ggml_backend_buft_alloc_buffer"),
        ("libggml-base.so", "ggml_backend_alloc_ctx_tensors_from_buft"),
        ("libllama.so", "llama_kv_cache_unified::llama_kv_cache_unified"),
        ("libllama.so", "llama_init_from_model"),
        (EXE, "main"),
        LIBC,
    ]
    assert site(*spec) == "llama_kv_cache_unified::llama_kv_cache_unified"


def test_same_namespace_templated_buffers():
    """TensorRT-LLM: the allocator in tensorrt_llm::runtime, the KV manager (whose own name
    says allocate) in tensorrt_llm::batch_manager, one library."""
    lib = "libtensorrt_llm.so"
    assert (
        site(
            (lib, "tensorrt_llm::runtime::CudaAllocatorAsync::allocateImpl"),
            (lib, "tensorrt_llm::runtime::BaseAllocator<...>::allocate"),
            (lib, "tensorrt_llm::runtime::GenericBuffer<...>::GenericBuffer"),
            (lib, "tensorrt_llm::runtime::BufferManager::gpu"),
            (lib, "tensorrt_llm::batch_manager::kv_cache_manager::KVCacheManager::allocatePools"),
            (EXE, "main"),
            LIBC,
        )
        == "tensorrt_llm::batch_manager::kv_cache_manager::KVCacheManager::allocatePools"
    )


def test_stripped_library_allocates_the_weights():
    """A closed, stripped library: its frames are never a site; the caller's code is."""
    assert (
        site(
            ("libnvinfer.so.10", None),
            ("libnvinfer.so.10", None),
            (EXE, "tensorrt_llm::runtime::TllmRuntime::TllmRuntime"),
            (EXE, "main"),
            LIBC,
        )
        == "tensorrt_llm::runtime::TllmRuntime::TllmRuntime"
    )


def test_virtual_arena_and_c_api_table():
    """ONNX Runtime + genai: a lambda of the arena, the C API's global functions, and the KV
    cache in another library of the same family but another namespace."""
    assert (
        site(
            ("libonnxruntime_providers_cuda.so", "onnxruntime::CUDAAllocator::Alloc"),
            ("libonnxruntime.so", "onnxruntime::BFCArena::Extend::{lambda()#1}::operator()"),
            ("libonnxruntime.so", "onnxruntime::BFCArena::AllocateRawInternal"),
            ("libonnxruntime.so", "onnxruntime::Tensor::Tensor"),
            ("libonnxruntime.so", "OrtApis::CreateTensorAsOrtValue"),
            ("libonnxruntime-genai.so", "Generators::KV_Cache::KV_Cache"),
            (EXE, "main"),
            LIBC,
        )
        == "Generators::KV_Cache::KV_Cache"
    )


def test_caching_allocator_under_an_empty_family():
    assert (
        site(
            (
                "libc10_cuda.so",
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block",
            ),
            (
                "libc10_cuda.so",
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
            ),
            ("libtorch_cuda.so", "at::detail::empty_generic"),
            ("libtorch_cuda.so", "at::detail::empty_cuda"),
            (EXE, "app::Model::init_kv"),
            (EXE, "main"),
            LIBC,
        )
        == "app::Model::init_kv"
    )


def test_kv_cache_class_inside_the_runtime_library():
    """TVM/MLC: the KV cache in tvm::runtime::relax_vm, below which tvm::runtime allocates."""
    lib = "libtvm_runtime.so"
    assert (
        site(
            (lib, "tvm::runtime::CUDADeviceAPI::AllocDataSpace"),
            (lib, "tvm::runtime::NDArray::Empty"),
            (lib, "tvm::runtime::relax_vm::PagedAttentionKVCacheObj::PagedAttentionKVCacheObj"),
            (EXE, "main"),
            LIBC,
        )
        == "tvm::runtime::relax_vm::PagedAttentionKVCacheObj::PagedAttentionKVCacheObj"
    )


def test_plain_c_innermost_function_is_the_site():
    """alloc_big_device() called from main: no boundary, nothing folds."""
    assert site((EXE, "alloc_big_device"), (EXE, "main"), LIBC) is None
    assert (
        site(
            (EXE, "device_take"),
            (EXE, "pool_obtain"),
            (EXE, "kv_layer_buffer"),
            (EXE, "main"),
            LIBC,
        )
        is None
    )
    # the program's own global functions never continue a namespaced allocator
    assert site(
        (EXE, "vt::cuda::malloc_device"), (EXE, "alloc_big_device"), (EXE, "main"), LIBC
    ) == ("alloc_big_device")


def test_std_frames_are_never_a_site():
    assert (
        site(
            (EXE, "vt::cuda::(anon)::AllocOnDevice"),
            (EXE, "std::function<...>::operator()"),
            (EXE, "std::make_unique<...>"),
            (EXE, "vllm::Engine::Engine"),
            (EXE, "main"),
            LIBC,
        )
        == "vllm::Engine::Engine"
    )


def test_not_an_allocator():
    """--fold '!REGEX': the fold stops below the function named."""
    spec = [
        (EXE, "vt::cuda::(anon)::AllocOnDevice"),
        (EXE, "vt::Alloc"),
        (EXE, "vllm::Engine::Engine"),
        (EXE, "main"),
        LIBC,
    ]
    assert site(*spec, keep=lambda i: i == 1) == "vt::Alloc"
    assert site(*spec, keep=lambda i: i == 0) is None


@pytest.mark.parametrize(
    "name,scope",
    [
        ("vt::cuda::(anon)::AllocOnDevice", ("vt", "cuda", "(anon)")),
        ("vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer", ("vllm", "v1")),
        ("tensorrt_llm::runtime::GenericBuffer<...>::GenericBuffer", ("tensorrt_llm", "runtime")),
        ("llama_kv_cache_unified::llama_kv_cache_unified", ()),
        ("onnxruntime::BFCArena::Extend::{lambda()#1}::operator()", ("onnxruntime",)),
        ("main", ()),
    ],
)
def test_namespace_scope(name, scope):
    from cudatrace.analyze.sites.layers import split_qualified

    assert namespace_scope(split_qualified(name)) == scope


def test_module_family():
    assert module_family("libggml-cuda.so") == module_family("libggml-base.so") == "ggml"
    assert module_family("libtorch_cuda.so") == "torch"
    assert module_family("vllm-server") == "vllm"


# ---- the entry point is never the code that asked (issue 44) ----------------------------------

ENGINE = {  # eng.cpp at -O0: one namespace, a templated buffer in eng::mem under three callers
    "reserve": [
        (EXE, "eng::mem::DeviceBuffer<...>::DeviceBuffer"),
        (EXE, "std::make_unique<...>"),
        (EXE, "eng::Attention::reserve"),
        (EXE, "main"),
        LIBC,
    ],
    "load": [
        (EXE, "eng::mem::DeviceBuffer<...>::DeviceBuffer"),
        (EXE, "eng::Model::load"),
        (EXE, "main"),
        LIBC,
    ],
    "lambda": [
        (EXE, "eng::mem::DeviceBuffer<...>::DeviceBuffer"),
        (EXE, "eng::Server::start::{lambda}"),
        (EXE, "eng::Server::start"),
        (EXE, "main"),
        LIBC,
    ],
}


def test_main_is_never_the_site_over_the_programs_own_code():
    """eng::Attention::reserve joined eng::mem's allocator only as its enclosing namespace;
    the walk then met main, which is never the code that asked while the program's own code
    stands between: the first frame that left the allocator's namespace is the site."""
    assert site(*ENGINE["reserve"]) == "eng::Attention::reserve"
    assert site(*ENGINE["load"]) == "eng::Model::load"
    fr = [
        BFrame(m, n, m == EXE, "eng::Server::start" if "{lambda}" in n else None)
        for m, n in ENGINE["lambda"]
    ]
    assert fr[boundary_cut(fr)].name == "eng::Server::start::{lambda}"
    # -O2: the constructor inlined into its caller, whose frame is the innermost: no boundary
    # at all, the innermost frame is the site (never main)
    assert site((EXE, "eng::Model::load"), (EXE, "main"), LIBC) is None


def test_main_over_the_allocators_own_code():
    """main calling the program's own allocator: that code stands between main and the
    driver, and the stack shows no boundary (as plain C's alloc_big_device)."""
    assert site((EXE, "eng::mem::DeviceBuffer<...>::DeviceBuffer"), (EXE, "main"), LIBC) is None
    # the allocator's API in an enclosing namespace of one binary: it left the allocator's own
    assert (
        site((EXE, "vt::cuda::(anon)::AllocOnDevice"), (EXE, "vt::Alloc"), (EXE, "main"), LIBC)
        == "vt::Alloc"
    )
    # a library's: the program's own code is main, which asked
    assert (
        site(
            ("libvt.so", "vt::cuda::(anon)::AllocOnDevice"),
            ("libvt.so", "vt::Alloc"),
            (EXE, "main"),
            LIBC,
        )
        == "main"
    )


def test_one_namespace_without_a_boundary_folds_nothing():
    """Allocator and callers in one namespace: main would be the boundary; it is never the
    site, so the stack shows none (the call graph decides, analyze/sites/stacks.py)."""
    assert (
        site(
            (EXE, "eng::DeviceBuffer<...>::DeviceBuffer"),
            (EXE, "eng::Attention::reserve"),
            (EXE, "main"),
            LIBC,
        )
        is None
    )


def test_thread_start_routines_are_entry_points():
    """A thread's start routine (a global function the C library calls) is main's like;
    std::thread's invoker reaches the C++ runtime with no boundary at all: the first frame
    that left the allocator's namespace is the site in both."""
    assert (
        site(
            (EXE, "eng::mem::DeviceBuffer<...>::DeviceBuffer"),
            (EXE, "eng::Worker::run"),
            (EXE, "worker_main"),
            ("libc.so.6", "start_thread"),
        )
        == "eng::Worker::run"
    )
    assert (
        site(
            (EXE, "eng::mem::DeviceBuffer<...>::DeviceBuffer"),
            (EXE, "eng::Worker::run"),
            (EXE, "std::thread::_State_impl<...>::_M_run"),
            ("libstdc++.so.6", "execute_native_thread_routine"),
            ("libc.so.6", "start_thread"),
        )
        == "eng::Worker::run"
    )
    # a global function that is not the outermost one is no entry point
    assert (
        site(
            (EXE, "eng::mem::DeviceBuffer<...>::DeviceBuffer"),
            (EXE, "eng::Worker::run"),
            (EXE, "serve_forever"),
            (EXE, "main"),
            LIBC,
        )
        == "serve_forever"
    )


def test_the_allocators_caller_is_told():
    """boundary_split gives the caller of the allocator below a site, for the call graph's
    fan-out (sites.py): the first frame that joined through an enclosing namespace."""
    from cudatrace.analyze.sites.layers import boundary_split

    fr = frames(
        (EXE, "eng::mem::DeviceBuffer<...>::DeviceBuffer"),
        (EXE, "eng::Attention::reserve"),
        (EXE, "app::Engine::init"),
        (EXE, "main"),
        LIBC,
    )
    assert boundary_split(fr) == (2, 1)
    # vt::Alloc's own namespace (vt::cuda) under vllm: the caller is vt::Alloc
    fr = frames(
        (EXE, "vt::cuda::(anon)::AllocOnDevice"),
        (EXE, "vt::Alloc"),
        (EXE, "vllm::Engine::Engine"),
        (EXE, "main"),
        LIBC,
    )
    assert boundary_split(fr) == (2, 1)
    # nothing widened: no caller
    fr = frames((EXE, "vt::cuda::Alloc"), (EXE, "vllm::Engine::Engine"), (EXE, "main"), LIBC)
    assert boundary_split(fr) == (1, 0)


# ---- a helper of the program that only forwards to a framework's API is a layer ---------------


def fw_site(*spec) -> str | None:
    from cudatrace import frameworks

    m = frameworks.Membership(frameworks.shipped())
    fr = [BFrame(mod, n, mod == EXE, None, m.of(mod, n, mod == EXE)) for mod, n in spec]
    k = boundary_cut(fr)
    return fr[k].name if k else None


ORT = [
    ("libonnxruntime_providers_cuda.so", "onnxruntime::CUDAAllocator::Alloc"),
    ("libonnxruntime.so.1", "onnxruntime::BFCArena::AllocateRawInternal"),
    ("libonnxruntime.so.1", "OrtApis::CreateTensorAsOrtValue"),
]


def test_forwarding_wrapper_over_a_frameworks_c_api():
    """onnxruntime-genai's static CreateTensor over OrtApi::CreateTensorAsOrtValue: named as
    the API it forwards to, it is a layer; the KV cache's constructor that called it asks."""
    kv = "Generators::DefaultKeyValueCache::DefaultKeyValueCache"
    tail = [
        ("libonnxruntime-genai.so", kv),
        ("libonnxruntime-genai.so", "OgaCreate"),
        (EXE, "main"),
    ]
    assert fw_site(*ORT, ("libonnxruntime-genai.so", "CreateTensor"), *tail, LIBC) == kv
    # genai's own OrtValue::CreateTensor (a static member of the C API's type), in a chain
    assert (
        fw_site(
            *ORT,
            ("libonnxruntime-genai.so", "OrtValue::CreateTensor"),
            ("libonnxruntime-genai.so", "Generators::(anon)::CreateTensor"),
            *tail,
            LIBC,
        )
        == kv
    )
    # a helper with a name of its own is the program's code: the site
    assert (
        fw_site(*ORT, ("libonnxruntime-genai.so", "Generators::make_presents"), *tail, LIBC)
        == "Generators::make_presents"
    )
    # called straight from main: main asked
    assert fw_site(*ORT, (EXE, "CreateTensor"), (EXE, "main"), LIBC) == "main"


def test_forwarding_words():
    from cudatrace.analyze.sites.layers import name_words

    assert name_words("OrtApis::CreateTensorAsOrtValue") == [
        "create",
        "tensor",
        "as",
        "ort",
        "value",
    ]
    assert name_words("ggml_backend_alloc_buffer") == ["ggml", "backend", "alloc", "buffer"]
    assert name_words("a::HTTPServer<int>::start2") == ["start", "2"]
    assert name_words("x::HTTPServer") == ["http", "server"]
