"""JSON Schemas (draft 2020-12) of the documents cudatrace prints with --json, shipped with the
package so that a script or a CI job can validate what it reads:

    from cudatrace import schemas
    jsonschema.validate(doc, schemas.load(doc["schema"]))      # "cudatrace.report/1", ...

report-1.json (`report --json`), diff-1.json (`diff --json`), sweep-1.json (`sweep --json`,
`sweep --from DIR --json`); docs/report-json.md and docs/sweep-json.md describe every key.
Within a version keys are only added, so objects may hold keys a schema does not list.
A leaf: imports nothing from cudatrace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DIR = Path(__file__).resolve().parent
FILES = {
    "cudatrace.report/1": "report-1.json",
    "cudatrace.diff/1": "diff-1.json",
    "cudatrace.sweep/1": "sweep-1.json",
}


def path(schema: str) -> Path:
    """The file of a schema named as documents name it ("cudatrace.report/1")."""
    try:
        return DIR / FILES[schema]
    except KeyError:
        raise ValueError(f"unknown schema {schema!r} (known: {', '.join(sorted(FILES))})") from None


def load(schema: str) -> dict[str, Any]:
    """The JSON Schema of a document version, as a dict."""
    doc: dict[str, Any] = json.loads(path(schema).read_text())
    return doc
