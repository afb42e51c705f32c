"""Attribution through allocator layers (docs/attribution.md), on the simulated driver.

tests/progs/layers.c allocates everything through tensor_create -> pool_obtain -> device_take
(three levels, neutral names) from a weights loader (1 x 64 MiB + K x 1 MiB), a KV cache
(N x M MiB, one kv_layer_buffer per layer), a table builder (3 MiB) and a per-step workspace
(8 MiB, one live at a time); tests/progs/layers_cpp.cpp does the same in C++ (namespaces, a
class template, an anonymous namespace, constructors). Each subsystem must be its own site with
exact bytes and count, no site headed by a layer function, and the run summary, `diff` and the
budget denial must name the KV code.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import children
from support.cli import checkout_env, cudatrace
from support.paths import PROGS

MiB = 1 << 20
LAYER_FUNCS = {"tensor_create", "pool_obtain", "device_take"}
WEIGHTS = 64 * MiB + 20 * MiB


@pytest.fixture(scope="module")
def progs(sim, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("layers")
    flags = ["-O0", "-g", "-fno-omit-frame-pointer", "-rdynamic"]
    built = {}
    for name, cc, src in (("layers", "cc", "layers.c"), ("layers_cpp", "g++", "layers_cpp.cpp")):
        if not shutil.which(cc):
            continue
        r = subprocess.run(
            [cc, *flags, "-o", str(out / name), str(PROGS / src), f"-L{sim.lib}", "-lcuda"],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        built[name] = out / name
    return built


def need(progs, name):
    if name not in progs:
        pytest.fail(f"no compiler for {name} (cc / g++): the suite needs both")
    return progs[name]


def cli(env, *args, **kw) -> subprocess.CompletedProcess:
    return cudatrace(env, *args, **kw)


@pytest.fixture(scope="module")
def env(sim, tmp_path_factory):
    e = sim.env(state=sim.new_state(), total_bytes=80 << 30)
    e = checkout_env(e)
    e["CUDATRACE_CACHE"] = str(tmp_path_factory.mktemp("symcache"))
    e["COLUMNS"] = "200"
    return e


def run(env, out: Path, prog: Path, *flags, opts=()) -> subprocess.CompletedProcess:
    r = cli(env, "run", "-o", out, "--force", *opts, "--", prog, *flags)
    r.out = out
    return r


def report(env, d: Path, *opts) -> dict:
    r = cli(env, "report", d, "--json", *opts)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def by_function(doc: dict) -> dict:
    return {s["frames"][0]["function"]: s for s in doc["sites"] if s["frames"]}


def ok(r) -> str:
    return f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


@pytest.fixture(scope="module")
def base(env, progs, tmp_path_factory):
    d = tmp_path_factory.mktemp("base")
    prog = need(progs, "layers")
    return {n: run(env, d / ("n%d" % n), prog, "--kv-layers", n) for n in (28, 8)}


# ---- C: each subsystem its own site ----------------------------------------------------------


def test_each_subsystem_is_its_own_site(env, base):
    r = base[28]
    assert r.returncode == 0, ok(r)
    doc = report(env, r.out)
    sites = by_function(doc)
    expect = {
        "kv_layer_buffer": (28 * 16 * MiB, 28),
        "load_weights": (WEIGHTS, 21),
        "build_table": (3 * MiB, 1),
        "step_workspace": (8 * MiB, 1),
    }
    assert {f: (s["bytes"], s["count"]) for f, s in sites.items()} == expect
    assert not LAYER_FUNCS & set(sites)
    kv = sites["kv_layer_buffer"]
    assert doc["sites"][0] is kv or doc["sites"][0]["label"] == kv["label"]
    assert re.match(r"kv_layer_buffer \(layers\.c:\d+\)$", kv["label"]), kv["label"]
    assert [f["function"] for f in kv["via"]] == ["device_take", "pool_obtain", "tensor_create"]
    assert [f["function"] for f in kv["context"][:5]] == [
        "device_take",
        "pool_obtain",
        "tensor_create",
        "kv_layer_buffer",
        "init_kv_cache",
    ]
    assert doc["attribution"]["layers"] == ["tensor_create"]
    assert doc["attribution"]["fold"] is True


def test_run_summary_names_the_kv_code(base):
    err = base[28].stderr
    top = next(line for line in err.splitlines() if " x  " in line)
    assert re.search(
        r"448\.0 MiB .* 28 x  kv_layer_buffer \(layers\.c:\d+\) via tensor_create", top
    ), err


def test_report_text_shows_site_and_layers(env, base):
    r = cli(env, "report", base[28].out)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if "#1 kv_layer_buffer" in line)
    assert "448.0 MiB" in lines[i]
    assert "via tensor_create > pool_obtain > device_take > cuMemAlloc_v2" in lines[i + 1]
    assert any("from tensor_create" in line and "[layer]" in line for line in lines)
    assert any("from kv_layer_buffer" in line and "<- the site" in line for line in lines)
    assert all(len(line) <= 200 for line in lines)


def test_diff_matches_the_kv_code(env, base):
    r = cli(env, "diff", base[28].out, base[8].out, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    top = doc["sites"][0]
    assert top["label"].startswith("kv_layer_buffer ("), top["label"]
    assert top["status"] == "shrunk"
    assert (top["peak"]["a_count"], top["peak"]["b_count"]) == (28, 8)
    assert top["peak"]["delta_bytes"] == -20 * 16 * MiB
    same = {s["label"].split()[0]: s["status"] for s in doc["sites"][1:]}
    assert same == {"load_weights": "same", "build_table": "same", "step_workspace": "same"}
    text = cli(env, "diff", base[28].out, base[8].out).stdout
    line = next(x for x in text.splitlines() if "kv_layer_buffer" in x)
    assert "shrunk" in line and "-320.0 MiB" in line, text


def test_no_fold_shows_the_innermost_frame(env, base):
    doc = report(env, base[28].out, "--no-fold")
    assert [s["frames"][0]["function"] for s in doc["sites"]] == ["device_take"]
    assert doc["sites"][0]["count"] == 51 and doc["sites"][0]["via"] == []
    assert doc["attribution"]["fold"] is False


def test_tree(env, base):
    r = cli(env, "report", base[28].out, "--tree")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Caller tree at the peak" in out
    lines = out.splitlines()
    k = next(i for i, x in enumerate(lines) if "kv_layer_buffer" in x)
    line = lines[k]
    assert "<- site" in line and "448.0 MiB" in line
    # the site on its own line, one level under the chain that leads to it; the layers below
    # it collapsed after via
    assert re.search(
        r"^ +448\.0 MiB .* {2}kv_layer_buffer \(layers\.c:\d+\) <- site via "
        r"tensor_create > pool_obtain > device_take \[layers\]$",
        line,
    ), line
    assert re.search(r"  init_kv_cache \(layers\.c:\d+\)$", lines[k - 1]), lines[k - 1]
    assert line.index("kv_layer_buffer") - lines[k - 1].index("init_kv_cache") == 2
    main = next(x for x in out.splitlines() if " main (" in x)
    assert "543.0 MiB" in main
    doc = json.loads(cli(env, "report", base[28].out, "--tree", "--json").stdout)
    assert doc["tree"]["total_bytes"] == 543 * MiB


# ---- variants --------------------------------------------------------------------------------


def test_single_caller_layer_folds_nothing_unless_told(env, progs, tmp_path):
    r = run(env, tmp_path / "single", need(progs, "layers"), "--single")
    assert r.returncode == 0, ok(r)
    doc = report(env, r.out)
    assert [s["frames"][0]["function"] for s in doc["sites"]] == ["device_take"]
    assert doc["attribution"]["layers"] == []
    doc = report(env, r.out, "--fold", "^tensor_create$")
    assert [(s["frames"][0]["function"], s["count"]) for s in doc["sites"]] == [
        ("load_weights", 21)
    ]
    assert [f["function"] for f in doc["sites"][0]["via"]] == [
        "device_take",
        "pool_obtain",
        "tensor_create",
    ]
    assert doc["attribution"]["patterns"] == ["^tensor_create$"]
    bad = cli(env, "report", r.out, "--fold", "(")
    assert bad.returncode == 2 and "--fold" in bad.stderr


def test_nested_layers_fold_together(env, progs, tmp_path):
    r = run(env, tmp_path / "nested", need(progs, "layers"), "--raw-workspace")
    assert r.returncode == 0, ok(r)
    doc = report(env, r.out)
    sites = by_function(doc)
    assert set(sites) == {"kv_layer_buffer", "load_weights", "build_table", "step_workspace"}
    assert [f["function"] for f in sites["step_workspace"]["via"]] == ["device_take", "pool_obtain"]
    assert [f["function"] for f in sites["kv_layer_buffer"]["via"]] == [
        "device_take",
        "pool_obtain",
        "tensor_create",
    ]
    assert doc["attribution"]["layers"] == ["pool_obtain", "tensor_create"]


def test_recursion(env, progs, tmp_path):
    r = run(env, tmp_path / "rec", need(progs, "layers"), "--recursive-table")
    assert r.returncode == 0, ok(r)
    sites = by_function(report(env, r.out))
    assert (sites["build_table"]["bytes"], sites["build_table"]["count"]) == (3 * MiB, 1)
    assert sites["kv_layer_buffer"]["count"] == 28


def test_two_callers_do_not_make_a_layer_of_the_kv_initializer(env, progs, tmp_path):
    """init_kv_cache (calling tensor_create itself) is called by load_model, which also loads
    the weights, and by reconfigure: two callers, but only one reaches allocation through it
    alone. It is the site, not folded into its callers."""
    r = run(env, tmp_path / "trap", need(progs, "layers"), "--direct-kv", "--reconfigure")
    assert r.returncode == 0, ok(r)
    doc = report(env, r.out)
    sites = by_function(doc)
    assert (sites["init_kv_cache"]["bytes"], sites["init_kv_cache"]["count"]) == (28 * 16 * MiB, 28)
    assert not {"load_model", "reconfigure"} & set(sites)
    assert doc["attribution"]["layers"] == ["tensor_create"]


def test_stacks_off(env, progs, tmp_path):
    r = run(env, tmp_path / "nostack", need(progs, "layers"), opts=("--stack-depth", "0"))
    assert r.returncode == 0, ok(r)
    doc = report(env, r.out)
    assert len(doc["sites"]) == 1 and doc["sites"][0]["via"] == []
    assert "no stack recorded" in doc["sites"][0]["label"]
    assert cli(env, "report", r.out, "--tree").returncode == 0


# ---- the denial, at the moment ---------------------------------------------------------------


def test_denial_names_the_kv_code(env, progs, tmp_path):
    r = run(
        env, tmp_path / "budget", need(progs, "layers"), "--keep-going", opts=("--budget", "200MiB")
    )
    assert r.returncode == 1, ok(r)
    lines = r.stderr.splitlines()
    shim = next(x for x in lines if "budget exceeded" in x)
    # the layers the run has shown so far (the shim's own stacks): the report's site
    assert re.search(
        r"; at kv_layer_buffer \(layers\.c:\d+\) via "
        r"tensor_create > pool_obtain > device_take, called from init_kv_cache",
        shim,
    ), shim
    named = [k for k, x in enumerate(lines) if x.startswith("cudatrace: denied ")]
    assert named, ok(r)
    line = lines[named[0]]
    assert re.search(
        r"denied 16\.0 MiB \(cuMemAlloc_v2\) at kv_layer_buffer \(layers\.c:\d+\) "
        r"via tensor_create > pool_obtain > device_take; budget 200\.0 MiB",
        line,
    )
    # promptly: while the program still runs (it waits 2 s after the failure)
    assert named[0] < lines.index("layers: still serving after the denial"), ok(r)
    assert re.search(r"denied by the budget: 1 \(1 at kv_layer_buffer", r.stderr)
    doc = report(env, r.out)
    assert doc["denied"][0]["label"].startswith("kv_layer_buffer (")
    saved = [json.loads(x) for x in (r.out / "denials.jsonl").read_text().splitlines()]
    assert saved[0]["label"].startswith("kv_layer_buffer (") and saved[0]["count"] == 1


# ---- C++ ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpp(env, progs, tmp_path_factory):
    r = run(env, tmp_path_factory.mktemp("cpp") / "t", need(progs, "layers_cpp"))
    assert r.returncode == 0, ok(r)
    return r


def test_cpp_sites_demangled_and_short(env, cpp):
    doc = report(env, cpp.out)
    labels = {s["label"].rsplit(" (", 1)[0]: (s["bytes"], s["count"]) for s in doc["sites"]}
    assert labels == {
        "eng::v1::CacheBuffer::CacheBuffer": (28 * 16 * MiB, 28),
        "eng::v1::GPUModelRunner::load_weights": (WEIGHTS, 21),
        "(anon)::step_workspace": (3 * 8 * MiB, 3),
        "(anon)::build_table": (3 * MiB, 1),
    }, labels
    kv = doc["sites"][0]
    assert re.match(r"eng::v1::CacheBuffer::CacheBuffer \(layers_cpp\.cpp:\d+\)$", kv["label"])
    assert doc["attribution"]["layers"] == ["eng::Tensor<...>::Tensor"]
    text = cli(env, "report", cpp.out).stdout
    assert (
        "via eng::Tensor<...>::Tensor > eng::Backend::acquire<...> > "
        "eng::dev::(anon)::obtain_on_device > cuMemAlloc_v2"
    ) in text
    assert "_Z" not in text and "std::" not in text
    summary = cpp.stderr
    assert re.search(
        r"28 x  eng::v1::CacheBuffer::CacheBuffer \(layers_cpp\.cpp:\d+\) via "
        r"eng::Tensor<\.\.\.>::Tensor",
        summary,
    ), summary


def test_cpp_full_names(env, cpp):
    doc = report(env, cpp.out, "--full-names")
    kv = doc["sites"][0]
    assert kv["label"].startswith("eng::v1::CacheBuffer::CacheBuffer(unsigned long) ("), kv["label"]
    assert doc["attribution"]["full_names"] is True
    assert any(
        "eng::Tensor<float>::Tensor(unsigned long," in x for x in doc["attribution"]["layers"]
    )
    text = cli(env, "report", cpp.out, "--full-names").stdout
    assert "eng::dev::(anonymous namespace)::obtain_on_device(eng::Device, unsigned long)" in text


def test_cpp_denial_demangled(env, progs, tmp_path):
    r = run(env, tmp_path / "budget", need(progs, "layers_cpp"), opts=("--budget", "200MiB"))
    assert r.returncode == 1, ok(r)
    shim = next(x for x in r.stderr.splitlines() if "budget exceeded" in x)
    # the shim's own rule (native/shim/deny.c): the eng:: allocator's namespaces end at the
    # per-layer buffer of eng::v1
    assert re.search(r"at eng::v1::CacheBuffer::CacheBuffer \(layers_cpp\.cpp:\d+\)", shim), shim
    assert (
        "via eng::Tensor<...>::Tensor > eng::Backend::acquire<...> > "
        "eng::dev::(anon)::obtain_on_device, called from "
        "eng::v1::GPUModelRunner::initialize_kv_cache <- main;"
    ) in shim
    assert "_Z" not in shim
    line = next(x for x in r.stderr.splitlines() if x.startswith("cudatrace: denied "))
    assert " at eng::v1::CacheBuffer::CacheBuffer (layers_cpp.cpp:" in line


def test_status_names_the_last_denied_code(env, progs, tmp_path):
    """While the member still runs (it waits 2 s after the denial), `status` says which code
    the budget refused."""
    import time

    out = tmp_path / "status"
    argv = [sys.executable, "-m", "cudatrace", "run", "-o", str(out), "--budget", "200MiB", "--"]
    p = children.popen(
        argv + [str(need(progs, "layers")), "--keep-going"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (out / "denials.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (out / "denials.jsonl").exists()
        pid = json.loads((out / "denials.jsonl").read_text().splitlines()[0])["pid"]
        # both at once: the member lives 2 s after its denial, on a loaded machine too
        q = [
            children.popen(
                [sys.executable, "-m", "cudatrace", "status", *a],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for a in (["--json"], [])
        ]
        st, text = json.loads(q[0].communicate(timeout=60)[0]), q[1].communicate(timeout=60)[0]
    finally:
        p.communicate(timeout=60)
    member = next(m for s in st["ledgers"] for m in s["members"] if m["pid"] == pid)
    assert member["last_denial"]["label"].startswith("kv_layer_buffer (")
    assert member["last_denial"]["via"] == ["device_take", "pool_obtain", "tensor_create"]
    assert re.search(
        r"last denied: 16\.0 MiB at kv_layer_buffer \(layers\.c:\d+\) via tensor_create", text
    ), text
