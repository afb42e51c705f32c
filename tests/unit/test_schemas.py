"""The JSON Schemas the package ships (cudatrace/schemas/): valid schemas, shipped, named by the
docs, holding the real outputs (the golden files: what `report`, `diff` and `sweep --from`
print) and refusing broken ones."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from cudatrace import schemas
from support.goldens import GOLDEN
from support.paths import REPO
from support.schemas import validate

DOCS = {
    "cudatrace.report/1": "report-json.md",
    "cudatrace.diff/1": "report-json.md",
    "cudatrace.sweep/1": "sweep-json.md",
}
GOLDEN_JSON = {
    "cudatrace.report/1": "report.json",
    "cudatrace.diff/1": "diff.json",
    "cudatrace.sweep/1": "sweep-from.json",
}


@pytest.mark.parametrize("name", sorted(schemas.FILES))
def test_schema_file_is_a_schema_of_its_version(name):
    spec = schemas.load(name)
    jsonschema.Draft202012Validator.check_schema(spec)
    assert spec["title"] == name
    assert spec["properties"]["schema"] == {"const": name}
    assert "schema" in spec["required"]


def test_every_shipped_file_is_known_and_packaged():
    on_disk = {p.name for p in schemas.DIR.glob("*.json")}
    assert on_disk == set(schemas.FILES.values())
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"cudatrace.schemas" = ["*.json"]' in pyproject


@pytest.mark.parametrize("name", sorted(GOLDEN_JSON))
def test_real_output_is_valid(name):
    doc = json.loads((GOLDEN / GOLDEN_JSON[name]).read_text())
    assert doc["schema"] == name
    validate(doc)


def _refused(doc, name) -> list[str]:
    v = jsonschema.Draft202012Validator(schemas.load(name))
    return [e.message for e in v.iter_errors(doc)]


def test_a_broken_report_is_refused():
    good = json.loads((GOLDEN / "report.json").read_text())
    cases = [
        ("peak_bytes", lambda d: d.update(peak_bytes="7516192768")),
        ("sites", lambda d: d.pop("sites")),
        ("'nowhere' is not one of", lambda d: d.update(by="nowhere")),
        ("function", lambda d: d["sites"][0]["frames"][0].pop("function")),
        ("True is not of type 'integer'", lambda d: d["processes"][0].update(pid=True)),
        ("cudatrace.report/2", lambda d: d.update(schema="cudatrace.report/2")),
    ]
    for what, mutate in cases:
        bad = copy.deepcopy(good)
        mutate(bad)
        errors = _refused(bad, "cudatrace.report/1")
        assert errors and any(what in e or what in str(bad) for e in errors), (what, errors)


def test_a_broken_diff_and_sweep_are_refused():
    diff = json.loads((GOLDEN / "diff.json").read_text())
    diff["sites"][0]["status"] = "bigger"
    assert _refused(diff, "cudatrace.diff/1")
    sweep = json.loads((GOLDEN / "sweep-from.json").read_text())
    sweep["runs"][0].pop("included")
    assert _refused(sweep, "cudatrace.sweep/1")


@pytest.mark.parametrize("name", sorted(schemas.FILES))
def test_docs_point_to_the_schema_and_name_its_keys(name):
    text = (REPO / "docs" / DOCS[name]).read_text()
    assert f"cudatrace/schemas/{schemas.FILES[name]}" in text
    for key in schemas.load(name)["properties"]:
        named = f"`{key}`" in text or f"`{key}[]`" in text
        assert named, f"docs/{DOCS[name]} does not name {name}'s key {key!r}"


def test_unknown_schema_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown schema 'cudatrace.report/9'"):
        schemas.load("cudatrace.report/9")
