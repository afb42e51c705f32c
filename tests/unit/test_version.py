"""The version is written once, in cudatrace/__init__.py: the package metadata reads it from there
(pyproject's dynamic version), `cudatrace --version` prints it, and native/Makefile stamps it
into the shim (the trace header carries it)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import cudatrace
from cudatrace import native
from support.paths import REPO


def _pyproject() -> str:
    return (REPO / "pyproject.toml").read_text()


def test_pyproject_reads_the_version_from_the_package():
    text = _pyproject()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.M), "pyproject writes a version of its own"
    assert re.search(r"^dynamic\s*=\s*\[[^\]]*\"version\"", project, re.M)
    assert re.search(
        r'^\[tool\.setuptools\.dynamic\]\s*\nversion\s*=\s*\{\s*attr\s*=\s*"cudatrace\.__version__"',
        text,
        re.M,
    )


def test_cli_version_is_the_installed_metadata():
    r = subprocess.run(
        [sys.executable, "-m", "cudatrace", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    printed = r.stdout.strip().split()[-1]
    assert printed == cudatrace.__version__ == importlib.metadata.version("cudatrace")


def _stamped(lib) -> bool:
    return b"\0" + cudatrace.__version__.encode() + b"\0" in lib.read_bytes()


def test_the_build_stamps_the_shim_with_the_package_version(tmp_path):
    """native/Makefile reads __version__ (nothing else writes it) and the shim carries it into
    every trace header; CT_VERSION= overrides it (a build outside a checkout)."""
    assert _stamped(native.ensure_built() / native.SHIM_LIB)
    out = tmp_path / "other"
    r = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(REPO / "native"),
            f"OUT={out}",
            "CT_VERSION=7.7.7-test",
            f"{out}/{native.SHIM_LIB}",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    data = (out / native.SHIM_LIB).read_bytes()
    assert b"\x007.7.7-test\x00" in data and not _stamped(out / native.SHIM_LIB)
    assert not re.search(r"CT_SHIM_VERSION\s+\"", (REPO / "native/shim/util.h").read_text())


def test_changelog_has_the_version():
    """CHANGELOG.md has a section for the version (or an Unreleased one above it)."""
    text = (REPO / "CHANGELOG.md").read_text()
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads, "CHANGELOG.md has no sections"
    assert any(h.split(",")[0].strip() == cudatrace.__version__ for h in heads), heads
    assert heads[0].startswith(("Unreleased", cudatrace.__version__)), heads[0]
