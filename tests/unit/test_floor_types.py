"""The floors take typed data: the --json documents as analyze/documents/report_types.py's
TypedDicts, the ledgers and the doctor's probes as record_types.py's, a sweep's runs as
sweep/records.py's. No function of a floor takes a `dict` (bare or subscripted: a TypedDict, a
record or a Mapping of declared types says what is read by key, where it is built) nor
anything typed `Any` (bare, or inside: `Mapping[str, Any]`, `list[Any]`).

Every floor but commands/ (click's keywords) and cli.py (click's signatures) holds to it, but:
- the pytest plugin, retyped next, exempt whole for now;
- analyze/ and symbols/, strict under mypy already, at most as many such parameters as today
  (the counts only go down);
- the values of untyped libraries (cffi's views, protobuf's descriptors and messages, built at
  run time, and grpcio's objects), named one by one in ALLOWED."""

from __future__ import annotations

import ast
from pathlib import Path

import cudatrace

PACKAGE = Path(cudatrace.__file__).resolve().parent

# not held to the rule: click's keywords and signatures
OUTSIDE = {"commands", "cli.py", "_native"}
# retyped next, on their own branches (issue 43): exempt whole until then
NEXT = {"pytest_plugin.py"}
# strict under mypy; their untyped parameters (cffi views, ELF and DWARF values, documents
# built as dicts) only go down
AT_MOST = {"analyze": 71, "symbols": 28}
# parameters that are an untyped library's values: "path function(parameter)"
ALLOWED = {
    "native.py __init__(f)",  # a cffi function
    "native.py __init__(lib)",  # a cffi library
    "api.py _row(r)",  # a cffi struct ct_live_row
    "record/ledger.py __init__(handle)",  # a cffi ct_ledger *
    "protodesc.py _scalar_or_message(fd)",  # protobuf descriptors
    "protodesc.py _map_field(msg)",
    "protodesc.py _message(fdp)",
    "protodesc.py _service(fdp)",
    "present/export/pprof.py __init__(table)",  # a Profile message's string_table
    "present/export/pprof.py __init__(p)",  # a Profile message
    # the DRA plugin's gRPC (deploy/dra_grpc.py): grpcio has no types, and its messages are
    # classes protodesc.py builds at run time from dra.proto and pluginregistration.proto
    "deploy/dra_grpc.py _refs(request)",  # a NodePrepare/UnprepareResourcesRequest
    "deploy/dra_grpc.py _prepare_response(cls)",  # the NodePrepareResourcesResponse class
    "deploy/dra_grpc.py _unprepare_response(cls)",  # the NodeUnprepareResourcesResponse class
    "deploy/dra_grpc.py _handler(grpc)",  # the grpc module, imported inside (the dra extra)
    "deploy/dra_grpc.py _handler(methods)",  # method -> (request class, response class, fn)
    "deploy/dra_grpc.py _serve(handlers)",  # grpc's GenericRpcHandlers
    "deploy/dra_grpc.py _call(request)",  # a request message
    "deploy/dra_grpc.py get_info(req)",  # an InfoRequest message
    "deploy/dra_grpc.py get_info(ctx)",  # grpc's ServicerContext
    "deploy/dra_grpc.py notify(req)",  # a RegistrationStatus message
    "deploy/dra_grpc.py notify(ctx)",  # grpc's ServicerContext
}


def untyped_parameters(source: str, name: str = "<text>") -> list[str]:
    """`name:line function(parameter: annotation)` of every parameter annotated with `dict`
    (bare or subscripted, anywhere in the annotation) or with `Any` (anywhere in it)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if p is None or p.annotation is None:
                continue
            text = ast.unparse(p.annotation)
            if isinstance(p.annotation, ast.Constant) and isinstance(p.annotation.value, str):
                text = p.annotation.value  # a quoted annotation
            names = {
                n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)
            }
            names |= {
                n.attr
                for n in ast.walk(ast.parse(text, mode="eval"))
                if isinstance(n, ast.Attribute)
            }
            if names & {"dict", "Dict", "Any"}:
                out.append(f"{name}:{node.lineno} {node.name}({p.arg}: {text})")
    return out


def _floor(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0]


def _found() -> dict[str, list[str]]:
    by_floor: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        floor = _floor(path)
        if floor in OUTSIDE:
            continue
        rel = str(path.relative_to(PACKAGE))
        for x in untyped_parameters(path.read_text(), rel):
            file, rest = x.split(":", 1)
            if f"{file} {rest.split(' ', 1)[1].split(':')[0]})" in ALLOWED:
                continue
            by_floor.setdefault(floor, []).append(x)
    return by_floor


def test_no_floor_takes_a_dict_or_any():
    found = _found()
    held = [x for f, xs in found.items() if f not in NEXT and f not in AT_MOST for x in xs]
    assert not held, "the floors take the documents' and records' types:\n" + "\n".join(held)


def test_the_strict_floors_untyped_parameters_only_go_down():
    found = _found()
    for floor, most in AT_MOST.items():
        got = found.get(floor, [])
        assert len(got) <= most, f"{floor}/: {len(got)} > {most}:\n" + "\n".join(got)


def test_every_exemption_names_something_there():
    floors = {_floor(p) for p in PACKAGE.rglob("*.py")}
    assert (NEXT | set(AT_MOST)) <= floors
    listed = {
        f"{path.relative_to(PACKAGE)} {x.split(' ', 1)[1].split(':')[0]})"
        for path in PACKAGE.rglob("*.py")
        for x in untyped_parameters(path.read_text())
    }
    assert ALLOWED <= listed, sorted(ALLOWED - listed)


def test_an_untyped_parameter_is_found():
    src = (
        "def f(r: dict, s: list[dict] | None, t: Mapping[str, Any], u: Report, v: Any,\n"
        "      w: 'dict[str, int]', x: typing.Any, y: Mapping[str, int], z: object) -> dict:\n"
        "    pass\n"
    )
    assert [x.split(" ", 1)[1] for x in untyped_parameters(src)] == [
        "f(r: dict)",
        "f(s: list[dict] | None)",
        "f(t: Mapping[str, Any])",
        "f(v: Any)",
        "f(w: dict[str, int])",
        "f(x: typing.Any)",
    ]
