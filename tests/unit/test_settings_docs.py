"""The settings' pages are written from native/include/settings.def (cudatrace/settings.py):
docs/settings.md (what users set, by group) and docs/DEVELOPING.md's table (every variable).
Each holds a generated part between two markers; the test fails when it is stale.

A change of settings.def: `pytest tests/unit/test_settings_docs.py --update-docs` (or
CUDATRACE_UPDATE_DOCS=1), then read
`git diff docs/` and commit it."""

from __future__ import annotations

import re

import pytest

from cudatrace import settings
from support.paths import REPO

BEGIN = "<!-- BEGIN generated from native/include/settings.def: pytest tests/unit/test_settings_docs.py --update-docs -->"
END = "<!-- END generated -->"
PAGES = {
    "docs/settings.md": settings.markdown_groups,
    "docs/DEVELOPING.md": settings.markdown_table,
}


def generated_part(text: str) -> tuple[int, int]:
    """(start, end) of the text between the markers."""
    start, end = text.find(BEGIN), text.find(END)
    assert start >= 0 and end > start, f"the markers {BEGIN!r} ... {END!r} are missing"
    return start + len(BEGIN) + 1, end


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_is_generated_from_settings_def(page, request):
    path = REPO / page
    text = path.read_text()
    start, end = generated_part(text)
    want = "\n" + PAGES[page]() + "\n"
    if request.config.getoption("--update-docs") or settings.value("UPDATE_DOCS"):
        path.write_text(text[:start] + want + text[end:])
        return
    assert text[start:end] == want, (
        f"{page} is stale against native/include/settings.def: "
        "pytest tests/unit/test_settings_docs.py --update-docs"
    )


def test_settings_page_lists_what_users_set():
    text = (REPO / "docs" / "settings.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` \|", text, re.M))
    for s in settings.declared().values():
        assert (s.name in listed) == (s.group.setter in ("user", "run")), s.name
    assert {"CUDATRACE_GROUP", "CUDATRACE_LEDGER_DIR", "CUDATRACE_CACHE"} <= listed


def test_developer_table_lists_every_setting_with_its_default():
    text = (REPO / "docs" / "DEVELOPING.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| \w+ \| \w+ \| ([^|]+) \|", text, re.M))
    assert set(rows) == {s.name for s in settings.declared().values()}
    assert rows["CUDATRACE_STACK_DEPTH"].strip() == f"`{settings.default('STACK_DEPTH')}`"
    assert rows["CUDATRACE_DIR"].strip() == "unset"


def test_a_stale_page_is_caught():
    """The comparison sees a declaration the page does not have."""
    text = f"intro\n{BEGIN}\n\n{settings.markdown_table()}\n{END}\n"
    start, end = generated_part(text)
    assert text[start:end] == "\n" + settings.markdown_table() + "\n"
    stale = text.replace("`CUDATRACE_GROUP_WAIT`", "`CUDATRACE_GROUP_WAITS`")
    start, end = generated_part(stale)
    assert stale[start:end] != "\n" + settings.markdown_table() + "\n"
