"""The documents name files that exist: a move (the floors, the test folders) leaves no stale
path in docs/, README.md or examples/."""

from __future__ import annotations

import re

from support.paths import REPO

PATH = re.compile(
    r"(?<![\w/.-])((?:cudatrace|native|tools|tests|sim)/[A-Za-z0-9_/.-]+\.(?:py|cu|c|h|sh|md))(?!\w)"
)


def test_every_named_file_exists():
    docs = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
    docs += sorted((REPO / "examples").rglob("*.md"))
    missing = []
    for d in docs:
        for m in PATH.finditer(d.read_text()):
            if not (REPO / m.group(1)).exists():
                missing.append(f"{d.relative_to(REPO)}: {m.group(1)}")
    assert not missing, "paths named in the documents that do not exist:\n" + "\n".join(missing)
