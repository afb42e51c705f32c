"""docs/DEVELOPING.md stays true: it lists every setting native/include/settings.def declares
(with the declared default for the shim's own), and the commands it shows exist."""

from __future__ import annotations

import re

from support.paths import REPO

GUIDE = REPO / "docs" / "DEVELOPING.md"
SETTING = re.compile(r'CT_SETTING\(\s*(\w+),\s*"([A-Z_]+)",\s*(CT_\w+),\s*(NULL|"[^"]*")', re.S)


def settings() -> list[tuple[str, str, str | None]]:
    """(name, scope, default) of every CT_SETTING of settings.def."""
    text = (REPO / "native" / "include" / "settings.def").read_text()
    out = []
    for m in SETTING.finditer(text):
        default = None if m.group(4) == "NULL" else m.group(4).strip('"')
        out.append((m.group(2), m.group(3), default))
    return out


def test_settings_def_is_read():
    names = [n for n, _, _ in settings()]
    assert "CUDATRACE_DIR" in names and "CUDATRACE_STACK_DEPTH" in names
    assert len(names) == len(set(names))


def test_guide_lists_every_setting():
    guide = GUIDE.read_text()
    missing = [n for n, _, _ in settings() if f"`{n}`" not in guide]
    assert not missing, f"docs/DEVELOPING.md does not list {missing} (native/include/settings.def)"


def test_guide_gives_the_declared_defaults():
    """A row of the settings table: | `NAME` | default | effect |; the default agrees with the
    declaration (unset for none)."""
    rows = {
        m.group(1): m.group(2).strip().strip("`")
        for m in re.finditer(r"^\| `([A-Z_]+)` \| ([^|]+) \|", GUIDE.read_text(), re.M)
    }
    wrong = []
    for name, scope, default in settings():
        if scope == "CT_PYTHON":
            continue  # described in prose
        got = rows.get(name)
        if got is None:
            wrong.append(f"{name}: no row")
        elif default is None and got != "unset" and scope == "CT_SHIM":
            wrong.append(f"{name}: {got!r}, declared without a default")
        elif default is not None and got != default:
            wrong.append(f"{name}: {got!r}, declared {default!r}")
    assert not wrong, "docs/DEVELOPING.md's settings table:\n" + "\n".join(wrong)


def test_guide_commands_exist():
    guide = GUIDE.read_text()
    for tool in re.findall(r"\b(tools/[\w/.-]+\.(?:sh|py))", guide):
        assert (REPO / tool).is_file(), tool
    makefile = (REPO / "native" / "Makefile").read_text()
    for target in re.findall(r"make -C native (\w+) ", guide):
        assert re.search(rf"^{target}:", makefile, re.M), f"make target {target}"
