"""The floors of native/ hold: the #include graph of native/ has no cycle, and each floor
includes only what it may:

    native/include/   the shared headers: include nothing of the other floors
    native/shim/      runs in the target: its own headers and native/include
    native/reader/    runs in the Python process: its own headers and native/include (never the shim's)
    native/common/    linked into both libraries: its own headers and native/include
    sim/              the simulated driver: native/include and its own headers

The reader's APIs (scan.h, replay.h) live in native/include for cffi, but only native/reader
may include them: the shim and the ledger never link the reader.

Also: every module of the shim (a .c other than shim.c) has its own header and includes it
first; the modules of the shim (a .c with its .h, one node) use each other without a cycle,
read from the compiled objects (what each defines and what it needs: calls and data alike,
the header's inline functions included); and no file of the shim calls by name a function the
shim interposes (dlsym, dlclose, _exit, the CUDA wrappers...): that would reach the shim's own
export, not the real one (the shim's lookups go through ct_real_dlsym(), ct_real_dlclose()).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
while not (REPO / "native" / "include").is_dir() and REPO != REPO.parent:
    REPO = REPO.parent
NATIVE = REPO / "native"
FLOORS = {
    "include": {"include"},
    "shim": {"shim", "include"},
    "reader": {"reader", "include"},
    "common": {"common", "include"},
}
READER_HEADERS = {"scan.h", "replay.h"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".c", ".h", ".def"))


def _resolve(src: Path, name: str) -> Path | None:
    """A quoted include: the including file's folder first, then native/include (the -I of
    native/Makefile and of the simulator's build rule)."""
    for d in (src.parent, NATIVE / "include"):
        if (d / name).is_file():
            return (d / name).resolve()
    return None


def include_graph(files: list[Path]) -> dict[Path, list[Path]]:
    graph = {}
    for f in files:
        deps = []
        for name in INCLUDE_RE.findall(f.read_text()):
            target = _resolve(f, name)
            assert target is not None, (
                f"{f} includes {name!r}, which is not in its folder or native/include"
            )
            deps.append(target)
        graph[f.resolve()] = deps
    return graph


def find_cycle(graph: dict) -> list | None:
    """A cycle of the graph as a list of nodes (first == last), or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in graph.get(n, ()):
            if m == n:
                return [n, n]
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if not state.get(m):
                c = visit(m)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for n in list(graph):
        if not state.get(n):
            c = visit(n)
            if c:
                return c
    return None


def test_find_cycle_finds_one():
    a, b, c = Path("/a.h"), Path("/b.h"), Path("/c.h")
    assert find_cycle({a: [b], b: [c], c: []}) is None
    assert find_cycle({a: [b], b: [c], c: [a]}) == [a, b, c, a]


def test_no_include_cycle():
    files = _sources(NATIVE) + _sources(REPO / "sim")
    graph = include_graph(files)
    cycle = find_cycle(graph)
    assert cycle is None, "include cycle: " + " -> ".join(str(p.relative_to(REPO)) for p in cycle)


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_floor_includes_only_what_it_may(floor):
    allowed = {(NATIVE / d).resolve() for d in FLOORS[floor]}
    bad = []
    for f, deps in include_graph(_sources(NATIVE / floor)).items():
        for d in deps:
            if d.parent not in allowed or (
                d.name in READER_HEADERS and floor != "reader" and f.name not in READER_HEADERS
            ):
                bad.append(f"{f.relative_to(REPO)} includes {d.relative_to(REPO)}")
    assert not bad, "\n".join(bad)


def test_sim_includes_only_native_include():
    allowed = {(NATIVE / "include").resolve(), (REPO / "sim").resolve()}
    for f, deps in include_graph(_sources(REPO / "sim")).items():
        for d in deps:
            assert d.parent in allowed, f"{f} includes {d}"


def test_the_ledger_reads_proc_through_procstat():
    """What the ledger reads of /proc is procstat.c's: no file of the ledger names a /proc path."""
    files = sorted((NATIVE / "common").glob("ledger*.[ch]"))
    assert len(files) >= 5, files  # ledger.c, _open.c, _parts.c, _group.c, _int.h
    for f in files:
        code = re.sub(r"/\*.*?\*/", "", f.read_text(), flags=re.S)
        assert "/proc" not in code, f.name
    assert "/proc/" in (NATIVE / "common" / "procstat.c").read_text()
    assert INCLUDE_RE.findall((NATIVE / "common" / "procstat.c").read_text())[0] == "procstat.h"


def test_each_shim_module_has_its_header_first():
    for c in sorted((NATIVE / "shim").glob("*.c")):
        if c.name == "shim.c":  # the wrappers and the lifecycle: nothing calls into it
            continue
        h = c.with_suffix(".h")
        assert h.is_file(), f"{c.name} has no header {h.name}"
        first = INCLUDE_RE.search(c.read_text())
        assert first and first.group(1) == h.name, f"{c.name} must include {h.name} first"


# ---- the modules of the shim: a graph of what each object file defines and needs ------------
SHIM_FLAGS = [
    "-std=gnu11",
    "-fPIC",
    "-fvisibility=hidden",
    "-D_GNU_SOURCE",
    "-pthread",
    "-O0",
    '-DCT_SHIM_VERSION="layout"',  # native/Makefile stamps the real one
]


def object_symbols(shim_dir: Path, include_dir: Path, out: Path) -> dict[str, tuple[set, set]]:
    """{module: (defined, needed)} from `nm` of each .c of shim_dir compiled alone (module =
    the file's stem: foo.c with foo.h). Calls, data and the header's inline functions alike."""
    cc = os.environ.get("CC", "cc")
    assert shutil.which(cc) and shutil.which("nm"), "the layout test needs a C compiler and nm"
    syms = {}
    for c in sorted(shim_dir.glob("*.c")):
        o = out / (c.stem + ".o")
        cmd = [cc, *SHIM_FLAGS, f"-I{include_dir}", f"-I{shim_dir}", "-c", str(c), "-o", str(o)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{c.name} does not compile:\n{r.stderr}"
        nm = subprocess.run(["nm", str(o)], capture_output=True, text=True, check=True).stdout
        defined, needed = set(), set()
        for line in nm.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                needed.add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRVWGS":
                defined.add(parts[2])
        syms[c.stem] = (defined, needed)
    return syms


def module_graph(syms: dict[str, tuple[set, set]]) -> dict[str, dict[str, set]]:
    """{module: {module it uses: the symbols it uses there}}"""
    owner = {s: m for m, (defined, _) in syms.items() for s in defined}
    graph: dict[str, dict[str, set]] = {m: {} for m in syms}
    for m, (_, needed) in syms.items():
        for s in needed:
            o = owner.get(s)
            if o and o != m:
                graph[m].setdefault(o, set()).add(s)
    return graph


def _cycle_text(graph: dict, cycle: list) -> str:
    steps = [f"{a} -> {b} ({', '.join(sorted(graph[a][b])[:3])})" for a, b in zip(cycle, cycle[1:])]
    return "module cycle in the shim: " + "; ".join(steps)


@pytest.fixture(scope="module")
def shim_objects(tmp_path_factory):
    return object_symbols(NATIVE / "shim", NATIVE / "include", tmp_path_factory.mktemp("objs"))


def test_no_module_cycle_in_the_shim(shim_objects):
    graph = module_graph(shim_objects)
    assert set(graph) >= {"shim", "util", "writer", "modules", "pyframes", "unwind"}, graph
    cycle = find_cycle({m: sorted(deps) for m, deps in graph.items()})
    assert cycle is None, _cycle_text(graph, cycle)
    assert not graph["util"], f"util uses other modules: {graph['util']}"
    # entry.c (the exported dlsym / cuGetProcAddress) hands out shim.c's wrappers: the top
    users = {
        top: sorted(m for m, deps in graph.items() if top in deps) for top in ("shim", "entry")
    }
    assert users == {"shim": ["entry"], "entry": []}, users


def test_a_planted_module_cycle_is_found(tmp_path):
    """The real tree with one upward call planted (util -> writer, writer -> util)."""
    shim = tmp_path / "shim"
    shutil.copytree(NATIVE / "shim", shim)
    with open(shim / "util.c", "a") as f:
        f.write('\n#include "writer.h"\nvoid ct_planted(void) { ct_writer_open_now(); }\n')
    objs = tmp_path / "o"
    objs.mkdir()
    graph = module_graph(object_symbols(shim, NATIVE / "include", objs))
    cycle = find_cycle({m: sorted(deps) for m, deps in graph.items()})
    assert cycle is not None and "util" in cycle and "writer" in cycle, cycle
    assert "ct_writer_open_now" in _cycle_text(graph, cycle)


def interposed_names() -> set[str]:
    """What the shim exports to the program: every CT_EXPORT definition and hooks.def's IDs."""
    names = set()
    for f in _sources(NATIVE / "shim"):
        text = re.sub(r"/\*.*?\*/", "", f.read_text(), flags=re.S)
        text = re.sub(r"^\s*#\s*define.*$", "", text.replace("\\\n", " "), flags=re.M)
        names |= set(re.findall(r"CT_EXPORT(?:\s+\w+)*?\s+\**\s*(\w+)\s*\(", text))
    hooks = (NATIVE / "include" / "hooks.def").read_text()
    names |= set(re.findall(r"^CT_(?:DRIVER|RUNTIME|NVML)\((\w+)", hooks, re.M))
    names.discard("ID")  # the wrapper macros' parameter
    return names


def internal_calls(text: str, names: set[str]) -> list[str]:
    """Lines of a C text that call one of names, other than the line defining it."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    call = re.compile(r"(?<![\w.>])(" + "|".join(map(re.escape, sorted(names))) + r")\s*\(")
    return [ln.strip() for ln in text.splitlines() if call.search(ln) and "CT_EXPORT" not in ln]


def test_shim_never_calls_what_it_interposes():
    names = interposed_names()
    assert {"dlsym", "dlclose", "_exit", "cuGetProcAddress_v2", "cuMemAlloc_v2"} <= names, names
    bad = [
        f"{f.name}: {line}"
        for f in _sources(NATIVE / "shim")
        for line in internal_calls(f.read_text(), names)
    ]
    assert not bad, "the shim calls its own exports (use the real ones):\n" + "\n".join(bad)
    planted = "static void f(void *h) { dlclose(h); } /* dlsym( in a comment */"
    assert internal_calls(planted, names) == ["static void f(void *h) { dlclose(h); }"]


# what a dl_iterate_phdr callback of the shim must never call: the loader holds its write lock
# around the callback, and each of these may take the loader's other lock (dlopen, dlsym), our
# own locks (the writer: it may open the trace, whose preamble calls dlopen) or call into the
# driver; a thread inside dlopen takes those locks in the other order (the budget_hammer hang)
CALLBACK_FORBIDDEN = (
    "dlopen",
    "dlclose",
    "dlsym",
    "ct_real_dlsym",
    "ct_driver_sym",
    "ct_nvml_sym",
    "ct_sym_in_loaded",
    "ct_rec_write",
    "ct_rec_begin",
    "ct_writer_open_now",
    "pthread_mutex_lock",
    "malloc",
)


def _function_body(text: str, name: str) -> str | None:
    m = re.search(r"^[\w \*]*\b" + re.escape(name) + r"\s*\([^;{]*\)\s*\{", text, re.M)
    if not m:
        return None
    depth, i = 0, m.end() - 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i : j + 1]
    return None


def test_dl_iterate_phdr_callbacks_take_no_lock():
    texts = {
        f: re.sub(r"/\*.*?\*/", "", f.read_text(), flags=re.S) for f in _sources(NATIVE / "shim")
    }
    callbacks = set()
    for text in texts.values():
        callbacks |= set(re.findall(r"dl_iterate_phdr\s*\(\s*(\w+)", text))
    assert len(callbacks) >= 3, callbacks  # the module walk, the unwinder's, the loaded lookup
    for cb in sorted(callbacks):
        bodies = [b for t in texts.values() if (b := _function_body(t, cb))]
        assert bodies, f"callback {cb} not found"
        for name in CALLBACK_FORBIDDEN:
            assert not re.search(r"(?<![\w.>])" + name + r"\s*\(", bodies[0]), (
                f"dl_iterate_phdr callback {cb} calls {name}"
            )


# ---- the environment: declared once (native/include/settings.def), read in one place ---------
SETTING_RE = re.compile(r'^CT_SETTING\((\w+),\s*"(\w+)",\s*(CT_SHIM|CT_COMMON|CT_PYTHON),', re.M)
ENV_NAME_RE = re.compile(r"\bCUDATRACE_[A-Z0-9_]*[A-Z0-9]\b")


def declared_settings() -> dict[str, tuple[str, str]]:
    """{variable: (ID, SCOPE)} of settings.def"""
    text = (NATIVE / "include" / "settings.def").read_text()
    return {name: (ident, scope) for ident, name, scope in SETTING_RE.findall(text)}


def env_names_used(files) -> dict[str, set[str]]:
    """{CUDATRACE_* name: files naming it} outside comments' header guards (..._H)"""
    used: dict[str, set[str]] = {}
    for f in files:
        for name in ENV_NAME_RE.findall(f.read_text()):
            if not name.endswith("_H"):
                used.setdefault(name, set()).add(f.name)
    return used


def test_every_setting_is_declared_once():
    decl = declared_settings()
    assert {"CUDATRACE_DIR", "CUDATRACE_LEDGER", "CUDATRACE_LEDGER_DIR"} <= set(decl), decl
    text = (NATIVE / "include" / "settings.def").read_text()
    names = [n for _, n, _ in SETTING_RE.findall(text)]
    assert len(names) == len(set(names)), "a variable declared twice"
    product = (
        [p for p in (REPO / "cudatrace").rglob("*.py")] + _sources(NATIVE) + _sources(REPO / "sim")
    )
    undeclared = {n: sorted(fs) for n, fs in env_names_used(product).items() if n not in decl}
    assert not undeclared, f"CUDATRACE_* variables not in settings.def: {undeclared}"


SETTINGS_CALLS = {"name", "value", "default", "default_text", "default_int", "number", "setting"}


def settings_ids_asked(path: Path) -> set[str]:
    """The IDs a module asks cudatrace.settings for: settings.name("DIR"), ...,
    settings.environment(DIR=...)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "settings"
        ):
            continue
        if node.func.attr == "environment":
            out |= {k.arg for k in node.keywords if k.arg}
        elif node.func.attr in SETTINGS_CALLS and node.args:
            arg = node.args[0]
            assert isinstance(arg, ast.Constant), f"{path}: settings.{node.func.attr} of a variable"
            out.add(arg.value)
    return out


def test_python_asks_for_declared_settings_only():
    ids = {ident for ident, _ in declared_settings().values()}
    asked = {}
    for p in [*(REPO / "cudatrace").rglob("*.py"), *(REPO / "tests" / "support").rglob("*.py")]:
        for ident in settings_ids_asked(p):
            asked.setdefault(ident, []).append(p.name)
    assert {"DIR", "STACK_DEPTH", "NATIVE_DIR"} <= set(asked), asked
    undeclared = {i: fs for i, fs in asked.items() if i not in ids}
    assert not undeclared, f"settings IDs not declared in settings.def: {undeclared}"


def test_the_shim_reads_the_environment_in_util_c_only():
    bad = []
    for f in _sources(NATIVE / "shim"):
        text = re.sub(r"/\*.*?\*/", "", f.read_text(), flags=re.S)
        if f.name != "util.c" and re.search(r"\b(getenv|secure_getenv|environ)\b", text):
            bad.append(f.name)
    assert not bad, f"read the environment through ct_setting() (util.h): {bad}"
    shim_text = "\n".join(p.read_text() for p in _sources(NATIVE / "shim"))
    unused = [
        ident
        for ident, scope in declared_settings().values()
        if scope == "CT_SHIM" and f"CT_SET_{ident}" not in shim_text
    ]
    assert not unused, f"settings declared for the shim that it never reads: {unused}"


def test_the_settings_checks_catch_breaches(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('settings.value("NEW_KNOB")\nsettings.environment(DIR=1, OTHER=2)\n')
    assert settings_ids_asked(src) == {"NEW_KNOB", "DIR", "OTHER"}
    assert ENV_NAME_RE.findall('getenv("CUDATRACE_NEW_KNOB") CUDATRACE_UTIL_H') == [
        "CUDATRACE_NEW_KNOB",
        "CUDATRACE_UTIL_H",
    ]
    assert "CUDATRACE_NEW_KNOB" not in declared_settings()
