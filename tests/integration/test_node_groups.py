"""The node agent's housekeeping, in-process on the host (no container needed): a group taken
out of the config loses its directory once no member of it lives, and a process given a
budget that uses CUDA without the preload library is reported."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from cudatrace import native
from cudatrace.deploy.agent import Agent, Config
from support import children


def agent(tmp_path, groups_text: str) -> tuple[Agent, list[str]]:
    conf = tmp_path / "groups.conf"
    conf.write_text(groups_text)
    said: list[str] = []
    cfg = Config(
        groups=conf,
        root=tmp_path / "root",
        state=tmp_path / "state",
        cdi_dir=tmp_path / "cdi",
        vendor="t.cudatrace.dev",
        interval=0.1,
        node="n1",
    )
    a = Agent(cfg, say=said.append, nvml=_NoNvml())
    a.prepare()
    return a, said


class _NoNvml:
    available = False
    why = "not here"


def member(sim, tmp_path, group: str, where=None, size: str = "10m") -> subprocess.Popen:
    """A process in group through the environment contract (its ledger in where, default the
    group's directory of the node), holding size until killed."""
    env = sim.env(state=sim.new_state())
    env.update(
        LD_PRELOAD=str(native.shim_path()),
        CUDATRACE_GROUP=group,
        CUDATRACE_BUDGET="1GiB",
        CUDATRACE_LEDGER_DIR=str(where or tmp_path / "state" / "groups" / group),
    )
    p = children.popen(
        [str(sim.progs["hold"]), "1", size], env=env, stdout=subprocess.PIPE, text=True
    )
    assert children.readline(p).startswith("alloc ") and children.readline(p).strip() == "ready"
    return p


def test_a_group_taken_out_goes_once_its_members_have(sim, tmp_path):
    a, said = agent(tmp_path, "[keep]\nbudget = 1GiB\n[drop]\nbudget = 1GiB\n")
    groups = tmp_path / "state" / "groups"
    assert sorted(p.name for p in groups.iterdir()) == ["drop", "keep"]
    spec = (tmp_path / "cdi" / "t.cudatrace.dev-group.json").read_text()
    assert '"drop"' in spec
    m = member(sim, tmp_path, "drop")
    try:
        (tmp_path / "groups.conf").write_text("[keep]\nbudget = 1GiB\n")
        time.sleep(0.01)  # a new mtime
        a.cycle()
        # its member lives (a named group's directory is shared: the part of the member's uid)
        assert (groups / "drop" / f"drop@{os.geteuid()}.ledger").is_file()
        assert '"drop"' not in (tmp_path / "cdi" / "t.cudatrace.dev-group.json").read_text()
        ledgers = {s["group"]: s for s in a.published()["ledgers"]}
        assert ledgers["drop"]["devices"][0]["in_use"] == 10 << 20
    finally:
        m.kill()
        m.wait()
    a.cycle()
    assert sorted(p.name for p in groups.iterdir()) == ["keep"]
    assert any("group drop is gone" in line for line in said), said


def test_a_process_given_a_budget_without_the_library_is_reported(sim, tmp_path):
    a, said = agent(tmp_path, "[g]\nbudget = 1GiB\n")
    env = sim.env(state=sim.new_state())
    env["CUDATRACE_GROUP"] = "g"  # as a container whose ld.so could not preload the library
    p = children.popen(
        [str(sim.progs["hold"]), "1", "10m"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        children.readline(p)
        a.cycle()
        mine = [u for u in a.unfenced if u.pid == p.pid]
        assert mine and mine[0].env["CUDATRACE_GROUP"] == "g"
        assert any(f"pid {p.pid}" in l and "not fenced" in l for l in said), said
        n = len(said)
        a.cycle()  # said once
        assert not [l for l in said[n:] if f"pid {p.pid}" in l]
    finally:
        p.kill()
        p.wait()


def test_a_groups_name_is_its_own_before_a_ledger_elsewhere_that_takes_it(sim, tmp_path):
    """A process may write any group name into a ledger of its own: one in /dev/shm calling
    itself by a group of the node was labelled with the group's name (it came first in the
    agent's order: /dev/shm's device sorts before most disks), the node's own group `<name>#2`.
    The groups of the node's directories take their names first."""
    name = f"own{os.getpid()}"  # the agent sees every ledger of the host: a name of this test's
    a, _ = agent(tmp_path, f"[{name}]\nbudget = 1GiB\n")
    elsewhere = Path(tempfile.mkdtemp(prefix="cudatrace-squat-", dir="/dev/shm"))
    ps = []
    try:
        ps.append(member(sim, tmp_path, name, where=elsewhere, size="20m"))
        ps.append(member(sim, tmp_path, name))
        a.cycle()
        held = {
            s["label"]: s["devices"][0]["in_use"]
            for s in a.published()["ledgers"]
            if s["group"] == name
        }
        assert held == {name: 10 << 20, f"{name}#2": 20 << 20}, held
    finally:
        for p in ps:
            p.kill()
            p.wait()
        shutil.rmtree(elsewhere, ignore_errors=True)
