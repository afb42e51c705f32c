"""The README's test command is what CI runs, and the system packages the suite needs are listed
once (tools/install-test-deps.sh), with every tool the tests call."""

from __future__ import annotations

import re
import subprocess

from support.paths import REPO

README = (REPO / "README.md").read_text()
CI = (REPO / ".ci" / "run").read_text()
SCRIPT = REPO / "tools" / "install-test-deps.sh"


def _commands(heading: str) -> str:
    section = README.split(heading + "\n", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_ci_runs_the_readme_commands():
    """Both of the README's commands, word for word: the install and the demo, and the tests."""
    install = _commands("## Install and run (fresh machine)")
    tests = _commands("## Run the tests")
    assert install in CI and tests in CI
    # a bare Debian or Ubuntu needs its package lists first, then what the build needs
    assert install.startswith("sudo apt-get update && sudo apt-get install -y python3-venv ")
    assert install.rstrip().endswith("cudatrace demo")
    assert "tools/install-test-deps.sh" in tests and "-n auto" in tests
    # the suite's system packages are listed in the script alone: outside the README's own
    # line, CI installs only what makes its bare root
    rest = CI.replace(install, "")
    assert all("mmdebstrap" in x for x in rest.splitlines() if "apt-get install" in x)
    # the bare machine: Debian 12 minbase, with nothing but these three
    assert "mmdebstrap --variant=minbase --include=ca-certificates,git,python3 " in CI
    assert re.search(r"\sbookworm \"\$root\"", CI)


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
