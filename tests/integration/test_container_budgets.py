"""Budgets that containers get through CDI devices (`cudatrace cdi`), with real Podman and runc,
nothing mocked: the container runs the test programs on the simulated driver, whose state file
it shares with the host through a bind mount (tests/support/podman.py).

The specs are written to /var/run/cdi (Podman 4.3 reads no other directory) under a vendor of
this session's own, and removed at the end. Needs root: rootful Podman (CI runs as root; with
CI=true a missing piece fails, elsewhere it skips)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from support import children
from support.cli import checkout_env, cudatrace
from support.podman import PRELOADS, Podman, podman  # noqa: F401  (fixture)

MiB = 1 << 20
CDI_DIR = Path("/var/run/cdi")
GROUPS = {"share": "1GiB", "kill": "1GiB", "agent": "1GiB", "seal": "1GiB"}


class Node:
    """What `cudatrace cdi` set up for this module: vendor, install root, state, specs."""

    def __init__(self, base: Path):
        self.base = base
        self.vendor = f"t{os.getpid()}-{os.urandom(3).hex()}.cudatrace.dev"
        self.root = base / "root"
        self.state = base / "state"
        self.groups = base / "groups.conf"
        self.groups.write_text("".join(f"[{g}]\nbudget = {b}\n" for g, b in GROUPS.items()))

    def args(self, *more) -> list[str]:
        return [
            "--root",
            self.root,
            "--state",
            self.state,
            "--vendor",
            self.vendor,
            "--groups",
            self.groups,
            *more,
        ]

    def budget(self, size: str) -> str:
        return f"{self.vendor}/budget={size}"

    def group(self, name: str) -> str:
        return f"{self.vendor}/group={name}"


@pytest.fixture(scope="module")
def node(podman, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("node")
    base.chmod(0o755)
    n = Node(base)
    env = checkout_env()
    r = cudatrace(env, "cdi", *n.args("--cdi-dir", CDI_DIR, "--budget", "1GiB"))
    assert r.returncode == 0, r.stderr
    assert f"--device {n.budget('1GiB')}" in r.stdout, r.stdout
    # the same node through LD_PRELOAD (sandboxes): another vendor, its own specs
    n.env_vendor = n.vendor.replace("cudatrace.dev", "env.cudatrace.dev")
    r = cudatrace(
        env,
        "cdi",
        "--root",
        n.root,
        "--state",
        n.state,
        "--vendor",
        n.env_vendor,
        "--cdi-dir",
        CDI_DIR,
        "--budget",
        "1GiB",
        "--preload",
        "env",
    )
    assert r.returncode == 0, r.stderr
    yield n
    for v in (n.vendor, n.env_vendor):
        for kind in ("budget", "group"):
            (CDI_DIR / f"{v}-{kind}.json").unlink(missing_ok=True)


def allocs(out: str) -> list[str]:
    """The result column of hold's alloc lines ('0' granted, '2' out of memory)."""
    return [l.split()[4] for l in out.splitlines() if l.startswith("alloc ")]


def wait_line(p: subprocess.Popen, word: str, timeout: float = 60) -> list[str]:
    """Lines of p's stdout up to one that is word (ready)."""
    lines = []
    deadline = time.monotonic() + timeout
    for line in children.lines(p):
        lines.append(line)
        if line.strip() == word:
            return lines
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no {word!r}: {lines}; stderr {children.said(p) if p.poll() else ''}")


def test_container_with_a_budget_device_is_denied_with_the_attributed_line(podman, node, sim):  # noqa: F811
    state = sim.new_state()
    r = podman.run(
        "--device",
        node.budget("1GiB"),
        *podman.sim_args(state),
        podman.image,
        "hold",
        "--exit-after-ms",
        "10",
        "--free",
        "3",
        "400m",
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert allocs(r.stdout) == ["0", "0", "2"], r.stdout
    line = [l for l in r.stderr.splitlines() if "budget exceeded" in l]
    assert len(line) == 1, r.stderr
    assert "cuMemAlloc_v2" in line[0] and "budget 1.00 GiB, in use 800.00 MiB" in line[0], line
    assert "at hold_alloc" in line[0] and "CUDA_ERROR_OUT_OF_MEMORY" in line[0], line
    # the device held what was granted, never more (the state is the host's file)
    assert sim.stats(state)[0]["hwm"] == 800 * MiB


def test_each_container_has_its_own_size_budget(podman, node, sim):  # noqa: F811
    """Two containers given budget=1GiB at once: 700 MiB each, both granted (each its own)."""
    state = sim.new_state()
    names = [podman.name(), podman.name()]
    procs = [
        podman.popen(
            "--device",
            node.budget("1GiB"),
            *podman.sim_args(state),
            podman.image,
            "hold",
            "1",
            "700m",
            name=n,
        )
        for n in names
    ]
    try:
        for p in procs:
            assert allocs("".join(wait_line(p, "ready"))) == ["0"]
        assert sim.stats(state)[0]["used"] == 1400 * MiB
    finally:
        for n in names:
            podman.remove(n)
        for p in procs:
            p.communicate(timeout=60)


def test_two_containers_of_one_group_share_its_budget(podman, node, sim):  # noqa: F811
    state = sim.new_state()
    a_name = podman.name()
    a = podman.popen(
        "--device",
        node.group("share"),
        *podman.sim_args(state),
        podman.image,
        "hold",
        "1",
        "700m",
        name=a_name,
    )
    try:
        assert allocs("".join(wait_line(a, "ready"))) == ["0"]
        b = podman.run(
            "--device",
            node.group("share"),
            *podman.sim_args(state),
            podman.image,
            "hold",
            "--exit-after-ms",
            "10",
            "--free",
            "1",
            "700m",
        )
        assert b.returncode == 1 and allocs(b.stdout) == ["2"], (b.stdout, b.stderr)
        assert "in use 700.00 MiB" in b.stderr, b.stderr
        # the group's ledger is in the host directory made for it, and nowhere else: one file
        # for the containers' user (root in both)
        assert [p.name for p in (node.state / "groups" / "share").glob("*.ledger")] == [
            "share@0.ledger"
        ]
    finally:
        podman.remove(a_name)
        a.communicate(timeout=60)


def test_a_container_killed_gives_its_memory_back(podman, node, sim):  # noqa: F811
    """A holds 700 MiB of group kill; B waits for 700 MiB (retrying); `podman kill -s KILL A`:
    B is granted within seconds (A's liveness lock went with its process)."""
    state = sim.new_state()
    a_name, b_name = podman.name(), podman.name()
    a = podman.popen(
        "--device",
        node.group("kill"),
        *podman.sim_args(state),
        podman.image,
        "hold",
        "1",
        "700m",
        name=a_name,
    )
    b = None
    try:
        wait_line(a, "ready")
        b = podman.popen(
            "--device",
            node.group("kill"),
            *podman.sim_args(state),
            podman.image,
            "sh",
            "-c",
            "while :; do hold --exit-after-ms 0 1 700m >/dev/null 2>&1 && "
            "{ echo granted; exec sleep 600; }; done",
            name=b_name,
        )
        time.sleep(1.0)  # B is being denied now
        assert b.poll() is None
        t0 = time.monotonic()
        podman.podman("kill", "-s", "KILL", a_name)
        wait_line(b, "granted", timeout=30)
        assert time.monotonic() - t0 < 10
    finally:
        podman.remove(a_name)
        podman.remove(b_name)
        a.communicate(timeout=60)
        if b is not None:
            b.communicate(timeout=60)


def test_an_applications_own_ld_preload_survives(podman, node, sim):  # noqa: F811
    """The application preloads its own library (an interposer of cuMemAlloc_v2): it still
    runs (its count at exit), and the budget still holds (the third allocation denied)."""
    r = podman.run(
        "--device",
        node.budget("1GiB"),
        "-e",
        f"LD_PRELOAD={PRELOADS}/libinterpose.so",
        *podman.sim_args(sim.new_state()),
        podman.image,
        "hold",
        "--exit-after-ms",
        "10",
        "--free",
        "3",
        "400m",
    )
    assert allocs(r.stdout) == ["0", "0", "2"], (r.stdout, r.stderr)
    assert "# interpose cuMemAlloc_v2 3" in r.stderr, r.stderr
    assert "budget exceeded" in r.stderr, r.stderr


def test_a_container_without_the_device_is_untouched(podman, node, sim):  # noqa: F811
    r = podman.run(
        *podman.sim_args(sim.new_state()),
        podman.image,
        "sh",
        "-c",
        "env; echo preload:; cat /etc/ld.so.preload 2>&1; hold --exit-after-ms 10 --free 3 400m",
    )
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert allocs(r.stdout) == ["0", "0", "0"], r.stdout
    assert "CUDATRACE_" not in r.stdout and "LD_PRELOAD" not in r.stdout, r.stdout
    assert str(node.root) not in r.stdout + r.stderr
    assert "No such file" in r.stdout.split("preload:", 1)[1], r.stdout


def test_sandbox_mode_preloads_through_the_environment(podman, node, sim):  # noqa: F811
    r = podman.run(
        "--device",
        f"{node.env_vendor}/budget=1GiB",
        *podman.sim_args(sim.new_state()),
        podman.image,
        "sh",
        "-c",
        "cat /etc/ld.so.preload 2>/dev/null; echo LD_PRELOAD=$LD_PRELOAD; "
        "exec hold --exit-after-ms 10 --free 3 400m",
    )
    assert allocs(r.stdout) == ["0", "0", "2"], (r.stdout, r.stderr)
    assert f"LD_PRELOAD={node.root}/shim/" in r.stdout, r.stdout
    assert "budget exceeded" in r.stderr, r.stderr


def test_the_specs_name_the_lowest_cdi_version_podman_reads(node):
    import json

    budget = json.loads((CDI_DIR / f"{node.vendor}-budget.json").read_text())
    group = json.loads((CDI_DIR / f"{node.vendor}-group.json").read_text())
    assert budget["cdiVersion"] == "0.5.0"  # a name beginning with a digit, a tmpfs mount
    assert group["cdiVersion"] == "0.3.0"


# ---- the sealed fence: what a container's own processes can try --------------------------------


@pytest.mark.parametrize("user", ["65534:65534", "1000:1000"])
def test_a_containers_environment_cannot_raise_its_budget(podman, node, sim, user):  # noqa: F811
    """The attack: in a container given budget=1GiB, `sh -c 'CUDATRACE_BUDGET=8589934592 prog'`
    took 4 GiB (it made the container's group first, with its own budget). The fence is the
    record mounted read-only at /etc/cudatrace/fence now: the variable is ignored with one line,
    and the budget holds, for any uid in the container."""
    state = sim.new_state()
    args = podman.sim_args(state)
    state.chmod(0o666)  # the simulated GPU, for any uid in the container
    r = podman.run(
        "--device", node.budget("1GiB"), "--user", user, *args, podman.image,
        "sh", "-c", "CUDATRACE_BUDGET=8589934592 exec hold --exit-after-ms 10 4 1g",
    )  # fmt: skip
    assert allocs(r.stdout) == ["0", "2", "2", "2"], (r.stdout, r.stderr)
    (line,) = [ln for ln in r.stderr.splitlines() if "the sealed fence" in ln]
    assert "(/etc/cudatrace/fence)" in line and "CUDATRACE_BUDGET='8589934592'" in line, line
    assert sim.stats(state)[0]["hwm"] <= 1 << 30


def test_a_containers_environment_cannot_move_its_group_or_ledger(podman, node, sim):  # noqa: F811
    """The attack: in a group=team-a container, CUDATRACE_GROUP=mine CUDATRACE_LEDGER_DIR=/tmp
    took 4 GiB of the group's 1 GiB (any sticky root's directory was a ledger directory)."""
    state = sim.new_state()
    args = podman.sim_args(state)
    state.chmod(0o666)  # the simulated GPU, for any uid in the container
    r = podman.run(
        "--device", node.group("seal"), "--user", "65534:65534", *args, podman.image,
        # set inside the container (a `podman run -e` comes before the device's own variables)
        "sh", "-c", "CUDATRACE_GROUP=mine CUDATRACE_LEDGER_DIR=/tmp CUDATRACE_ON_EXCEED=warn "
        "CUDATRACE_ON_FENCE_ERROR=warn hold --exit-after-ms 10 4 1g; ls /tmp",
    )  # fmt: skip
    assert allocs(r.stdout) == ["0", "2", "2", "2"], (r.stdout, r.stderr)
    assert "mine.ledger" not in r.stdout, r.stdout
    (line,) = [ln for ln in r.stderr.splitlines() if "the sealed fence" in ln]
    assert "CUDATRACE_GROUP='mine'" in line and "CUDATRACE_LEDGER_DIR='/tmp'" in line, line
    assert "CUDATRACE_ON_EXCEED='warn'" in line and "allowed (--on-exceed warn)" not in r.stderr


def test_root_in_a_container_cannot_rewrite_or_replace_the_record(podman, node, sim):  # noqa: F811
    """The record is a read-only mount: root in the container can neither write it nor remove
    or replace it (no CAP_SYS_ADMIN to unmount it); the budget holds."""
    r = podman.run(
        "--device", node.budget("1GiB"), *podman.sim_args(sim.new_state()), podman.image,
        "sh", "-c", "echo x > /etc/cudatrace/fence; echo rc=$?; cat /etc/cudatrace/fence; "
        "exec hold --exit-after-ms 10 2 1g",
    )  # fmt: skip
    assert "rc=0" not in r.stdout and "Read-only file system" in r.stderr, (r.stdout, r.stderr)
    assert "cudatrace-fence 1\n" in r.stdout and "budget=1073741824" in r.stdout, r.stdout
    assert allocs(r.stdout) == ["0", "2"], (r.stdout, r.stderr)
