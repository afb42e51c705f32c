"""The floors of native/ hold: the #include graph of native/ has no cycle, and each floor
includes only what it may:

    native/include/   the shared headers: include nothing of the other floors
    native/shim/      runs in the target: its own headers and native/include
    native/reader/    runs in the Python process: native/include only (never the shim's headers)
    native/common/    linked into both libraries: native/include only
    sim/              the simulated driver: native/include and its own headers

The reader's APIs (scan.h, replay.h) live in native/include for cffi, but only native/reader
may include them: the shim and the ledger never link the reader.

Also: every module of the shim (a .c other than shim.c) has its own header and includes it
first, and no file of the shim calls dlsym by name (that would reach the shim's own exported
dlsym interposer; the shim's lookups go through ct_real_dlsym()).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
while not (REPO / "native" / "include").is_dir() and REPO != REPO.parent:
    REPO = REPO.parent
NATIVE = REPO / "native"
FLOORS = {
    "include": {"include"},
    "shim": {"shim", "include"},
    "reader": {"include"},
    "common": {"include"},
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


def test_each_shim_module_has_its_header_first():
    for c in sorted((NATIVE / "shim").glob("*.c")):
        if c.name == "shim.c":  # the wrappers and the lifecycle: nothing calls into it
            continue
        h = c.with_suffix(".h")
        assert h.is_file(), f"{c.name} has no header {h.name}"
        first = INCLUDE_RE.search(c.read_text())
        assert first and first.group(1) == h.name, f"{c.name} must include {h.name} first"


def test_shim_never_calls_its_own_dlsym():
    call = re.compile(r"(?<![\w.>])dlsym\s*\(")
    for f in _sources(NATIVE / "shim"):
        text = re.sub(r"/\*.*?\*/", "", f.read_text(), flags=re.S)
        for line in text.splitlines():
            if call.search(line) and "CT_EXPORT" not in line:
                pytest.fail(f"{f.name} calls dlsym directly (use ct_real_dlsym()): {line.strip()}")


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
