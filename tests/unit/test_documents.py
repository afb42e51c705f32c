"""cudatrace/analyze/documents/report_types.py, diff_types.py and sweep_types.py hold the
`--json` documents as TypedDicts: each class is held against its JSON Schema
(cudatrace/schemas/*.json) key by key and type by type, so that the types present/ and the
commands read and the schemas users validate against are one shape."""

from __future__ import annotations

import sys
import types
import typing
from typing import Any, Literal, TypedDict, Union

import pytest

from cudatrace import schemas
from cudatrace.analyze.documents import diff_types, report_types, sweep_types

TOP = {
    "cudatrace.report/1": report_types.Report,
    "cudatrace.diff/1": diff_types.Diff,
    "cudatrace.sweep/1": sweep_types.Sweep,
}
MODULES = (report_types, diff_types, sweep_types)
SCALARS = {"integer": int, "number": float, "string": str, "boolean": bool, "null": type(None)}


def _members(ann: Any) -> tuple[Any, ...]:
    if typing.get_origin(ann) in (Union, types.UnionType):
        return typing.get_args(ann)
    return (ann,)


def _is_typeddict(ann: Any) -> bool:
    return isinstance(ann, type) and typing.is_typeddict(ann)


def _hints(ann: Any) -> dict[str, Any]:
    """A TypedDict's keys' types, its names resolved in its own module."""
    return typing.get_type_hints(ann, vars(sys.modules[ann.__module__]))


class Checker:
    """Differences between a schema and an annotation, as 'path: what' lines."""

    def __init__(self, spec: dict):
        self.defs = spec.get("$defs", {})
        self.seen: set[tuple[int, int]] = set()

    def check(self, node: Any, ann: Any, path: str) -> list[str]:
        if node in ({}, True):
            return [] if ann is Any else [f"{path}: {ann} for a schema of anything (Any)"]
        if "$ref" in node:
            return self.check(self.defs[node["$ref"].split("/")[-1]], ann, path)
        if "const" in node or "enum" in node:
            want = {node["const"]} if "const" in node else set(node["enum"])
            got = typing.get_args(ann) if typing.get_origin(ann) is Literal else ()
            return [] if set(got) == want else [f"{path}: {ann}, the schema's {sorted(want)}"]
        variants = node.get("anyOf") or node.get("oneOf")
        if variants is None and isinstance(node.get("type"), list):
            variants = [dict(node, type=t) for t in node["type"]]
        if variants is not None:
            return self.union(variants, ann, path)
        return self.single(node, ann, path)

    def union(self, variants: list, ann: Any, path: str) -> list[str]:
        if ann is Any and any(v in ({}, True) for v in variants):
            return []
        members = list(_members(ann))
        out = []
        for v in variants:
            match = [m for m in members if not self.check(v, m, path)]
            if not match:
                out.append(f"{path}: no member of {ann} is the schema's {v}")
            else:
                members.remove(match[0])
        out += [f"{path}: {m} is not in the schema" for m in members]
        return out

    def single(self, node: dict, ann: Any, path: str) -> list[str]:
        t = node.get("type")
        if t in SCALARS:
            return [] if ann is SCALARS[t] else [f"{path}: {ann}, the schema's {t}"]
        if t == "array":
            if typing.get_origin(ann) is not list:
                return [f"{path}: {ann}, the schema's array"]
            return self.check(node.get("items", {}), typing.get_args(ann)[0], path + "[]")
        if "properties" in node:
            return self.typeddict(node, ann, path)
        if t == "object":
            if typing.get_origin(ann) is not dict or typing.get_args(ann)[0] is not str:
                return [f"{path}: {ann}, the schema's object"]
            return self.check(node.get("additionalProperties", {}), typing.get_args(ann)[1], path)
        return [f"{path}: a schema node this check does not know: {node}"]

    def typeddict(self, node: dict, ann: Any, path: str) -> list[str]:
        if not _is_typeddict(ann):
            return [f"{path}: {ann} is not a TypedDict"]
        key = (id(node), id(ann))
        if key in self.seen:  # a recursive definition (the caller tree's nodes)
            return []
        self.seen.add(key)
        props, required = node["properties"], set(node.get("required", ()))
        out = []
        if set(ann.__required_keys__) != required:
            out.append(
                f"{path}: {ann.__name__} requires {sorted(ann.__required_keys__)}, "
                f"the schema {sorted(required)}"
            )
        if set(ann.__annotations__) != set(props):
            out.append(
                f"{path}: {ann.__name__} has {sorted(set(ann.__annotations__) ^ set(props))}"
                " that the schema has not, or the reverse"
            )
        hints = _hints(ann)
        for k in sorted(set(props) & set(hints)):
            out += self.check(props[k], hints[k], f"{path}.{k}")
        return out


@pytest.mark.parametrize("name", sorted(TOP))
def test_each_document_type_is_its_schema(name):
    spec = schemas.load(name)
    bad = Checker(spec).check(spec, TOP[name], name)
    assert not bad, "\n".join(bad)


def test_every_class_is_part_of_a_document():
    """No class left over from a key the schemas dropped."""
    reached: set[str] = set()

    def walk(ann: Any) -> None:
        for m in _members(ann):
            if _is_typeddict(m):
                if m.__name__ in reached:
                    continue
                reached.add(m.__name__)
                for h in _hints(m).values():
                    walk(h)
            for a in typing.get_args(m):
                walk(a)

    for top in TOP.values():
        walk(top)
    defined = {
        n
        for mod in MODULES
        for n, v in vars(mod).items()
        if _is_typeddict(v) and v.__module__ == mod.__name__
    }
    assert defined - reached <= {n for n in defined if n.startswith("_")}, defined - reached


def test_the_check_sees_a_difference():
    class Frame(TypedDict):
        module: str
        line: int | None

    spec = {
        "type": "object",
        "required": ["module", "line", "address"],
        "properties": {
            "module": {"type": "string"},
            "line": {"type": ["integer", "null"]},
            "address": {"type": "integer"},
        },
    }
    bad = Checker({}).check(spec, Frame, "frame")
    assert any("requires" in b for b in bad) and any("address" in b for b in bad)
    spec["required"].remove("address")
    del spec["properties"]["address"]
    assert Checker({}).check(spec, Frame, "frame") == []
    spec["properties"]["line"] = {"type": "string"}
    assert Checker({}).check(spec, Frame, "frame") == [
        "frame.line: int | None, the schema's string"
    ]
