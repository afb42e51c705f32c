"""The floors of the Python package, checked on its import graph (docs/ARCHITECTURE.md).

Every import in cudatrace/ (at module level and inside functions) is read with `ast` and
resolved to the module it loads. The test fails on any import that loads nothing of the package
(a stale path), on any cycle (typing-only imports included), on a module over MAX_LINES, and
on any import that breaks the rules:

    errors (the ground)                            nothing of cudatrace
    leaves (units, procfs, nvml, native, progress)  errors only
    symbols/                                       errors only
    record/                                        never analyze/, present/ (symbols/: the
                                                   launcher's hints for the shim, in functions)
    analyze/                                       never record/, present/; inside, stages
                                                   in order (read/, replay/, sites/,
                                                   documents/), each importing only those
                                                   before it
    present/                                       never record/, commands/, nor click
    deploy/                                        never analyze/, symbols/, sweep/, commands/
    commands/                                      anything but the command line
    and nothing imports the command line but __main__, nor commands/ but the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cudatrace

PKG = Path(cudatrace.__file__).resolve().parent
LEAVES = {
    "units",
    "procfs",
    "cgroups",
    "nvml",
    "native",
    "progress",
    "closing",
    "simdriver",
    "tracedir",
    "outputs",
    "settings",
    "choices",
    "native_types",
    "record_types",
    "frameworks",
    "fence_record",
}
MAX_LINES = 700
# modules over MAX_LINES while another stream still edits them, each held to the old cap until
# it is split along its sections (the list only shrinks: a module under the cap leaves it)
LONG_MODULES: dict[str, int] = {}

# floor -> floors it must never import
UPPER = {"record", "analyze", "present", "symbols", "cli", "commands", "sweep", "demo", "deploy"}
FORBIDDEN = {
    "errors": {"leaf", "root"} | UPPER,
    "leaf": UPPER,
    "symbols": {
        "leaf",
        "root",
        "record",
        "analyze",
        "present",
        "cli",
        "commands",
        "sweep",
        "demo",
        "deploy",
    },
    # symbols/ inside record/hints.py only (the launcher's hints for the shim, in functions)
    "record": {"analyze", "present", "cli", "commands", "sweep", "demo", "deploy"},
    "analyze": {"record", "present", "cli", "commands", "sweep", "demo", "deploy"},
    "present": {"record", "cli", "commands", "sweep", "demo", "deploy"},
    "commands": {"cli"},
    "sweep": {"present", "cli", "commands", "demo", "deploy"},
    # the demo drives the command line as a user would (subprocesses): leaves only
    "demo": {"record", "analyze", "present", "symbols", "cli", "commands", "sweep", "deploy"},
    # containers and Kubernetes: above record/ and present/, below the command line
    "deploy": {"analyze", "symbols", "cli", "commands", "sweep", "demo", "api", "pytest_plugin"},
    "cli": set(),
    "__main__": set(),
    # the in-process API reads the shim (native) and attributes through analyze/
    "api": {"record", "present", "cli", "commands", "sweep", "demo", "pytest_plugin", "deploy"},
    "pytest_plugin": {"record", "present", "cli", "commands", "sweep", "demo", "deploy"},
    "root": {"leaf"} | UPPER,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# cudatrace/_native holds what the build writes (the cffi view: native.py), not source
MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py")) if "_native" not in p.parts}


def floor(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1:
        return "root"
    top = parts[1]
    if top in LEAVES:
        return "leaf"
    if top in ("errors", "record", "analyze", "present", "symbols", "cli", "commands"):
        return top
    if top in ("sweep", "demo", "__main__", "deploy"):
        return top
    if top in ("api", "pytest_plugin"):
        return top
    return "root"


def imports_of(mod: str) -> list[tuple[int, str]]:
    """(line, module loaded) for every import of the package in mod."""
    path = MODULES[mod]
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [
                (node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "cudatrace"
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "cudatrace":
                continue
            for a in node.names:  # `from pkg import module` loads the module
                sub = f"{target}.{a.name}"
                out.append((node.lineno, sub if sub in MODULES else target))
    return out


GRAPH = {mod: imports_of(mod) for mod in MODULES}


def test_every_import_loads_a_module_of_the_package():
    broken = [
        f"{MODULES[m].relative_to(PKG.parent)}:{line}: {t}"
        for m, edges in GRAPH.items()
        for line, t in edges
        if t not in MODULES
    ]
    assert not broken, "imports of nothing:\n" + "\n".join(broken)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def breaches(graph: dict[str, list[tuple[int, str]]]) -> list[str]:
    """'module:line: floor imports target (floor)' for each import against the floors."""
    bad = []
    for m, edges in graph.items():
        f = floor(m)
        for line, t in edges:
            tf = floor(t)
            if tf == f and f != "root":
                continue
            if (
                tf in FORBIDDEN.get(f, set())
                or (tf == "cli" and f != "__main__")
                or (tf == "commands" and f != "cli")
            ):
                bad.append(f"{m}:{line}: {f} imports {t} ({tf})")
    return bad


def test_no_cycle():
    """No circle anywhere in the package, whatever the import: at module level, inside a
    function, or under `if TYPE_CHECKING:` (a circle for the type checker is one for a reader
    too: two modules that each need the other to be understood)."""
    edges = {m: {t for _, t in GRAPH[m] if t in MODULES and t != m} for m in MODULES}
    found = cycles(edges)
    assert not found, f"import cycles: {found}"


# analyze/ is a pipeline: each stage a package that imports only the stages before it
STAGES = ("read", "replay", "sites", "documents")


def stage_breaches(graph: dict[str, list[tuple[int, str]]]) -> list[str]:
    """'module:line: stage imports target (a later stage)' for each import of analyze/ against
    the stages' order; 'module: in no stage' for a module of analyze/ outside them."""
    bad = []

    def stage(mod: str) -> int | None:
        parts = mod.split(".")
        if parts[:2] != ["cudatrace", "analyze"] or len(parts) < 3:
            return None
        return STAGES.index(parts[2]) if parts[2] in STAGES else -1

    for m, edges in graph.items():
        s = stage(m)
        if s is None:
            continue
        if s < 0:
            bad.append(f"{m}: in no stage of analyze/ ({', '.join(STAGES)})")
            continue
        for line, t in edges:
            ts = stage(t)
            if ts is not None and ts > s:
                bad.append(f"{m}:{line}: {STAGES[s]} imports {t} (a later stage)")
    return bad


def test_analyze_stages_in_order():
    bad = stage_breaches(GRAPH)
    assert not bad, "analyze/'s stages out of order:\n" + "\n".join(bad)


def test_the_stage_check_catches_breaches():
    fake = {
        "cudatrace.analyze.read.trace": [(1, "cudatrace.analyze.replay.model")],
        "cudatrace.analyze.sites.stacks": [
            (2, "cudatrace.analyze.read.tags"),
            (3, "cudatrace.units"),
        ],
        "cudatrace.analyze.replay.model": [(4, "cudatrace.analyze.documents.analysis")],
        "cudatrace.analyze.documents.report": [(5, "cudatrace.analyze.sites.group")],
        "cudatrace.analyze.loose": [(6, "cudatrace.analyze.read.trace")],
        "cudatrace.analyze": [(7, "cudatrace.analyze.documents.analysis")],
    }
    assert stage_breaches(fake) == [
        "cudatrace.analyze.read.trace:1: read imports cudatrace.analyze.replay.model (a later stage)",
        "cudatrace.analyze.replay.model:4: replay imports cudatrace.analyze.documents.analysis "
        "(a later stage)",
        "cudatrace.analyze.loose: in no stage of analyze/ (read, replay, sites, documents)",
    ]


def test_floors():
    bad = breaches(GRAPH)
    assert not bad, "imports that break the floors:\n" + "\n".join(bad)


def test_the_checks_catch_breaches():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    fake = {
        "cudatrace.record.launcher": [
            (3, "cudatrace.analyze.replay.model"),
            (4, "cudatrace.units"),
        ],
        "cudatrace.units": [(5, "cudatrace.record.budget")],
        "cudatrace.symbols": [(6, "cudatrace.native")],
        "cudatrace.present.report": [
            (7, "cudatrace.record.ledger"),
            (8, "cudatrace.cli"),
            (9, "cudatrace.analyze.sites.stacks"),
        ],
        "cudatrace.analyze.replay.model": [
            (10, "cudatrace.present.text"),
            (11, "cudatrace.symbols"),
        ],
        "cudatrace.__main__": [(12, "cudatrace.cli")],
        "cudatrace.errors": [(13, "cudatrace.units")],
        "cudatrace.sweep": [(14, "cudatrace.commands.options"), (15, "cudatrace.errors")],
        "cudatrace.cli": [(16, "cudatrace.commands.run"), (17, "cudatrace.errors")],
        "cudatrace.present.watch": [(18, "cudatrace.commands.report")],
    }
    assert [b.split(":")[1] for b in breaches(fake)] == [
        "3",
        "5",
        "6",
        "7",
        "8",
        "10",
        "13",
        "14",
        "18",
    ]


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_size(mod):
    n = len(MODULES[mod].read_text().splitlines())
    cap = LONG_MODULES.get(mod, MAX_LINES)
    assert n <= cap, f"{mod}: {n} lines (at most {cap}: split it by job)"
    if mod in LONG_MODULES:
        assert n > MAX_LINES, f"{mod}: {n} lines, no longer over {MAX_LINES}: off LONG_MODULES"


def test_the_long_modules_exist():
    assert set(LONG_MODULES) <= set(MODULES)


def test_present_never_imports_click():
    """present/ renders: it takes values and returns text; options, exit statuses and the
    terminal's prompts belong to commands/."""
    bad = []
    for mod, path in MODULES.items():
        if floor(mod) != "present":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            bad += [f"{mod}:{node.lineno}" for n in names if n.split(".")[0] == "click"]
    assert not bad, "present/ imports click: " + ", ".join(bad)


def test_every_command_has_its_module():
    """cli.py lists the commands; each is the function of that name in commands/NAME.py."""
    import click

    from cudatrace import cli

    for name, (module, _) in cli.COMMANDS.items():
        assert f"cudatrace.commands.{module}" in MODULES, name
        cmd = cli.main.get_command(None, name)
        assert isinstance(cmd, click.Command) and cmd.name == name, name
    # the list, its two --help sections and the one place errors are said
    assert len(MODULES["cudatrace.cli"].read_text().splitlines()) <= 160


def test_every_error_derives_from_the_one_base():
    """One error voice: every exception class of the package derives from CudatraceError."""
    import importlib

    from cudatrace.errors import CudatraceError

    loose = []
    for mod, path in MODULES.items():
        for node in ast.parse(path.read_text(), str(path)).body:
            if not isinstance(node, ast.ClassDef):
                continue
            if not any(
                (b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")).endswith(
                    ("Error", "Exception")
                )
                for b in node.bases
            ):
                continue
            cls = getattr(importlib.import_module(mod), node.name)
            if not issubclass(cls, CudatraceError):
                loose.append(f"{mod}.{node.name}")
    assert not loose, "exceptions outside the one base: " + ", ".join(loose)


def test_tools_and_tests_import_modules_that_exist():
    """A move between floors leaves no stale `cudatrace.x` import in tools/ or tests/ (a
    benchmark broke that way once)."""
    import importlib.util
    import re

    pat = re.compile(r"^\s*(?:from|import)\s+(cudatrace(?:\.\w+)*)", re.M)
    missing = []
    for root in (PKG.parent / "tools", PKG.parent / "tests"):
        for f in sorted(root.rglob("*.py")):
            for name in set(pat.findall(f.read_text(errors="replace"))):
                if importlib.util.find_spec(name) is None:
                    missing.append(f"{f.relative_to(PKG.parent)}: {name}")
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_one_error_voice():
    """Errors are raised, never printed and exited on: no sys.exit in the package (the command
    line turns a CudatraceError into its message and status, once), and no message carries the
    "cudatrace: " prefix that the command line puts before it."""
    bad = []
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "exit"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "sys"
            ):
                bad.append(f"{mod}:{node.lineno}: sys.exit")
            if (
                isinstance(node, ast.Raise)
                and isinstance(node.exc, ast.Call)
                and node.exc.args
                # pytest says its own errors (the plugin's): the prefix names the plugin there
                and not (
                    isinstance(node.exc.func, ast.Attribute) and node.exc.func.attr == "UsageError"
                )
            ):
                first = node.exc.args[0]
                parts = first.values if isinstance(first, ast.JoinedStr) else [first]
                head = parts[0] if parts else None
                if (
                    isinstance(head, ast.Constant)
                    and isinstance(head.value, str)
                    and head.value.startswith("cudatrace:")
                ):
                    bad.append(f"{mod}:{node.lineno}: a message starting {head.value[:20]!r}")
    assert not bad, "\n".join(bad)


# a name with a leading underscore is its module's: no other module reads it


def private_reads(mod: str, text: str | None = None) -> list[str]:
    """`from X import _name` and `X._name` of a module X of the package, in mod (its source, or
    `text` in its place)."""
    tree = ast.parse(MODULES[mod].read_text() if text is None else text)
    aliases = {}  # a name bound to a module of the package
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom) and (node.level or node.module == "cudatrace"):
            base = mod.split(".") if MODULES[mod].name == "__init__.py" else mod.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                if f"{target}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
                elif a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{mod}:{node.lineno}: from {target} import {a.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and aliases.get(node.value.id, "").startswith("cudatrace")
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            out.append(f"{mod}:{node.lineno}: {node.value.id}.{node.attr}")
    return out


def test_no_private_names_read_across_modules():
    bad = [b for m in sorted(MODULES) for b in private_reads(m)]
    assert not bad, "read a module's private name (make it public or move the code):\n" + "\n".join(
        bad
    )


def test_private_reads_are_found():
    planted = "from .data import _moments\nfrom .. import text\nx = text._cell(1)\n"
    assert private_reads("cudatrace.present.html.page", planted) == [
        "cudatrace.present.html.page:1: from cudatrace.present.html.data import _moments",
        "cudatrace.present.html.page:3: text._cell",
    ]
