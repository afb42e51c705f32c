"""docs/DEVELOPING.md stays true: the commands it shows exist (its settings table is
generated: tests/unit/test_settings_docs.py)."""

from __future__ import annotations

import re

from support.paths import REPO

GUIDE = REPO / "docs" / "DEVELOPING.md"


def test_guide_commands_exist():
    guide = GUIDE.read_text()
    for tool in re.findall(r"\b(tools/[\w/.-]+\.(?:sh|py))", guide):
        assert (REPO / tool).is_file(), tool
    makefile = (REPO / "native" / "Makefile").read_text()
    for target in re.findall(r"make -C native (\w+) ", guide):
        assert re.search(rf"^{target}:", makefile, re.M), f"make target {target}"
