"""present/ renders typed data: the --json documents as analyze/documents/report_types.py's TypedDicts, the
ledgers and the doctor's probes as record_types.py's; no function of present/ takes a bare
`dict` (nor a mapping of Any), so what it reads by key is declared where it is built."""

from __future__ import annotations

import ast
from pathlib import Path

import cudatrace

PRESENT = Path(cudatrace.__file__).resolve().parent / "present"


def untyped_parameters(source: str, name: str = "<text>") -> list[str]:
    """`function(parameter: annotation)` of every parameter annotated with `dict` (bare or
    subscripted, anywhere in the annotation) or with a Mapping whose values are Any."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if p is None or p.annotation is None:
                continue
            text = ast.unparse(p.annotation)
            names = {n.id for n in ast.walk(p.annotation) if isinstance(n, ast.Name)}
            if "dict" in names or ("Mapping" in text and "Any]" in text):
                out.append(f"{name}:{node.lineno} {node.name}({p.arg}: {text})")
    return out


def test_no_present_function_takes_a_dict():
    found = [
        x
        for path in sorted(PRESENT.rglob("*.py"))
        for x in untyped_parameters(path.read_text(), str(path.relative_to(PRESENT)))
    ]
    assert not found, "present/ takes the documents' and records' types:\n" + "\n".join(found)


def test_an_untyped_parameter_is_found():
    src = (
        "def f(r: dict, s: list[dict] | None, t: Mapping[str, Any], u: Report) -> dict:\n    pass\n"
    )
    assert [x.split(" ", 1)[1] for x in untyped_parameters(src)] == [
        "f(r: dict)",
        "f(s: list[dict] | None)",
        "f(t: Mapping[str, Any])",
    ]
