"""Every runnable example of README.md, examples/kv-pool/README.md and docs/*.md, run as a user
without a GPU would run it (cudatrace on PATH, the simulated driver through --simulated, no
setting of the simulator's by hand) and compared with the output the page shows
(support/docs_examples.py: the marker, the normalization, `...`).

`pytest tests/integration/test_docs_examples.py --update-docs` writes the outputs into the
pages instead (read the diff, then commit it), as --update-goldens does for tests/golden/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import docs_examples as dx
from support.paths import REPO

PAGES = sorted(
    str(p.relative_to(REPO))
    for p in [REPO / "README.md", REPO / "examples" / "kv-pool" / "README.md"]
    + list((REPO / "docs").glob("*.md"))
    if dx.MARKER in p.read_text()
)


def test_the_pages_with_examples_are_found():
    assert "README.md" in PAGES and "docs/exit-codes.md" in PAGES, PAGES


def _update(config) -> bool:
    return bool(config.getoption("--update-docs") or os.environ.get("CUDATRACE_UPDATE_DOCS"))


@pytest.fixture(scope="module")
def user_env(tmp_path_factory):
    """PATH with `cudatrace` (this checkout's) and the test's python3; nothing of the simulator
    set by hand (LD_LIBRARY_PATH, CUDASIM_*); one cache for the simulator's build; a fixed
    terminal width."""
    bindir = tmp_path_factory.mktemp("bin")
    wrapper = bindir / "cudatrace"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m cudatrace "$@"\n')
    wrapper.chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUDASIM_", "CUDATRACE_"))
        and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "COLUMNS", "NO_COLOR")
    }
    env["PATH"] = os.pathsep.join([str(bindir), os.path.dirname(sys.executable), env["PATH"]])
    env["PYTHONPATH"] = str(REPO)
    env["CUDATRACE_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    env["COLUMNS"] = "100"
    return env


@pytest.mark.parametrize("page", PAGES)
def test_examples_print_what_the_page_shows(page, user_env, tmp_path, request):
    path = REPO / page
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "examples").symlink_to(REPO / "examples")
    results: dict[tuple[int, int], list[str]] = {}
    wrong = []
    for bi, block in enumerate(dx.blocks(path.read_text())):
        for ci, cmd in enumerate(block.commands):
            r = subprocess.run(
                ["bash", "-c", cmd.line.replace("\\\n", " ")],
                cwd=cwd,
                env=user_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                timeout=300,
            )
            out = r.stdout.split("\n")
            if out and out[-1] == "":
                out.pop()
            shown = [x.replace(str(cwd) + "/", "").replace(str(cwd), ".").rstrip() for x in out]
            results[(bi, ci)] = shown
            want = [dx.normalize(x) for x in cmd.expected]
            got = [dx.normalize(x, str(cwd)) for x in out]
            if not dx.matches(want, got):
                wrong.append(
                    "$ {}\n--- the page shows\n{}\n--- the run printed\n{}".format(
                        cmd.line, "\n".join(cmd.expected), "\n".join(shown)
                    )
                )
    if _update(request.config):
        dx.rewrite(path, results)
        return
    assert not wrong, f"{page}: examples that print something else " + (
        "(pytest --update-docs writes what they print):\n\n" + "\n\n".join(wrong)
    )


def test_normalize_and_ellipsis():
    assert dx.normalize("  peak of live device memory: 432.0 MiB at 0.390 s") == (
        "  peak of live device memory: 432.0 MiB at <T> s"
    )
    assert dx.normalize("pid 27078 ppid 1 in 27078.6.ctrace at kvpool+0x2c52") == (
        "pid <PID> ppid <PID> in <PID>.<N>.ctrace at kvpool+0x<OFF>"
    )
    assert dx.matches(["a", "...", "z"], ["a", "b", "c", "z"])
    assert dx.matches(["a", "..."], ["a"]) and not dx.matches(["a", "..."], ["b"])
    assert not dx.matches(["a", "z"], ["a", "b", "z"])
    assert dx.updated(["a", "b", "...", "y"], list("abcdefxy")) == ["a", "b", "...", "y"]
    assert dx.updated(["a", "..."], ["a"]) == ["a"]


def test_update_writes_outputs_and_keeps_elisions(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("x\n<!-- runnable -->\n```console\n$ one\nold\n...\n$ two \\\n  more\n```\n")
    dx.rewrite(page, {(0, 0): ["new1", "new2", "new3"], (0, 1): ["b"]})
    assert page.read_text() == (
        "x\n<!-- runnable -->\n```console\n$ one\nnew1\n...\n$ two \\\n  more\nb\n```\n"
    )
    assert Path(page).read_text().count("<!-- runnable -->") == 1
