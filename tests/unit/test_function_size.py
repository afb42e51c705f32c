"""Short functions in the package: none over HARD lines, and none over LONG lines but the
listed exceptions, each held to its count of today (the list only shrinks). The complexity and
statement counts are ruff's (pyproject [tool.ruff.lint]: C901, PLR0912, PLR0915)."""

from __future__ import annotations

import ast
from pathlib import Path

import cudatrace

PKG = Path(cudatrace.__file__).resolve().parent
HARD = 150
LONG = 100

# "module path:qualified name" -> its lines today. Split one and remove its line; never add.
EXCEPTIONS = {
    "symbols/lines.py:_decode_rows": 142,  # the line program's hot loop: calls cost here
}
MAX_EXCEPTIONS = 8


def function_lengths(source: str, name: str = "<src>") -> dict[str, int]:
    """qualified name -> lines, for every function and method of a module (nested included)."""
    out: dict[str, int] = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = prefix + child.name
                out[q] = child.end_lineno - child.lineno + 1
                visit(child, q + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, name), "")
    return out


def breaches(lengths: dict[str, int], exceptions: dict[str, int]) -> list[str]:
    """What breaks the rules: a function over HARD, one over LONG not listed, a listed one
    grown past its count, a listed one now short (take it off the list) or gone."""
    bad = []
    for q, n in sorted(lengths.items()):
        if n > HARD:
            bad.append(f"{q}: {n} lines (at most {HARD}, anywhere)")
        elif n > LONG and q not in exceptions:
            bad.append(f"{q}: {n} lines (at most {LONG}: split it into named sections)")
        elif q in exceptions and n > exceptions[q]:
            bad.append(f"{q}: {n} lines, grown from {exceptions[q]} (split it)")
    for q in exceptions:
        if lengths.get(q, 0) <= LONG:
            bad.append(f"{q}: no longer over {LONG} lines: remove it from EXCEPTIONS")
    return bad


def package_lengths() -> dict[str, int]:
    out = {}
    for path in sorted(p for p in PKG.rglob("*.py") if "_native" not in p.parts):
        rel = path.relative_to(PKG).as_posix()
        for q, n in function_lengths(path.read_text(), rel).items():
            out[f"{rel}:{q}"] = n
    return out


def test_functions_are_short():
    bad = breaches(package_lengths(), EXCEPTIONS)
    assert not bad, "functions too long:\n" + "\n".join(bad)


def test_the_exceptions_only_shrink():
    assert len(EXCEPTIONS) <= MAX_EXCEPTIONS
    assert all(LONG < n <= HARD for n in EXCEPTIONS.values())


def test_the_check_catches_long_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(160))
    src = f"def huge():\n{body}\n\nclass C:\n    def m(self):\n" + "\n".join(
        f"        y{i} = {i}" for i in range(120)
    )
    lengths = function_lengths(src)
    assert lengths == {"huge": 161, "C.m": 121}
    assert [b.split(":")[0] for b in breaches(lengths, {})] == ["C.m", "huge"]
    assert breaches(lengths, {"C.m": 121}) == ["huge: 161 lines (at most 150, anywhere)"]
    assert "grown" in breaches({"C.m": 130}, {"C.m": 121})[0]
    assert "remove it" in breaches({"C.m": 90}, {"C.m": 121})[0]
