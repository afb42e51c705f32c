"""The README says what cudatrace cannot do (issue 44, item 3): attach to a running process,
enter a static or setuid program."""

from __future__ import annotations

from support.paths import REPO


def test_the_readme_says_what_cannot_be_done():
    text = (REPO / "README.md").read_text()
    limits = text.split("## What it cannot do", 1)[1].split("\n## ", 1)[0]
    assert "Attach to a running process" in limits
    assert "restart it under\n  `cudatrace run`" in limits
    assert "Enter a static or setuid program" in limits
