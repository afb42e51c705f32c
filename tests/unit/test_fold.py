"""The fold algorithm (analyze/sites/layers.py) on synthetic stacks, names (analyze/sites/names.py), and
attribution end to end on traces written by support/tracegen.py."""

from __future__ import annotations

import json

import pytest

from cudatrace.analyze.documents.analysis import Analysis
from cudatrace.analyze.documents.diff import diff
from cudatrace.analyze.documents.report import build_report
from cudatrace.analyze.sites.layers import CallGraph, compile_patterns
from cudatrace.analyze.sites.names import fit, short_name
from support import tracegen as tg

ALLOC = ("dev", "backend", "tensor")  # innermost first


def S(*f):
    return tuple(f)


def graph(stacks, **kw) -> CallGraph:
    g = CallGraph(**kw)
    g.add(stacks)
    return g


ENGINE = [
    S(*ALLOC, "load_weights", "load_model", "main"),
    S(*ALLOC, "kv_buffer", "init_kv", "load_model", "main"),
    S(*ALLOC, "build_table", "load_model", "main"),
    S(*ALLOC, "workspace", "step", "main"),
]


# ---- the call graph -------------------------------------------------------------------------


def test_engine_layers_and_cuts():
    g = graph(ENGINE)
    assert g.layers == {"tensor"}
    assert [g.cut(s) for s in ENGINE] == [3, 3, 3, 3]


def test_no_shared_function_folds_nothing():
    stacks = [S("load_weights", "main"), S("reserve", "main"), S("layer_kv", "kv", "main")]
    g = graph(stacks)
    assert g.layers == set() and [g.cut(s) for s in stacks] == [0, 0, 0]


def test_single_caller_layer_folds_nothing():
    g = graph([S(*ALLOC, "init", "main")])
    assert g.layers == set() and g.cut(S(*ALLOC, "init", "main")) == 0


def test_forced_layer():
    s = S(*ALLOC, "init", "main")
    g = graph([s])
    assert g.cut(s, forced=lambda i: s[i] == "tensor") == 3


def test_two_callers_one_of_them_an_orchestrator():
    """init_kv calls tensor itself, from load_model (which also loads weights) and from
    reconfigure: only reconfigure is a client, so init_kv is no layer."""
    stacks = [
        S(*ALLOC, "load_weights", "load_model", "main"),
        S(*ALLOC, "init_kv", "load_model", "main"),
        S(*ALLOC, "init_kv", "reconfigure", "main"),
        S(*ALLOC, "workspace", "step", "main"),
    ]
    g = graph(stacks)
    assert g.layers == {"tensor"}
    assert g.cut(stacks[1]) == 3 and g.cut(stacks[2]) == 3


def test_two_pure_clients_do_make_a_layer():
    """The documented limit: two callers that reach allocation only through a function make
    it a layer, whatever its name."""
    stacks = [S("ws", "profile_run", "warmup", "main"), S("ws", "profile_run", "serve", "main")]
    g = graph(stacks)
    assert g.layers == {"profile_run"}
    assert g.cut(stacks[0]) == 2
    assert graph(stacks, min_clients=3).layers == set()


def test_nested_layers_and_a_private_frame_between_them():
    stacks = [
        S("check", "dev", "backend", "tensor", "load_weights", "main"),
        S("check", "dev", "backend", "tensor", "kv", "main"),
        S("check", "direct_user", "main"),
        S("check", "other_user", "main"),
    ]
    g = graph(stacks)
    assert g.layers == {"check", "tensor"}
    # dev and backend have one caller each: private frames between two layers fold
    assert [g.cut(s) for s in stacks] == [4, 4, 1, 1]


def test_private_frames_fold_between_layers_only_inside_one_module():
    """A binding (private: one caller) between a library's layer and the interpreter's stays
    the site: the library's API is crossed there."""

    def M(mod, *names):
        return tuple((mod, n) for n in names)

    lib = M("libtorch", "alloc_block", "empty_call")
    stacks = [
        lib + M("binding", "THP_empty") + M("python", "cfunction_call", "make_call", "eval"),
        lib + M("binding", "THP_zeros") + M("python", "cfunction_call", "vector_call", "eval"),
    ]
    g = graph(stacks)
    assert ("python", "cfunction_call") in g.layers and ("libtorch", "empty_call") in g.layers
    assert [g.cut(s) for s in stacks] == [2, 2]
    same = [tuple(("m", f[1]) for f in s) for s in stacks]
    assert [graph(same).cut(s) for s in same] == [4, 4]


def test_recursion_is_no_caller():
    stacks = ENGINE + [
        S(*ALLOC, "build_table", "build_table", "build_table", "load_model", "main"),
        S(*ALLOC, "tensor", "view", "main"),
    ]
    g = graph(stacks)
    assert g.layers == {"tensor"}
    assert g.cut(stacks[-2]) == 3
    assert g.cut(stacks[-1]) == 4  # tensor calling itself: both fold


def test_tail_call_missing_frame():
    """backend tail-calls dev in some stacks: the frame is missing, the layer is still found."""
    stacks = [
        S("dev", "tensor", "load_weights", "main"),
        S("dev", "backend", "tensor", "kv", "main"),
        S("dev", "backend", "tensor", "table", "main"),
    ]
    g = graph(stacks)
    assert "tensor" in g.layers
    assert [g.cut(s) for s in stacks] == [2, 3, 3]


def test_a_stack_made_of_layers_only():
    stacks = [S("dev", "tensor", "a"), S("dev", "tensor", "b")]
    g = graph(stacks)
    assert g.cut(S("dev", "tensor")) == 2


def test_adding_stacks_changes_the_version():
    g = graph(ENGINE[:1])
    v = g.version
    assert g.layers == set()
    g.add(ENGINE[1:])
    assert g.version > v and g.layers == {"tensor"}
    g.add(ENGINE)
    assert g.version == v + 1


def test_bad_fold_pattern():
    with pytest.raises(ValueError, match="--fold"):
        compile_patterns(["("])


# ---- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "full,short",
    [
        (
            "vt::cuda::(anonymous namespace)::AllocOnDevice(vt::Device, unsigned long)",
            "vt::cuda::(anon)::AllocOnDevice",
        ),
        (
            "LoadedEngine::LoadedEngine(vllm::HfConfig, std::unique_ptr<vllm::LoadedModel, "
            "std::default_delete<vllm::LoadedModel> >, int)",
            "LoadedEngine::LoadedEngine",
        ),
        (
            "vllm::v1::GPUModelRunner::initialize_kv_cache(vllm::KVCacheConfig const&) [clone .cold]",
            "vllm::v1::GPUModelRunner::initialize_kv_cache",
        ),
        ("std::unique_ptr<Foo, std::default_delete<Foo> > make_foo<Foo>(int)", "make_foo<...>"),
        (
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
            "unsigned long, CUstream_st*)",
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
        ),
        ("Foo::operator()(int) const", "Foo::operator()"),
        ("Foo::operator<<(int)", "Foo::operator<<"),
        ("foo(int)::{lambda(int)#1}::operator()(int) const", "foo::{lambda}"),
        (
            "onnxruntime::BFCArena::Extend(unsigned long)::{lambda(unsigned long)#2}::"
            "operator()(unsigned long) const",
            "onnxruntime::BFCArena::Extend::{lambda#2}",
        ),
        (
            "f()::{lambda()#1}::operator()() const::{lambda(int)#1}::_FUN(int)",
            "f::{lambda}::{lambda}",
        ),
        ("foo()::'lambda'(int)::operator()(int) const", "foo::{lambda}"),
        ("Foo::bar()::$_0::operator()() const", "Foo::bar::{lambda}"),
        ("invocation function for block in Foo::bar(int)", "Foo::bar::{block}"),
        ("app::Engine::run(int)::Local::step()", "app::Engine::run::Local::step"),
        (
            "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >::"
            "basic_string[abi:cxx11](char const*)",
            "std::__cxx11::basic_string<...>::basic_string",
        ),
        (
            "_ZN2vt4cuda47_GLOBAL__N__db57ad4a_14_cuda_dropin_cu_acac122913AllocOnDeviceENS_6DeviceEm",
            "vt::cuda::(anon)::AllocOnDevice",
        ),
        ("load_weights", "load_weights"),
        ("main", "main"),
        ("<module>", "<module>"),
        ("main.<locals>.<lambda>", "main.<locals>.<lambda>"),
        ("<genexpr>", "<genexpr>"),
        ("Loader.load.<locals>.<listcomp>", "Loader.load.<locals>.<listcomp>"),
    ],
)
def test_short_name(full, short):
    assert short_name(full) == short


@pytest.mark.parametrize(
    "full,encl",
    [
        (
            "onnxruntime::BFCArena::Extend(unsigned long)::{lambda(unsigned long)#1}::"
            "operator()(unsigned long) const",
            "onnxruntime::BFCArena::Extend",
        ),
        ("app::Engine::run(int)::Local::step()", "app::Engine::run"),
        ("invocation function for block in Foo::bar(int)", "Foo::bar"),
        ("a::(anonymous namespace)::f(int)::{lambda()#1}::operator()() const", "a::(anon)::f"),
        ("vt::cuda::(anonymous namespace)::AllocOnDevice(vt::Device, unsigned long)", None),
        ("Foo::operator()(int) const", None),
        ("main", None),
    ],
)
def test_enclosing_function_of_local_entities(full, encl):
    """A lambda, block or local class is scoped by the function it is in (the boundary rule
    reads that function)."""
    from cudatrace.analyze.sites.names import enclosing

    assert enclosing(full) == encl


def test_fit():
    assert fit("abcdef", 10, terminal=True) == "abcdef"
    assert fit("abcdefghijkl", 8, terminal=True) == "abcde..."
    # off a terminal (files, pipes: pytest's stdout) a line is never cut
    assert fit("abcdefghijkl", 8) == "abcdefghijkl"
    assert fit("abcdefghijkl", 8, terminal=False) == "abcdefghijkl"


def test_fit_elides_the_middle_of_names_first():
    line = (
        "   448.0 MiB  28 x  vllm::v1::GPUModelRunner::CacheBuffer::CacheBuffer "
        "(vt_server.cpp:63) via vt::Alloc"
    )
    got = fit(line, 88, terminal=True)
    assert got == (
        "   448.0 MiB  28 x  vllm::...::CacheBuffer::CacheBuffer (vt_server.cpp:63) via vt::Alloc"
    )
    # narrower: the namespaces go, the class, the function and (file:line) stay
    got = fit("x  ns::a::b::c::Klass::run (a.cc:1)", 32, terminal=True)
    assert got == "x  ns::...::Klass::run (a.cc:1)"


# ---- end to end on written traces -------------------------------------------------------------


class NameSymbolizer:
    """Resolves the made-up addresses of tg.Frames by name; `inline` maps a function to the
    function inlined into it at its call site (an inline chain)."""

    def __init__(self, frames: tg.Frames, inline=None, unknown=()):
        self.frames, self.inline, self.unknown = frames, inline or {}, set(unknown)

    def symbolize(self, ref, addresses):
        by_addr = {a + self.frames.base: n for n, a in self.frames.fake.items()}
        out = {}
        for addr in addresses:
            name = by_addr.get(addr + 1 - 8)
            if name is None or name in self.unknown:
                continue
            chain = []
            if name in self.inline:
                chain.append(
                    tg.FakeFrame(
                        ref.path, self.inline[name], "/src/app.cc", 7, addr, addr - ref.bias, True
                    )
                )
            chain.append(
                tg.FakeFrame(ref.path, name, "/src/app.cc", 100, addr, addr - ref.bias, False)
            )
            out[addr] = chain
        return out

    def warnings(self):
        return []


def write_engine(d, layers: int = 28, inline=None, extra=()):
    d.mkdir(parents=True, exist_ok=True)
    fr = tg.Frames()
    w = tg.TraceWriter(d / "1.0.ctrace", pid=1)
    fr.write_modules(w)
    ts = tg.BASE_TS
    addr = [0x7E0000000000]

    def alloc(stack, size, n=1):
        nonlocal ts
        leaf = w.stack(fr.stack(*stack))
        for _ in range(n):
            ts += tg.MS
            addr[0] += size
            w.alloc(ts, size, addr[0], stack=leaf)

    alloc(ALLOC + ("load_weights", "load_model", "main"), 64 * tg.MiB)
    alloc(ALLOC + ("load_weights", "load_model", "main"), tg.MiB, 20)
    alloc(ALLOC + ("kv_buffer", "init_kv", "load_model", "main"), 16 * tg.MiB, layers)
    alloc(ALLOC + ("build_table", "load_model", "main"), 3 * tg.MiB)
    alloc(ALLOC + ("workspace", "step", "main"), 8 * tg.MiB)
    for stack, size in extra:
        alloc(stack, size)
    w.close(end_ts=ts + tg.MS)
    return fr


def rep(d, sym):
    a = Analysis(d, symbolizer=sym)
    return json.loads(json.dumps(build_report(a)))


def test_report_on_written_engine(tmp_path):
    fr = write_engine(tmp_path / "t")
    r = rep(tmp_path / "t", NameSymbolizer(fr))
    got = {s["frames"][0]["function"]: (s["bytes"], s["count"]) for s in r["sites"]}
    assert got == {
        "kv_buffer": (28 * 16 * tg.MiB, 28),
        "load_weights": (84 * tg.MiB, 21),
        "workspace": (8 * tg.MiB, 1),
        "build_table": (3 * tg.MiB, 1),
    }
    assert r["sites"][0]["label"] == "kv_buffer (app.cc:100)"
    assert [f["function"] for f in r["sites"][0]["via"]] == ["dev", "backend", "tensor"]
    assert r["attribution"]["layers"] == ["tensor"]


def test_inlined_layer_frames(tmp_path):
    """backend inlined into tensor: the symbolizer gives two frames for one address."""
    fr = write_engine(tmp_path / "t")
    sym = NameSymbolizer(fr, inline={"tensor": "backend_inl"})
    r = rep(tmp_path / "t", sym)
    kv = r["sites"][0]
    assert kv["frames"][0]["function"] == "kv_buffer"
    assert [f["function"] for f in kv["via"]] == ["dev", "backend", "backend_inl", "tensor"]
    assert kv["via"][2]["inlined"] is True


def test_unsymbolized_layer(tmp_path):
    """A stripped allocator: its frames are module+offset, still one identity per function."""
    fr = write_engine(tmp_path / "t")
    r = rep(tmp_path / "t", NameSymbolizer(fr, unknown=ALLOC))
    kv = r["sites"][0]
    assert kv["frames"][0]["function"] == "kv_buffer" and kv["count"] == 28
    assert [f["function"] for f in kv["via"]] == [None, None, None]
    assert r["attribution"]["layers"][0].startswith("app+0x")


def test_diff_matches_responsible_code(tmp_path):
    fa = write_engine(tmp_path / "a", layers=28)
    fb = write_engine(tmp_path / "b", layers=8)
    a = Analysis(tmp_path / "a", symbolizer=NameSymbolizer(fa))
    b = Analysis(tmp_path / "b", symbolizer=NameSymbolizer(fb))
    d = diff(a, b)
    top = d["sites"][0]
    assert top["label"] == "kv_buffer (app.cc:100)" and top["status"] == "shrunk"
    assert (top["peak"]["a_count"], top["peak"]["b_count"]) == (28, 8)
    assert [f["function"] for f in top["via"]] == ["dev", "backend", "tensor"]


def test_diff_folds_alike_when_one_run_alone_shows_no_layer(tmp_path):
    """Run B has only the KV cache: alone, its tensor has one caller; with A's stacks it is a
    layer, and both runs name kv_buffer."""
    fa = write_engine(tmp_path / "a")
    d = tmp_path / "b"
    d.mkdir()
    fb = tg.Frames()
    w = tg.TraceWriter(d / "1.0.ctrace", pid=1)
    fb.write_modules(w)
    for name in fa.fake:  # the same made-up addresses as A's
        fb.ip(name)
    leaf = w.stack(fb.stack(*ALLOC, "kv_buffer", "init_kv", "load_model", "main"))
    for i in range(4):
        w.alloc(tg.BASE_TS + i, 16 * tg.MiB, 0x7E0000000000 + i * 16 * tg.MiB, stack=leaf)
    w.close()
    b_alone = rep(d, NameSymbolizer(fb))
    assert b_alone["sites"][0]["frames"][0]["function"] == "dev"
    a = Analysis(tmp_path / "a", symbolizer=NameSymbolizer(fa))
    b = Analysis(d, symbolizer=NameSymbolizer(fb))
    top = diff(a, b)["sites"][0]
    assert top["label"] == "kv_buffer (app.cc:100)"
    assert (top["peak"]["a_count"], top["peak"]["b_count"]) == (28, 4)


def test_std_frame_or_offset_never_heads_a_site(tmp_path):
    """An inlined std:: template (a custom allocator reached from std::vector) or a frame
    without a symbol as the innermost frame: the program's named function heads the site;
    with no named frame of the program's code above, the offset stays."""
    d = tmp_path / "t"
    d.mkdir()
    fr = tg.Frames()
    w = tg.TraceWriter(d / "1.0.ctrace", pid=1)
    fr.write_modules(w)
    stacks = [
        ("std::allocator_traits<eng::DevAlloc>::allocate", "load_model", "main"),
        ("stripped_helper", "build_table", "main"),
        ("stripped_only",),
    ]
    for k, st in enumerate(stacks):
        ts, addr = tg.BASE_TS + (k + 1) * tg.MS, 0x7E0000000000 + (k << 30)
        w.alloc(ts, (k + 1) * tg.MiB, addr, stack=w.stack(fr.stack(*st)))
    w.close(end_ts=tg.BASE_TS + 10 * tg.MS)
    sym = NameSymbolizer(fr, unknown={"stripped_helper", "stripped_only"})
    r = rep(d, sym)
    labels = {s["label"].split(" (")[0] for s in r["sites"]}
    named = {x for x in labels if "+0x" not in x}
    assert named == {"build_table", "load_model"}, labels
    assert len(labels - named) == 1, labels  # stripped_only: nothing named above it


# ---- one namespace, the program never folded away (issue 44) ----------------------------------


def write_stacks(d, stacks, size=16 * tg.MiB):
    """One allocation for each stack (innermost first) of the executable /usr/bin/app."""
    d.mkdir(parents=True, exist_ok=True)
    fr = tg.Frames()
    w = tg.TraceWriter(d / "1.0.ctrace", pid=1)
    fr.write_modules(w)
    for k, st in enumerate(stacks):
        ts, addr = tg.BASE_TS + (k + 1) * tg.MS, 0x7E0000000000 + (k << 30)
        w.alloc(ts, size, addr, stack=w.stack(fr.stack(*st)))
    w.close(end_ts=tg.BASE_TS + 100 * tg.MS)
    return fr


def site_names(d, fr, **attribution) -> list[str]:
    from cudatrace.attribution import Attribution

    a = Analysis(d, Attribution(**attribution), symbolizer=NameSymbolizer(fr))
    r = json.loads(json.dumps(build_report(a)))
    return sorted(s["label"].rsplit(" (", 1)[0] for s in r["sites"])


APP = ("app::Engine::run", "main")
BUFFER = "eng::mem::DeviceBuffer<{}>::DeviceBuffer(unsigned long)"


def test_a_fold_that_fans_out_names_its_callers(tmp_path):
    """The engine's classes (eng::) over its allocator (eng::mem) under app::Engine::run: the
    boundary rule folds each caller into app::Engine::run, an enclosing namespace at a time.
    The run shows three callers folded into that one site: each is its stack's site."""
    stacks = [
        (BUFFER.format("float"), "eng::Attention::reserve(unsigned long)", *APP),
        (BUFFER.format("unsigned short"), "eng::Model::load(unsigned long)", *APP),
        (BUFFER.format("unsigned char"), "eng::Server::start()", *APP),
    ]
    fr = write_stacks(tmp_path / "t", stacks)
    assert site_names(tmp_path / "t", fr) == [
        "eng::Attention::reserve",
        "eng::Model::load",
        "eng::Server::start",
    ]
    # one caller: nothing fans out, app::Engine::run asked
    fr = write_stacks(tmp_path / "one", stacks[:1] * 2)
    assert site_names(tmp_path / "one", fr) == ["app::Engine::run"]


def test_a_templates_instantiations_are_one_layer(tmp_path):
    """Allocator and callers in one namespace (no boundary): DeviceBuffer<T>'s constructor,
    read as one function whatever T, has three clients, a layer."""
    buf = "eng::DeviceBuffer<{}>::DeviceBuffer(unsigned long)"
    stacks = [
        (buf.format("float"), "eng::Attention::reserve(unsigned long)", "main"),
        (buf.format("int"), "eng::Model::load(unsigned long)", "main"),
        (buf.format("char"), "eng::Server::start()", "main"),
    ]
    fr = write_stacks(tmp_path / "t", stacks)
    assert site_names(tmp_path / "t", fr) == [
        "eng::Attention::reserve",
        "eng::Model::load",
        "eng::Server::start",
    ]


def test_template_arguments_kept_where_they_alone_tell_sites_apart(tmp_path):
    """--no-fold: three sites of one template, told apart by their arguments alone, keep them;
    a site whose name is alone elides them, as before."""
    stacks = [
        (BUFFER.format("float"), "eng::Attention::reserve(unsigned long)", "main"),
        (BUFFER.format("int"), "eng::Model::load(unsigned long)", "main"),
        ("eng::Pool<eng::Host>::grow(unsigned long)", "main"),
    ]
    fr = write_stacks(tmp_path / "t", stacks)
    assert site_names(tmp_path / "t", fr, fold=False) == [
        "eng::Pool<...>::grow",
        "eng::mem::DeviceBuffer<float>::DeviceBuffer",
        "eng::mem::DeviceBuffer<int>::DeviceBuffer",
    ]


@pytest.mark.parametrize(
    "qualname,owner",
    [
        ("load.<locals>.<listcomp>", "load"),
        ("Model.load.<locals>.<genexpr>", "Model.load"),
        ("<listcomp>", "<module>"),
        ("<genexpr>", "<module>"),
        ("f.<locals>.g.<locals>.<dictcomp>", "f.<locals>.g"),
        ("f.<locals>.<lambda>", None),
        ("listcomp", None),
        ("f", None),
    ],
)
def test_comprehension_owner(qualname, owner):
    from cudatrace.analyze.sites.names import comprehension_owner

    assert comprehension_owner(qualname) == owner


def test_short_name_keeps_template_arguments_when_asked():
    name = "eng::mem::DeviceBuffer<unsigned short>::DeviceBuffer(unsigned long)"
    assert short_name(name) == "eng::mem::DeviceBuffer<...>::DeviceBuffer"
    assert (
        short_name(name, templates=True) == "eng::mem::DeviceBuffer<unsigned short>::DeviceBuffer"
    )


def test_two_entry_points_of_one_api_read_as_a_fan_out(tmp_path):
    """The documented limit of the fan-out (docs/attribution.md): one site reaching the
    allocator through two functions of its API in an enclosing namespace names the two;
    --fold names them layers."""
    stacks = [
        ("vt::cuda::(anon)::AllocOnDevice(unsigned long)", "vt::Alloc(unsigned long)"),
        ("vt::cuda::(anon)::AllocOnDevice(unsigned long)", "vt::AllocZeroed(unsigned long)"),
    ]
    stacks = [s + ("vllm::CacheBuffer::CacheBuffer()", "main") for s in stacks]
    fr = write_stacks(tmp_path / "t", stacks)
    assert site_names(tmp_path / "t", fr) == ["vt::Alloc", "vt::AllocZeroed"]
    folded = site_names(tmp_path / "t", fr, fold_patterns=("^vt::Alloc",))
    assert folded == ["vllm::CacheBuffer::CacheBuffer"]
