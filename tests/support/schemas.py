"""Validation of the --json documents against the JSON Schemas the package ships
(cudatrace/schemas/*.json, read through cudatrace.schemas as a user would)."""

from __future__ import annotations

import jsonschema  # type: ignore[import-untyped]  # no type information

from cudatrace import schemas


def validate(doc: dict, schema: str | None = None) -> None:
    """Assert doc is valid under its schema (by default the one its "schema" key names), with
    every error's path in the message."""
    name = schema or doc.get("schema")
    assert isinstance(name, str), f"no schema named in the document: {str(doc)[:200]}"
    spec = schemas.load(name)
    jsonschema.Draft202012Validator.check_schema(spec)
    errors = sorted(
        jsonschema.Draft202012Validator(spec).iter_errors(doc), key=lambda e: list(e.path)
    )
    assert not errors, f"not a valid {name} document:\n" + "\n".join(
        f"  {e.json_path}: {e.message[:300]}" for e in errors[:20]
    )


def property_names(schema: str) -> set[str]:
    """Every key a schema names, at any depth (for the docs' completeness checks)."""
    out: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            out.update(node.get("properties", {}))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schemas.load(schema))
    return out
