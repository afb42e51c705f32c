"""The C of native/ and sim/ is formatted by the repository's .clang-format (checked where
clang-format is installed; .ci/run installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
while not (REPO / ".clang-format").is_file() and REPO != REPO.parent:
    REPO = REPO.parent


def c_files() -> list[Path]:
    return sorted(
        p for d in ("native", "sim") for p in (REPO / d).rglob("*") if p.suffix in (".c", ".h")
    )


def test_c_sources_are_formatted():
    assert shutil.which("clang-format"), "clang-format not installed (apt-get install clang-format)"
    files = c_files()
    assert files
    r = subprocess.run(
        ["clang-format", "--dry-run", "--Werror", *map(str, files)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, "run: clang-format -i native/*/*.[ch] sim/*.[ch]\n" + r.stderr[-4000:]
