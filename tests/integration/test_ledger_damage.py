"""Ledgers no tenant can damage for another (issue 40; docs/budgets.md, "Shared ledger
directories" and the threat model): whatever a user does to a ledger file (truncate, grow,
garble it, put a FIFO, a link or another file in its place) kills no process of another user and
never a reader (`cudatrace status`, `metrics`, the node agent, the pytest plugin), and the other
users' members stay counted. A member maps only its own uid's part; everyone else reads a copy
(pread). The suite runs as root; the users are uids of their own (setpriv, tests/support/tenants.py).

tests/ledger/parts_test.c drives the C directly (several users hammering one budget, each damage
against a member of another uid, the node agent's figures); the rest run the preload library in
the simulated driver's programs, and cudatrace's readers as the node runs them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cudatrace.record.ledger import Ledger
from support import ledger_harness
from support.cli import checkout_env
from support.paths import REPO
from support.tenants import ALICE, BOB, Steps, need_root, tenants, wait_line

MiB = 1 << 20
GiB = 1 << 30


# ---- the C, directly ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parts_harness(tmp_path_factory):
    exe = tmp_path_factory.mktemp("parts_harness") / "parts_test"
    return ledger_harness.build(exe, "parts_test", ledger_harness.PLAIN)


@pytest.mark.parametrize("case", ["hammer", "late", "forked", "damage", "agent", "setuid"])
def test_parts_harness(parts_harness, case):
    need_root()
    with ledger_harness.users_dir() as d:
        r = ledger_harness.run(parts_harness, d, case, mode=0o755)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("ok " + case) in r.stdout, r.stdout + r.stderr


# ---- the preload library in the users' programs --------------------------------------------------

# what Alice does to every ledger file of the directory she can (her own part; before parts,
# the group's one shared file): (shell on "$f", whether her members still count for the others)
DAMAGE = {
    "truncated": ('truncate -s 0 "$f"', True),
    "grown": ('truncate -s 1G "$f"', True),
    "garbled": ('head -c 4096 /dev/urandom | dd of="$f" conv=notrunc status=none', True),
    "a FIFO": ('rm "$f" && mkfifo -m 644 "$f"', False),
    "a link to another file": ('rm "$f" && ln -s /etc/hostname "$f"', False),
    "another file": ('rm "$f" && head -c 200704 /dev/zero > "$f"', False),
}


def _damage_all(t, uid: int, script: str, others_only: bool = False) -> list[str]:
    """script run as uid on every ledger file of the directory (others_only: those of other
    users); the files it changed that are not uid's own (none may be)"""
    skip = f'[ "$o" = {uid} ] && continue; ' if others_only else ""
    r = t.sh(
        uid,
        f'for f in {t.ledgers}/*.ledger; do o=$(stat -c %u "$f"); {skip}'
        f'if ({script}) 2>/dev/null && [ "$o" != {uid} ]; then echo "TOUCHED $f"; fi; done; true',
    )
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line.startswith("TOUCHED")]


def _status(ct, t) -> dict:
    r = ct.cli("status", "g", "--json", env=checkout_env(t.plain_env()), timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_users_damage_kills_no_member_of_another(ct, sim, kind):
    """Alice and Bob share group g (1 GiB) in the node's shared directory. Alice damages every
    ledger file she can (her own part): Bob's process runs on, allocates, is denied exactly
    where the group's budget says, and `cudatrace status` still shows him."""
    script, alice_counts = DAMAGE[kind]
    with tenants(sim) as t:
        env = t.env(budget="1GiB")
        alice = t.popen(ALICE, [t.prog("hold"), "1", "200m"], env)
        bob = None
        try:
            wait_line(alice, "ready")
            bob = Steps(t, BOB, env)
            assert bob.do("a 300m") == "ok"
            bad = 'truncate -s 0 "$f" || printf x >> "$f" || rm "$f"'
            assert _damage_all(t, ALICE, bad, others_only=True) == []
            assert _damage_all(t, ALICE, script) == []
            assert bob.do("a 400m") == "ok"  # 200 + 300 + 400 MiB: within 1 GiB either way
            # 200 MiB more: over the budget while Alice's 200 MiB count (her part's last figure)
            reply = bob.do("a 200m")
            assert reply.startswith("# failed") if alice_counts else reply == "ok", reply
            st = _status(ct, t)
            (g,) = st["ledgers"]
            mine = [m for m in g["members"] if m["uid"] == BOB]
            assert [m["state"] for m in mine] == ["alive"], g["members"]
            held = mine[0]["devices"]["0"]["held"]
            assert held == (700 if alice_counts else 900) * MiB
            assert [e["path"] for e in st["errors"]] == [str(t.part(ALICE))], st["errors"]
            rc, err = bob.quit()
            bob = None
            assert rc == 0, err
            assert "cudatrace: budget exceeded" in err if alice_counts else True
            if kind in ("truncated", "garbled", "another file"):  # said once, with the reason
                assert err.count(f"note: uid {ALICE}'s part of budget group g") == 1, err
        finally:
            if bob is not None:
                bob.p.kill()
            alice.kill()  # (her own damage may have killed her already: hers to do)
            alice.communicate(timeout=30)


def test_a_member_whose_own_ledger_is_damaged_fails_closed_with_one_line(sim):
    """A user who garbles the part its own running processes map: their CUDA allocations are
    refused from then on (as fence errors are), one line says why, nothing else dies."""
    with tenants(sim) as t:
        s = Steps(t, ALICE, t.env())
        assert s.do("a 10m") == "ok"
        r = t.sh(
            ALICE, f"head -c 4096 /dev/urandom | dd of={t.part(ALICE)} conv=notrunc status=none"
        )
        assert r.returncode == 0, r.stderr
        time.sleep(1.2)  # a member looks at its own file once a second
        replies = [s.do("a 10m") for _ in range(3)]
        rc, err = s.quit()
        assert replies == ["# failed 800"] * 3, (replies, err)  # CUDA_ERROR_NOT_PERMITTED
        lines = [line for line in err.splitlines() if "changed under its members" in line]
        assert len(lines) == 1, err
        assert lines[0].startswith("cudatrace: fencing cannot be set up: the budget ledger ")
        assert "CUDA is refused in this process" in lines[0]
        assert rc == 0


def test_a_member_keeps_the_directory_it_opened(sim):
    """A ledger directory swapped for a link after members joined: they keep counting in the
    directory they opened (its descriptor), and a process that starts now refuses the link."""
    with tenants(sim) as t:
        home = t.base / "alice"
        home.mkdir(mode=0o755)
        os.chown(home, ALICE, ALICE)
        private = home / "ledgers"
        private.mkdir(mode=0o700)
        os.chown(private, ALICE, ALICE)
        env = t.env(CUDATRACE_LEDGER_DIR=str(private))
        s = Steps(t, ALICE, env)
        assert s.do("a 600m") == "ok"
        r = t.sh(ALICE, f"mv {private} {private}.old && ln -s {private}.old {private}")
        assert r.returncode == 0, r.stderr
        assert s.do("a 600m").startswith("# failed")  # the old directory's group: 1 GiB
        late = t.popen(ALICE, [t.prog("hold"), "1", "1m"], env)
        out, err = late.communicate(timeout=30)
        assert "is a symbolic link" in err and "fencing cannot be set up" in err, err
        rc, err = s.quit()
        assert rc == 0, err


# ---- the readers ---------------------------------------------------------------------------------


def _damaged_dir(root: Path) -> dict[str, Path]:
    """A ledger directory with one healthy group and a damaged file of each kind."""
    d = root / "ledgers"
    d.mkdir(mode=0o700)
    made = {}
    for name in ("trunc", "grown", "garbage"):
        p = d / f"{name}.ledger"
        Ledger.create(p, {0: GiB}, group=name).close()
        made[name] = p
    os.truncate(made["trunc"], 100)
    os.truncate(made["grown"], 3 << 20)
    with open(made["garbage"], "r+b") as f:
        f.write(os.urandom(4096))
    os.mkfifo(d / "fifo.ledger")
    (d / "link.ledger").symlink_to(made["garbage"])
    (d / "dir.ledger").mkdir()
    return {p.name: p for p in d.iterdir()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_and_metrics_read_past_damaged_ledgers(ct, sim, tmp_path):
    """`cudatrace status` and `cudatrace metrics` over a directory where ledgers were cut short,
    grown, garbled, or replaced by a FIFO, a link, a directory: each is listed as unusable with
    its reason, the healthy group is shown, nothing hangs or dies."""
    files = _damaged_dir(tmp_path)
    d = tmp_path / "ledgers"
    env = ct.env(state=sim.new_state())
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    hold = subprocess.Popen(
        [sys.executable, "-m", "cudatrace", "run", "-q", "--no-trace", "--group", "ok",
         "--budget", "1GiB", "--", str(sim.progs["hold"]), "1", "100m"],
        env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    metrics = None
    try:
        wait_line(hold, "ready")
        r = ct.cli("status", "--json", env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert {s["group"] for s in st["ledgers"]} == {"ok"}
        assert st["ledgers"][0]["devices"][0]["in_use"] == 100 * MiB
        bad = {Path(e["path"]).name: e["error"] for e in st["errors"]}
        assert set(bad) == set(files) - {"ok.ledger"}, bad
        assert "symbolic link" in bad["link.ledger"] and "not a regular file" in bad["fifo.ledger"]
        assert "bytes, not" in bad["trunc.ledger"] and "bytes, not" in bad["grown.ledger"]
        assert "bad magic" in bad["garbage.ledger"]
        r = ct.cli("status", env=env, timeout=60)
        assert r.returncode == 0 and "trunc.ledger: unusable:" in r.stdout, r.stdout + r.stderr
        port = _free_port()
        metrics = subprocess.Popen(
            [sys.executable, "-m", "cudatrace", "metrics", "--listen", f"127.0.0.1:{port}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        text = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "cudatrace_ledger_errors" not in text:
            try:
                text = (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
                    .read()
                    .decode()
                )
            except OSError:
                time.sleep(0.2)
        assert "cudatrace_ledger_errors 6.0" in text, text[-2000:]
        ok = [
            line for line in text.splitlines() if line.startswith("cudatrace_budget_in_use_bytes{")
        ]
        assert len(ok) == 1 and 'group="ok"' in ok[0] and float(ok[0].split()[-1]) == 100 * MiB, ok
    finally:
        hold.terminate()
        hold.communicate(timeout=30)
        if metrics is not None:
            metrics.terminate()
            metrics.communicate(timeout=30)


AGENT = r"""
import json, sys
from pathlib import Path
from cudatrace.deploy.agent import Agent, Config

class NoNvml:
    available = False
    why = "not here"

base = Path(sys.argv[1])
(base / "groups.conf").write_text("")
cfg = Config(groups=base / "groups.conf", root=base / "root", state=base / "state",
             cdi_dir=base / "cdi", vendor="t.cudatrace.dev", interval=0.1, node="n1")
a = Agent(cfg, say=lambda line: print("SAY " + line, flush=True), nvml=NoNvml())
a.prepare()
for _ in sys.stdin:
    a.cycle()
    print("PASS " + json.dumps(a.published()), flush=True)
"""


def _agent_pass(agent: subprocess.Popen, ledgers: Path) -> tuple[dict, list[str]]:
    """One pass of the agent: what it published of this test's directory, and what it said."""
    assert agent.stdin and agent.stdout
    agent.stdin.write("\n")
    agent.stdin.flush()
    said = []
    for line in agent.stdout:
        if line.startswith("PASS "):
            pub = json.loads(line[5:])
            mine = [s for s in pub["ledgers"] if s["path"].startswith(str(ledgers))]
            errs = [e for e in pub["errors"] if e["path"].startswith(str(ledgers))]
            return {"ledgers": mine, "errors": errs}, said
        said.append(line.strip())
    raise AssertionError(
        f"the agent died (status {agent.wait()}): {agent.stderr.read() if agent.stderr else ''}"
    )


def test_the_node_agent_skips_a_damaged_ledger_and_says_so(sim, tmp_path):
    """The node agent reads every ledger its members map, through their mappings, pass after
    pass. Alice truncates, then grows her part under it: the agent lives on, says it skips
    her part, shows Bob's members of the group, and reads her part again when it can."""
    with tenants(sim) as t:
        env = t.env(budget="1GiB")
        alice = t.popen(ALICE, [t.prog("hold"), "1", "200m"], env)
        bob = t.popen(BOB, [t.prog("hold"), "1", "100m"], env)
        agent = subprocess.Popen(
            [sys.executable, "-c", AGENT, str(tmp_path)], env=dict(os.environ, PYTHONPATH=str(REPO)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_line(alice, "ready")
            wait_line(bob, "ready")
            pub, _ = _agent_pass(agent, t.ledgers)
            (first,) = pub["ledgers"]
            assert first["devices"][0]["in_use"] == 300 * MiB, first["devices"]
            for script in ('truncate -s 0 "$f"', 'truncate -s 1G "$f"'):
                assert _damage_all(t, ALICE, script) == []
                pub, said = _agent_pass(agent, t.ledgers)
                assert [e["path"] for e in pub["errors"]] == [str(t.part(ALICE))], pub["errors"]
                assert any(f"skipping the ledger {t.part(ALICE)}" in s for s in said), said
                (g,) = pub["ledgers"]
                assert [m["uid"] for m in g["members"]] == [BOB]
                assert g["devices"][0]["in_use"] == 100 * MiB
            assert bob.poll() is None, bob.communicate()
            # the group's two parts were published as one group
            assert {p["uid"] for p in first["parts"]} == {ALICE, BOB}
        finally:
            for p in (alice, bob):
                p.kill()
                p.communicate(timeout=30)
            if agent.stdin:
                agent.stdin.close()
            agent.wait(timeout=60)
        assert agent.returncode == 0, agent.stderr.read() if agent.stderr else ""


PLUGIN_TEST = r"""
import ctypes, os, time
cuda = ctypes.CDLL("libcuda.so.1")

def test_allocates_after_another_user_damaged_the_ledger():
    assert cuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    p = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(100 << 20)) == 0
    open(os.environ["FLAG"] + ".joined", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["FLAG"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(100 << 20)) == 0
    # 200 MiB of its own and Alice's 700 (her part's last figure): 300 MiB more is over 1 GiB
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(300 << 20)) == 2
"""


def test_the_pytest_plugin_survives_another_users_damage(sim, tmp_path):
    """pytest --cudatrace in a job's group (its process a member, as root): Alice truncates
    every ledger file she can while the test runs; the test's allocations go on, counted against the
    group with her last figure."""
    (tmp_path / "test_it.py").write_text(PLUGIN_TEST)
    with tenants(sim) as t:
        env = t.env(budget="1GiB")
        alice = t.popen(ALICE, [t.prog("hold"), "1", "700m"], env)
        flag = tmp_path / "damaged"
        run = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--cudatrace",
             str(tmp_path / "test_it.py")],
            cwd=tmp_path, env=env | {"FLAG": str(flag), "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            wait_line(alice, "ready")
            deadline = time.monotonic() + 120
            while not Path(str(flag) + ".joined").exists() and run.poll() is None:
                assert time.monotonic() < deadline, "the test never allocated"
                time.sleep(0.05)
            assert _damage_all(t, ALICE, 'truncate -s 0 "$f"') == []
            flag.touch()
            out, _ = run.communicate(timeout=120)
            assert run.returncode == 0, out
            assert "1 passed" in out, out
        finally:
            run.kill()
            alice.kill()
            alice.communicate(timeout=30)


def test_another_budget_beside_another_users_live_members_is_refused(sim):
    """The group rule across parts: Bob asking 2 GiB of a group whose Alice lives under 1 GiB
    is refused, naming her process and uid; asking her budget, he joins."""
    with tenants(sim) as t:
        alice = t.popen(ALICE, [t.prog("hold"), "1", "100m"], t.env(budget="1GiB"))
        try:
            wait_line(alice, "ready")
            bob = t.popen(BOB, [t.prog("hold"), "--exit-after-ms", "1", "1", "1m"],
                          t.env(budget="2GiB"))  # fmt: skip
            out, err = bob.communicate(timeout=30)
            assert "has a budget of 1.00 GiB on every device in other users' parts" in err, err
            assert f"(uid {ALICE}); this process asks for 2.00 GiB" in err, err
            assert "fencing cannot be set up" in err and bob.returncode != 0, err
            bob = t.popen(BOB, [t.prog("hold"), "--exit-after-ms", "1", "1", "1m"], t.env())
            out, err = bob.communicate(timeout=30)
            assert bob.returncode == 0, err
        finally:
            alice.kill()
            alice.communicate(timeout=30)


def test_a_launcher_never_waits_for_ever_on_a_lock(tmp_path, monkeypatch):
    """The launchers' group lock in a shared directory is each user's own: a file another user
    put at its name is refused, and one held longer than LOCK_WAIT_S is an error, not a wait
    for ever (it was 0666 and anyone's: holding it stopped every launcher of the group)."""
    import fcntl

    from cudatrace.record import ledger, run_ledger

    need_root()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(shared))
    path = ledger.group_path("g")
    lock = path.with_name(f"g@{os.geteuid()}.lock")
    lock.write_text("")
    os.chown(lock, ALICE, ALICE)
    with pytest.raises(ledger.LedgerError, match=f"not a lock file of yours \\(uid {ALICE}"):
        with run_ledger.GroupLock(path):
            pass
    lock.unlink()
    monkeypatch.setattr(run_ledger, "LOCK_WAIT_S", 0.3)
    with run_ledger.GroupLock(path):
        fd = os.open(lock, os.O_RDWR)  # another launcher, holding it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            pytest.fail("the lock was not held")
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        t0 = time.monotonic()
        with pytest.raises(ledger.LedgerError, match="has been locked for 0.3 s"):
            with run_ledger.GroupLock(path):
                pass
        assert time.monotonic() - t0 < 5
    finally:
        os.close(fd)


def test_a_program_that_closes_every_descriptor_still_reads_the_other_parts(sim):
    """closefds closes the preload library's descriptors of the shared directory and of Alice's
    part: the next reservation opens them again (Alice, gone meanwhile, no longer counts; her
    part's last figure would have refused the 300 MiB)."""
    with tenants(sim) as t:
        shutil.copy2(sim.progs["closefds"], t.pub / "closefds")
        (t.pub / "closefds").chmod(0o755)
        alice = t.popen(ALICE, [t.prog("hold"), "1", "600m"], t.env(budget="1GiB"))
        wait_line(alice, "ready")
        bob = t.popen(BOB, [t.prog("closefds"), "300m"], t.env(budget="1GiB"))
        try:
            wait_line(bob, "closed")
            alice.kill()
            alice.communicate(timeout=30)
            assert bob.stdin
            bob.stdin.write("go\n")
            bob.stdin.flush()
            out, err = bob.communicate(timeout=60)
            allocs = [line for line in out.splitlines() if line.startswith("alloc ")]
            assert len(allocs) == 1 and allocs[0].endswith(" 0"), (out, err)
        finally:
            alice.kill()
            bob.kill()
