"""Attribution at start-up, on engine shapes (docs/attribution.md), on the simulated driver.

tests/progs/attrib/ holds C++ programs in the shapes of real engines, each built twice
(-O0 with frame pointers, -O2 without: inlined helpers, tail calls through function tables)
by tests/support/attrib_shapes.py:

  vt_server        one binary; vt::cuda::(anon)::AllocOnDevice through a function table and a
                   virtual backend; the KV cache in vllm::v1::GPUModelRunner::CacheBuffer
  vt_server_static the same, the C++ runtime linked statically (no __cxa_demangle)
  trt_server       one namespace family: trt::runtime's templated buffers and CRTP allocator,
                   the KV function trt::batch_manager::...::KVCacheManager::allocatePools
  llamaish-cli     the allocator in two shared C libraries (libggmlish-cuda, -base) under the
                   engine's library (libllamaish: llamaish_kv_cache)
  torchapp         a caching allocator (libmc10) under an `empty` family (libmat), called from
                   the application's own classes (app::Model::init_kv)
  ort_chat         ONNX Runtime's arena and C API under onnxruntime-genai's KV cache
  ort_fwd          the same through genai's static CreateTensor, which only forwards to the API
  eng              issue 44's engine: one namespace, eng::mem::DeviceBuffer<T> under
                   eng::Attention::reserve, eng::Model::load and a lambda of eng::Server::start
  llm_server       libtorch's split (libc10_cuda, libtorch_cpu, libtorch_cuda) under a server
  libtorch_kv      the same under a program named like one of libtorch's libraries
  bigalloc         plain C: alloc_big_device() called once from main IS the site

At start-up only the KV cache allocates (the helper has one client); `--serve` adds weights
and workspaces. Each headline (report, run summary, sweep's law, the denial lines with and
without -q) must name the responsible function.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.attrib_shapes import build
from support.paths import REPO

MiB = 1 << 20

# shape -> (the KV site at start-up, the other sites when serving)
SHAPES = {
    "vt_server": (
        "vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer",
        {"vllm::v1::GPUModelRunner::load_weights", "vllm::entrypoints::profile_run"},
    ),
    "vt_server_static": (
        "vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer",
        {"vllm::v1::GPUModelRunner::load_weights", "vllm::entrypoints::profile_run"},
    ),
    "trt_server": (
        "trt::batch_manager::kv_cache_manager::KVCacheManager::allocatePools",
        {"trt::batch_manager::DecoderBuffers::DecoderBuffers"},
    ),
    "llamaish-cli": (
        "llamaish_kv_cache::llamaish_kv_cache",
        {"llamaish_model::load_tensors"},
    ),
    "torchapp": ("app::Model::init_kv", {"app::Model::load_weights"}),
    # libtorch over libc10_cuda, libtorch_cpu and libtorch_cuda: torch::empty, .to(kCUDA),
    # torch::zeros, at::empty_strided
    "llm_server": (
        "llm::KVCache::KVCache",
        {"llm::Model::load_weights", "llm::Sampler::Sampler", "llm::RopeCache::RopeCache"},
    ),
    # the same libraries under a program whose file name starts like libtorch's own
    # (tools/gpu/libtorch_kv.cpp): torch::empty in a constructor's loop, .to(kCUDA) in a function
    "libtorch_kv": ("llm::KVCache::KVCache", {"llm::load_weights"}),
    # ONNX Runtime's arena growing through a lambda, under onnxruntime-genai's KV cache
    "ort_chat": (
        "Generators::DefaultKeyValueCache::DefaultKeyValueCache",
        {"Generators::Logits::Logits"},
    ),
    # the same, genai's KV cache through a static helper that only forwards to the C API
    "ort_fwd": (
        "Generators::DefaultKeyValueCache::DefaultKeyValueCache",
        {"Generators::Logits::Logits"},
    ),
    # TensorFlow: tsl's BFC arena over stream_executor, in two libraries
    "tf_serving": ("serving::KVStore::KVStore", {"serving::Embedding::Embedding"}),
}
HELPERS = re.compile(
    r"AllocOnDevice|vt::Alloc|CudaBackend|allocateImpl|BaseAllocator|GenericBuffer|CreateTensor|"
    r"BufferManager|ggmlish_|alloc_tensor_range|mc10::|mat::|^c10::|^at::|^torch::|"
    r"operator\(\)|lambda|onnxruntime::|OrtApis|^Ort::|^tsl::|^tensorflow::|stream_executor"
)

_built: dict[tuple[str, bool], Path] = {}


@pytest.fixture(scope="module")
def env(sim, tmp_path_factory):
    e = sim.env(state=sim.new_state(), total_bytes=80 << 30)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e["CUDATRACE_CACHE"] = str(tmp_path_factory.mktemp("symcache"))
    e["COLUMNS"] = "250"
    return e


@pytest.fixture(scope="module")
def shapes(sim, tmp_path_factory):
    base = tmp_path_factory.mktemp("shapes")

    def get(name: str, release: bool) -> Path:
        k = (name, release)
        if k not in _built:
            _built[k] = build(name, base / ("O2" if release else "O0") / name, sim.lib, release)
        return _built[k]

    return get


def cli(env, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cudatrace", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        **kw,
    )


def ok(r) -> str:
    return f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


def sites(env, d: Path) -> dict[str, tuple[int, int]]:
    r = cli(env, "report", d, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    return {s["label"].rsplit(" (", 1)[0]: (s["count"], s["bytes"]) for s in doc["sites"]}


@pytest.mark.parametrize("release", [False, True], ids=["O0", "O2"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_startup_and_serving(env, shapes, tmp_path, shape, release):
    exe = shapes(shape, release)
    kv, others = SHAPES[shape]
    r = cli(env, "run", "-o", tmp_path / "start", "--", exe)
    assert r.returncode == 0, ok(r)
    got = sites(env, tmp_path / "start")
    assert got == {kv: (28, 28 * 16 * MiB)}, got
    # the run summary names it too
    assert re.search(r"28 x  " + re.escape(kv) + r" \(", r.stderr), r.stderr
    r = cli(env, "run", "-o", tmp_path / "serve", "--", exe, "--serve")
    assert r.returncode == 0, ok(r)
    got = sites(env, tmp_path / "serve")
    assert set(got) == {kv} | others, got
    assert got[kv] == (28, 28 * 16 * MiB)
    assert not any(HELPERS.search(label) for label in got), got


@pytest.mark.parametrize("release", [False, True], ids=["O0", "O2"])
def test_plain_c_keeps_its_innermost_function(env, shapes, tmp_path, release):
    r = cli(env, "run", "-o", tmp_path / "t", "--", shapes("bigalloc", release))
    assert r.returncode == 0, ok(r)
    got = sites(env, tmp_path / "t")
    assert got == {"alloc_big_device": (1, 448 * MiB)}, got


def denial_lines(r) -> tuple[str, str]:
    lines = r.stderr.splitlines()
    shim = next((x for x in lines if "budget exceeded" in x), None)
    named = next((x for x in lines if x.startswith("cudatrace: denied ")), None)
    assert shim and named, ok(r)
    return shim, named


@pytest.mark.parametrize("quiet", [False, True], ids=["loud", "q"])
@pytest.mark.parametrize("release", [False, True], ids=["O0", "O2"])
def test_denial_names_the_kv_code_static_runtime(env, shapes, tmp_path, release, quiet):
    """The C++ runtime linked statically: no __cxa_demangle; the shim's own demangler and
    rule name the KV code; -q keeps both denial lines and drops the chatter."""
    exe = shapes("vt_server_static", release)
    q = ["-q"] if quiet else []
    r = cli(env, "run", *q, "-o", tmp_path / "t", "--budget", "200MiB", "--", exe)
    assert r.returncode == 1, ok(r)
    shim, named = denial_lines(r)
    assert "_Z" not in shim and "_Z" not in named
    # -O2 inlines the constructor into initialize_kv_cache: the hints name it, the DWARF's
    # line table its line
    kv = "vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer"
    assert re.search(r"; at " + kv + r" \(vt_server\.cpp:\d+\) via ", shim), shim
    assert "vt::cuda::(anon)::AllocOnDevice" in shim
    assert re.search(
        r"denied 16\.0 MiB \(cuMemAlloc_v2\) at vllm::v1::GPUModelRunner::CacheBuffer::"
        r"CacheBuffer \(vt_server\.cpp:\d+\) via vt::Alloc > vt::cuda::\(anon\)::AllocOnDevice; "
        r"budget 200\.0 MiB",
        named,
    ), named
    assert "fatal: cudaMalloc: out of memory" in r.stderr
    chatter = ("cudatrace: tracing", "top call sites", "full report:")
    assert all((c in r.stderr) != quiet for c in chatter), ok(r)


def test_denial_without_the_launcher(env, shapes, tmp_path, monkeypatch):
    """Plain LD_PRELOAD with a budget's ledger, no launcher (and quiet): the shim's line alone
    names the KV code, through the same rule in its cheap form (native/shim/deny.c). Built at
    -O0 nothing was inlined there (its DWARF says so): no "inlined into it"."""
    from cudatrace import native
    from cudatrace.record import budget

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    ledger, _ = budget.setup_ledger("200MiB", None)
    e = dict(env)
    e.update(
        LD_PRELOAD=str(native.shim_path()),
        CUDATRACE_MODE="none",
        CUDATRACE_LEDGER=str(ledger.path),
        CUDATRACE_QUIET="1",
    )
    try:
        r = subprocess.run(
            [str(shapes("trt_server", False))], env=e, capture_output=True, text=True, timeout=60
        )
    finally:
        ledger.finish()
    assert r.returncode == 1, ok(r)
    shim = [x for x in r.stderr.splitlines() if "budget exceeded" in x]
    assert len(shim) == 1, ok(r)
    assert re.search(
        r"; at trt::batch_manager::kv_cache_manager::KVCacheManager::allocatePools "
        r"\(trt_server\.cpp:\d+\) via "
        r"trt::runtime::BufferManager::gpu > .*"
        r"trt::runtime::CudaAllocator::allocateImpl, called from main;",
        shim[0],
    ), shim[0]


# ---- frameworks over several libraries, lambdas, inlined helpers: every headline ------------

NEW_SHAPES = {
    "llm_server": SHAPES["llm_server"][0],
    "libtorch_kv": SHAPES["libtorch_kv"][0],
    "ort_chat": SHAPES["ort_chat"][0],
    "ort_fwd": SHAPES["ort_fwd"][0],
    "tf_serving": SHAPES["tf_serving"][0],
    "plain_c": "alloc_big_device",
}


@pytest.mark.parametrize("quiet", [False, True], ids=["loud", "q"])
@pytest.mark.parametrize("release", [False, True], ids=["O0", "O2"])
@pytest.mark.parametrize("shape", sorted(NEW_SHAPES))
def test_denial_lines_name_the_code(env, shapes, tmp_path, shape, release, quiet):
    """Under the launcher both denial lines name the code that sized the memory, as the
    report does: the shim's through the launcher's hints (a framework's libraries, the
    functions -O2 inlined, which only the DWARF shows)."""
    exe = shapes(shape, release)
    kv = NEW_SHAPES[shape]
    q = ["-q"] if quiet else []
    r = cli(env, "run", *q, "-o", tmp_path / "t", "--budget", "200MiB", "--", exe)
    assert r.returncode == 1, ok(r)
    shim, named = denial_lines(r)
    assert re.search(r"; at " + re.escape(kv) + r" \([^ )]+\.c(pp)?:\d+\)[ ;]", shim), shim
    assert "inlined into it" not in shim, shim
    assert re.search(r"denied [\d.]+ MiB \(cuMemAlloc_v2\) at " + re.escape(kv) + r" \(", named), (
        named
    )
    assert not HELPERS.search(shim.split("; at ", 1)[1].split(" (", 1)[0]), shim
    assert (tmp_path / "t" / "hints.txt").is_file()
    assert "operator()" not in shim and "operator()" not in named
    if shape == "ort_chat" and not release:  # the arena's lambda (-O2: a tail call drops it)
        assert "onnxruntime::BFCArena::Extend::{lambda}" in shim, shim
    assert all(("cudatrace: tracing" in r.stderr) != quiet for _ in (0,)), ok(r)


def _without_launcher(env, exe, tmp_path, monkeypatch, **extra) -> str:
    """The shim's one line for a run under plain LD_PRELOAD with a budget's ledger."""
    from cudatrace import native
    from cudatrace.record import budget

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    ledger, _ = budget.setup_ledger("200MiB", None)
    e = dict(env)
    e.update(
        LD_PRELOAD=str(native.shim_path()),
        CUDATRACE_MODE="none",
        CUDATRACE_LEDGER=str(ledger.path),
        CUDATRACE_QUIET="1",
        **extra,
    )
    try:
        r = subprocess.run([str(exe)], env=e, capture_output=True, text=True, timeout=60)
    finally:
        ledger.finish()
    assert r.returncode == 1, ok(r)
    lines = [x for x in r.stderr.splitlines() if "budget exceeded" in x]
    assert len(lines) == 1, ok(r)
    return lines[0]


@pytest.mark.parametrize("release", [False, True], ids=["O0", "O2"])
@pytest.mark.parametrize("shape", sorted(NEW_SHAPES))
def test_denial_without_the_launcher_names_the_code(
    env, shapes, tmp_path, monkeypatch, shape, release
):
    """Without the launcher the shim knows the frameworks (the shipped table) and lambdas, and
    reads the module's DWARF itself (native/shim/dwarf.c, dwline.c): the calls the compiler
    inlined and the line table. Its line names the code the report names, with its file and
    line, at -O0 and at -O2."""
    exe = shapes(shape, release)
    kv = NEW_SHAPES[shape]
    site = _without_launcher(env, exe, tmp_path, monkeypatch).split("; at ", 1)[1]
    assert re.match(re.escape(kv) + r" \([^ )]+\.c(pp)?:\d+\)[ ;,]", site), site
    assert "inlined into it" not in site, site


def test_denial_where_the_dwarf_cannot_be_read_says_so(env, sim, tmp_path, monkeypatch):
    """Compressed debug sections (the shim has no zlib): the function the compiler inlined
    cannot be named at the moment; the line names the one it was inlined into, and says so,
    never another site. The launcher's hints, handed over by hand, name it."""
    from cudatrace.record.hints import write_hints
    from support.attrib_shapes import SRC

    exe = tmp_path / "plain_c"
    r = subprocess.run(
        ["cc", "-O2", "-g", "-gz", f"-I{SRC}", "-o", str(exe), str(SRC / "plain_c.c")]
        + [f"-L{sim.lib}", f"-Wl,-rpath,{sim.lib}", "-lcuda"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    line = _without_launcher(env, exe, tmp_path, monkeypatch)
    assert re.search(r"; at main \(plain_c\+0x[0-9a-f]+, or a function inlined into it\)", line), (
        line
    )
    assert "alloc_big_device" not in line, line
    hints = write_hints(tmp_path, str(exe), dict(env))
    assert hints is not None
    line = _without_launcher(env, exe, tmp_path, monkeypatch, CUDATRACE_HINTS=str(hints))
    assert line.split("; at ", 1)[1].startswith("alloc_big_device ("), line


@pytest.mark.parametrize("shape", ["llm_server", "libtorch_kv", "ort_chat", "tf_serving"])
def test_tree_diff_and_sweep_name_the_code(env, shapes, tmp_path, shape):
    """The caller tree marks the program's function as the site, diff matches it across a
    -O0 and an -O2 build, and a sweep's law belongs to it."""
    kv, others = SHAPES[shape]
    a, b = shapes(shape, False), shapes(shape, True)
    for exe, layers, d in ((a, "28", "a"), (b, "8", "b")):
        r = cli(env, "run", "-q", "-o", tmp_path / d, "--", exe, "--layers", layers, "--serve")
        assert r.returncode == 0, ok(r)
    r = cli(env, "report", tmp_path / "a", "--tree", "--json")
    assert r.returncode == 0, r.stderr
    site_labels: list[str] = []

    def walk(n):
        if n["site"]:
            site_labels.append(n["label"].rsplit(" (", 1)[0])
        for c in n["children"]:
            walk(c)

    walk(json.loads(r.stdout)["tree"]["root"])
    assert set(site_labels) == {kv} | others, site_labels
    r = cli(env, "diff", tmp_path / "a", tmp_path / "b", "--json")
    assert r.returncode == 0, r.stderr
    got = {s["label"].rsplit(" (", 1)[0]: s["status"] for s in json.loads(r.stdout)["sites"]}
    assert got == {kv: "shrunk", **{o: "same" for o in others}}, got
    r = cli(
        env, "sweep", "--values", "4,8", "-o", tmp_path / "sw", "--json", "--", b, "--layers", "{}"
    )
    assert r.returncode == 0, ok(r)
    top = json.loads(r.stdout)["sites"][0]
    assert top["label"].startswith(kv + " ("), top
    assert top["fit"]["slope"] == 16 * MiB and top["fit"]["intercept"] == 0, top["fit"]


def test_frameworks_file_turns_one_off(env, shapes, tmp_path):
    """A user's file (CUDATRACE_FRAMEWORKS) overrides the shipped table: with PyTorch turned
    off, libtorch's own boundary (another library family, another namespace) shows again,
    in the report and in the shim's line."""
    conf = tmp_path / "frameworks.conf"
    conf.write_text("# not a framework here\npytorch off\n")
    e = dict(env, CUDATRACE_FRAMEWORKS=str(conf))
    exe = shapes("llm_server", False)
    r = cli(e, "run", "-q", "-o", tmp_path / "t", "--budget", "200MiB", "--", exe)
    assert r.returncode == 1, ok(r)
    shim, named = denial_lines(r)
    assert "; at llm::KVCache::KVCache (" not in shim, shim
    assert "at llm::KVCache::KVCache (" not in named, named
    assert sites(e, tmp_path / "t") != {"llm::KVCache::KVCache": (28, 28 * 16 * MiB)}
    conf.write_text("pytorch modules=libc10,libtorch namespaces=c10,at,torch\nbad line\n")
    bad = cli(e, "report", tmp_path / "t")
    assert bad.returncode == 2 and "frameworks.conf:2" in bad.stderr, bad.stderr


def test_denial_below_the_context(sim, shapes, tmp_path):
    """A budget below one process's CUDA context: both lines say what in use is made of and
    that every allocation will be denied."""
    e = sim.env(state=sim.new_state(), total_bytes=80 << 30, ctx_bytes=300 * MiB)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e["CUDATRACE_CACHE"] = str(tmp_path / "symcache")
    r = cli(
        e, "run", "-q", "-o", tmp_path / "t", "--budget", "200MiB", "--", shapes("vt_server", False)
    )
    assert r.returncode == 1, ok(r)
    shim, named = denial_lines(r)
    assert "in use 300.00 MiB (allocations 0 B, CUDA contexts 300.00 MiB of 1 process)" in shim
    assert "every allocation will be denied" in shim
    assert "in use 300.0 MiB (allocations 0 B, CUDA contexts 300.0 MiB)" in named
    assert "every allocation will be denied" in named


def test_sweep_law_names_the_kv_code(env, shapes, tmp_path):
    r = cli(
        env,
        "sweep",
        "--values",
        "4,8,16",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        shapes("vt_server", True),
        "--layers",
        "{}",
    )
    assert r.returncode == 0, ok(r)
    doc = json.loads(r.stdout)
    top = doc["sites"][0]
    assert top["label"].startswith("vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer ("), top
    assert top["fit"]["slope"] == 16 * MiB and top["fit"]["intercept"] == 0, top["fit"]
    text = cli(env, "sweep", "--from", tmp_path / "sw").stdout
    assert "CacheBuffer::CacheBuffer" in text and "AllocOnDevice (" not in text, text


def test_not_an_allocator(env, shapes, tmp_path):
    """--fold '!REGEX' says a function is not an allocator: the fold stops below it."""
    r = cli(env, "run", "-q", "-o", tmp_path / "t", "--", shapes("trt_server", False))
    assert r.returncode == 0, ok(r)
    r = cli(env, "report", tmp_path / "t", "--json", "--fold", "!BufferManager::gpu$")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["label"].rsplit(" (", 1)[0] for s in doc["sites"]] == [
        "trt::runtime::BufferManager::gpu"
    ]
    assert doc["attribution"]["patterns"] == ["!BufferManager::gpu$"]
    bad = cli(env, "report", tmp_path / "t", "--fold", "!(")
    assert bad.returncode == 2 and "--fold" in bad.stderr


# ---- one attribution across runs ---------------------------------------------------------------


def test_sweep_attributes_its_runs_together(env, shapes, tmp_path):
    """kvgrow: in runs of 4 and 8 layers tensor_new has one client (each alone names
    device_get); at 16 a second client shows it is a layer. The sweep learns the layers from
    all its runs: the law is kv_buffer's in every run."""
    exe = shapes("kvgrow", False)
    r = cli(
        env,
        "sweep",
        "--values",
        "4,8,16",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        exe,
        "--layers",
        "{}",
    )
    assert r.returncode == 0, ok(r)
    doc = json.loads(r.stdout)
    alone = sites(env, Path(doc["runs"][0]["directory"]))
    assert list(alone) == ["device_get"], alone  # what one run decides by itself
    labels = [s["label"].rsplit(" (", 1)[0] for s in doc["sites"]]
    assert labels[0] == "kv_buffer", labels
    top = doc["sites"][0]
    assert top["fit"]["slope"] == 16 * MiB and top["fit"]["intercept"] == 0, top
    assert "device_get" not in labels and "tensor_new" not in labels, labels
    again = json.loads(cli(env, "sweep", "--from", tmp_path / "sw", "--json").stdout)
    assert [s["label"] for s in again["sites"]] == [s["label"] for s in doc["sites"]]


def test_diff_across_executable_names(env, shapes, tmp_path):
    """Two builds of one program under different names (server-b1234 at -O0, server-b1300
    rebuilt at -O2): sites match by the code, not by the executable's name (never `_start`)."""
    import shutil

    (tmp_path / "bin").mkdir()
    a, b = tmp_path / "bin" / "server-b1234", tmp_path / "bin" / "server-b1300"
    shutil.copy(shapes("vt_server", False), a)
    shutil.copy(shapes("vt_server", True), b)
    for exe, layers in ((a, "28"), (b, "8")):
        r = cli(
            env,
            "run",
            "-q",
            "-o",
            tmp_path / exe.name / "t",
            "--",
            exe,
            "--layers",
            layers,
            "--serve",
        )
        assert r.returncode == 0, ok(r)
    r = cli(env, "diff", tmp_path / a.name / "t", tmp_path / b.name / "t", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    got = {s["label"].rsplit(" (", 1)[0]: s["status"] for s in doc["sites"]}
    assert got == {
        "vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer": "shrunk",
        "vllm::v1::GPUModelRunner::load_weights": "same",
        "vllm::entrypoints::profile_run": "same",
    }, got
    kv = doc["sites"][0]
    assert (kv["peak"]["a_count"], kv["peak"]["b_count"]) == (28, 8)


def test_labels_never_cut_off_a_terminal(env, shapes, tmp_path):
    """Written to a pipe or a file, a label is whole whatever $COLUMNS says (report, diff,
    the tree, sweep); two sites never print alike."""
    exe = shapes("vt_server", False)
    for n in ("a", "b"):
        r = cli(env, "run", "-q", "-o", tmp_path / n, "--", exe, "--serve")
        assert r.returncode == 0, ok(r)
    narrow = dict(env, COLUMNS="60")
    kv = "vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer (vt_server.cpp:"
    for args in (
        ("report", tmp_path / "a"),
        ("report", tmp_path / "a", "--tree"),
        ("diff", tmp_path / "a", tmp_path / "b"),
    ):
        r = cli(narrow, *args)
        assert r.returncode == 0, r.stderr
        assert kv in r.stdout, (args, r.stdout)
        assert "CacheB..." not in r.stdout


# ---- one namespace, three callers of a templated buffer (issue 44) ----------------------------

ENGINE = {
    "eng::Attention::reserve": (1, 1536 * MiB),
    "eng::Model::load": (1, 400 * MiB),
    "eng::Server::start::{lambda}": (1, 32 * MiB),
}


@pytest.fixture(scope="module")
def engines(sim, tmp_path_factory):
    """eng.cpp by g++ at -O0 and at -O2 -g, and by clang (zig c++) at -O2 -g."""
    from support.attrib_shapes import build_clang

    base = tmp_path_factory.mktemp("eng")
    return {
        "gcc-O0": build("eng", base / "O0", sim.lib, False),
        "gcc-O2": build("eng", base / "O2", sim.lib, True),
        "clang-O2": build_clang("eng", base / "clang", sim.lib),
    }


def shim_sites(r) -> list[str]:
    """The code each of the shim's denial lines names, as `name (file:line)`."""
    return [
        x.split("; at ", 1)[1].split(" via ", 1)[0].split(", called from", 1)[0]
        for x in r.stderr.splitlines()
        if "budget exceeded" in x
    ]


def assert_three(sites_named: list[str], what, each_once: bool = True) -> None:
    names = [re.sub(r" \(eng\.cpp:\d+\)$", "", x) for x in sites_named]
    assert (sorted(names) if each_once else sorted(set(names))) == sorted(ENGINE), what
    assert all(re.search(r" \(eng\.cpp:\d+\)$", x) for x in sites_named), what


@pytest.mark.parametrize("build_name", ["gcc-O0", "gcc-O2", "clang-O2"])
def test_engine_in_one_namespace_names_its_three_callers(
    env, engines, tmp_path, monkeypatch, build_name
):
    """eng::mem::DeviceBuffer<T> under eng::Attention::reserve, eng::Model::load and a lambda
    of eng::Server::start: every output names the three callers, never main (which every
    output named alone, 100 %, before): the run summary, the report's text, JSON and HTML,
    the diff, the denial lines of the shim (with the launcher, --no-trace, and the environment
    contract without it, each with its file and line) and of the launcher."""
    exe = engines[build_name]
    r = cli(env, "run", "-o", tmp_path / "a", "--", exe)
    assert r.returncode == 0, ok(r)
    assert_three(re.findall(r"\d+ x  (\S+ \(eng\.cpp:\d+\))", r.stderr), r.stderr)
    assert sites(env, tmp_path / "a") == ENGINE
    text = cli(env, "report", tmp_path / "a", "--html", tmp_path / "a.html")
    assert text.returncode == 0, text.stderr
    assert_three(re.findall(r"#\d+ (\S+ \(eng\.cpp:\d+\))", text.stdout), text.stdout, False)
    assert "main (eng.cpp" not in text.stdout.split("Call stacks", 1)[0], text.stdout
    html = (tmp_path / "a.html").read_text()
    assert all(name + " (eng.cpp:" in html for name in ENGINE)
    # the diff: a run with every size halved, matched site by site
    r = cli(env, "run", "-q", "-o", tmp_path / "b", "--", exe, "--scale", "2")
    assert r.returncode == 0, ok(r)
    r = cli(env, "diff", tmp_path / "a", tmp_path / "b", "--json")
    assert r.returncode == 0, r.stderr
    got = {s["label"].rsplit(" (", 1)[0]: s["status"] for s in json.loads(r.stdout)["sites"]}
    assert got == {name: "shrunk" for name in ENGINE}, got
    # denial lines: a budget below each of the three
    r = cli(env, "run", "-o", tmp_path / "d", "--budget", "16MiB", "--", exe)
    assert r.returncode == 0 and r.stdout.strip() == "ready", ok(r)
    assert_three(shim_sites(r), ok(r))
    named = re.findall(
        r"cudatrace: denied [\d.]+ \S+ \(cuMemAlloc_v2\) at (\S+ \(eng\.cpp:\d+\))", r.stderr
    )
    assert_three(named, ok(r))
    r = cli(env, "run", "-q", "--no-trace", "--budget", "16MiB", "--", exe)
    assert_three(shim_sites(r), ok(r))
    # the environment contract, no launcher: the shim reads the DWARF itself
    from cudatrace import native
    from cudatrace.record import budget

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    ledger, _ = budget.setup_ledger("16MiB", None)
    e = dict(env, LD_PRELOAD=str(native.shim_path()), CUDATRACE_MODE="none")
    e.update(CUDATRACE_LEDGER=str(ledger.path), CUDATRACE_QUIET="1")
    try:
        r = subprocess.run([str(exe)], env=e, capture_output=True, text=True, timeout=60)
    finally:
        ledger.finish()
    assert_three(shim_sites(r), ok(r))
