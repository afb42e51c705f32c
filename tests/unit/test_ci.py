"""The README's test command is what CI runs, and the system packages the suite needs are listed
once (tools/install-test-deps.sh), with every tool the tests call."""

from __future__ import annotations

import re
import subprocess

from support.paths import REPO

README = (REPO / "README.md").read_text()
CI = (REPO / ".ci" / "run").read_text()
SCRIPT = REPO / "tools" / "install-test-deps.sh"


def _test_command() -> str:
    section = README.split("## Run the tests\n", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_ci_runs_the_readme_command():
    cmd = _test_command()
    assert cmd in CI, cmd
    assert "tools/install-test-deps.sh" in cmd and "-n auto" in cmd
    assert "apt-get" not in CI  # the package list lives in the script alone


def test_the_package_list_names_what_the_tests_use():
    out = subprocess.run([str(SCRIPT), "--list"], capture_output=True, text=True, check=True)
    names = [line.split(":", 1)[0] for line in out.stdout.splitlines()]
    assert len(names) == len(set(names)), names
    need = (
        "gcc g++ make libc6-dev binutils clang-format golang-go chromium python3-dev "
        "gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu qemu-user "
        "prometheus slurm-wlm munge util-linux podman runc uidmap valgrind"
    ).split()
    assert not set(need) - set(names), set(need) - set(names)
    assert all(": " in line for line in out.stdout.splitlines())  # each says what needs it


def test_the_test_extra_has_what_the_suite_imports():
    text = (REPO / "pyproject.toml").read_text()
    extra = re.search(r"\ntest = \[(.*?)\][ \t]*(#[^\n]*)?\n", text, re.S).group(1)
    for pkg in ("pytest-xdist", "ziglang", "playwright", "hypothesis", "jsonschema"):
        assert f'"{pkg}' in extra, pkg
