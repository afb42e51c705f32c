"""The budget ledger (native/common/ledger.c) through its C harness and through cudatrace/record/ledger.py.

No GPU: the ledger is plain shared memory. tests/ledger/ledger_test.c hammers the C directly
(processes x threads against one limit, SIGKILLed members, pid reuse, refusals, fork, a full
ledger); the rest drives the same C through cffi as `cudatrace status` does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudatrace import native
from cudatrace.present.status import render_status
from cudatrace.record import budget, ledger, ledger_status
from cudatrace.record.ledger import Ledger, LedgerError
from support import children, ledger_harness
from support.paths import LEDGER_SOURCES, REPO

MiB = 1 << 20


@pytest.fixture(scope="module")
def tools():
    return native.tools()


@pytest.fixture
def ldir(tmp_path, monkeypatch):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    return d


# ---- the C harness ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    exe = tmp_path_factory.mktemp("ledger_harness") / "ledger_test"
    return ledger_harness.build(exe, "ledger_test", ledger_harness.PLAIN)


@pytest.mark.parametrize(
    "case", ["hammer", "kill", "reuse", "saturate", "security", "fork", "full", "adopt"]
)
def test_c_harness(harness, tmp_path, case):
    r = ledger_harness.run(harness, tmp_path, case, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("ok " + case) in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("source", [p.name for p in LEDGER_SOURCES])
def test_ledger_c_compiles_cleanly(tmp_path, source):
    """The flags of native/Makefile, warnings as errors, with and without -D_GNU_SOURCE."""
    cc = os.environ.get("CC", "cc")
    assert shutil.which(cc), f"no C compiler ({cc}): the suite needs one"
    for extra in (["-D_GNU_SOURCE"], [], ["-fvisibility=hidden", "-D_GNU_SOURCE", "-O0"]):
        r = subprocess.run(
            [
                cc,
                "-std=gnu11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fPIC",
                "-O2",
                *extra,
                "-I",
                str(REPO / "native/include"),
                "-c",
                str(REPO / "native/common" / source),
                "-o",
                str(tmp_path / "l.o"),
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr


# ---- layout ----------------------------------------------------------------------------------


def test_layout_agrees(tools):
    ffi, lib = tools
    c = native.constants()
    assert ffi.sizeof("struct ct_ledger_header") == c["CT_LEDGER_HEADER_SIZE"]
    assert ffi.sizeof("struct ct_ledger_member") == c["CT_LEDGER_MEMBER_SIZE"]
    assert c["CT_LEDGER_FILE_SIZE"] == (
        c["CT_LEDGER_HEADER_SIZE"] + c["CT_LEDGER_MAX_MEMBERS"] * c["CT_LEDGER_MEMBER_SIZE"]
    )
    assert c["CT_LEDGER_MAX_DEVICES"] == lib.CT_LEDGER_MAX_DEVICES
    assert int.from_bytes(b"CTLEDGR1", "little") == c["CT_LEDGER_MAGIC"]


# ---- accounting through Python ---------------------------------------------------------------


def make(ldir, name="g", limits=None, **kw) -> Ledger:
    return Ledger.create(
        ldir / (name + ".ledger"),
        limits if limits is not None else {0: 100 * MiB},
        group=name,
        **kw,
    )


def test_reserve_release(ldir):
    led = make(ldir, limits={0: 100 * MiB, 2: 10 * MiB})
    assert led.created
    assert oct(os.stat(led.path).st_mode & 0o777) == "0o600"
    with pytest.raises(LedgerError, match="not a member"):
        led.reserve(0, 1)
    led.join()
    assert led.reserve(0, 60 * MiB)
    assert not led.reserve(0, 41 * MiB)
    assert led.reserve(0, 40 * MiB)
    assert led.in_use(0) == 100 * MiB and led.held(0) == 100 * MiB
    assert not led.release(0, 150 * MiB)  # clamped at zero, never below
    assert led.in_use(0) == 0
    assert led.reserve(1, 1 << 40)  # no limit on device 1
    assert led.release(1, 1 << 40)
    assert not led.force(2, 11 * MiB)  # counted, but over
    assert led.in_use(2) == 11 * MiB
    assert led.limits() == {0: 100 * MiB, 2: 10 * MiB}
    led.set_limit(2, 20 * MiB)
    assert led.limit(2) == 20 * MiB
    with pytest.raises(LedgerError, match="device"):
        led.reserve(16, 1)
    snap = led.snapshot()
    (me,) = snap["members"]
    assert me["pid"] == os.getpid() and me["state"] == "alive"
    assert me["devices"][0]["denials"] == 1 and me["devices"][2]["over"] == 1
    assert {r["device"] for r in snap["devices"]} == {0, 1, 2}
    assert led.leave()
    assert led.in_use(2) == 0
    led.close()
    led.close()


def test_second_open_sees_same_ledger(ldir):
    a = make(ldir, limits={0: 10 * MiB}, on_exceed="warn", count_host=True)
    b = make(ldir, limits={0: 99 * MiB})  # exists: keeps the first settings
    assert a.created and not b.created
    assert b.limit(0) == 10 * MiB and b.on_exceed == "warn" and b.count_host
    a.join()
    a.reserve(0, 3 * MiB)
    assert b.in_use(0) == 3 * MiB


def test_reused_pid_does_not_inherit(ldir, tools):
    led = make(ldir)
    fake = Ledger.open(led.path)
    real = tools[1].ct_ledger_proc_start_ticks(os.getpid())
    assert real > 0
    fake.join(os.getpid(), real + 1)  # "our" pid, recorded for an older process
    assert fake.reserve(0, 70 * MiB)
    led.join()
    assert led.held(0) == 0
    states = {m["slot"]: m["state"] for m in led.snapshot()["members"]}
    assert states[fake.slot] == "dead" and states[led.slot] == "alive"
    assert led.reserve(0, 70 * MiB)  # the dead slot is reclaimed before a denial
    assert led.in_use(0) == 70 * MiB
    assert led.snapshot()["reclaimed"] == 1


def test_killed_member_gives_bytes_back(ldir, tools):
    led = make(ldir)
    p = children.popen(["sleep", "30"])
    try:
        deadline = time.time() + 5
        while tools[1].ct_ledger_proc_start_ticks(p.pid) == 0 and time.time() < deadline:
            time.sleep(0.01)
        member = Ledger.open(led.path)
        member.join(p.pid)  # stands in for the sleep process
        assert member.reserve(0, 80 * MiB)
        assert led.in_use(0) == 80 * MiB
        assert [m["state"] for m in led.snapshot()["members"]] == ["alive"]
        p.send_signal(signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 30  # a guard against a hang, not a speed claim
        while led.in_use(0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert led.in_use(0) == 0
        assert led.snapshot()["members"] == []
    finally:
        p.kill()
        p.wait()


# ---- refusals --------------------------------------------------------------------------------


def test_refuses_symlink(ldir):
    led = make(ldir)
    led.close()
    link = ldir / "link.ledger"
    link.symlink_to(ldir / "g.ledger")
    with pytest.raises(LedgerError, match="symbolic link"):
        Ledger.open(link)
    with pytest.raises(LedgerError, match="symbolic link"):
        Ledger.create(link)


def test_refuses_group_readable(ldir):
    make(ldir).close()
    os.chmod(ldir / "g.ledger", 0o644)
    with pytest.raises(LedgerError, match="group/other permissions"):
        Ledger.open(ldir / "g.ledger")


def test_refuses_wrong_magic_and_size(ldir, tools):
    bad = ldir / "bad.ledger"
    with open(bad, "wb") as f:
        f.write(b"X" * tools[1].CT_LEDGER_FILE_SIZE)
    os.chmod(bad, 0o600)
    with pytest.raises(LedgerError, match="bad magic"):
        Ledger.open(bad)
    short = ldir / "short.ledger"
    short.write_bytes(b"hello")
    os.chmod(short, 0o600)
    with pytest.raises(LedgerError, match="not a ledger"):
        Ledger.open(short)


def test_refuses_other_owner(ldir):
    assert os.geteuid() == 0, "needs root to chown (.ci/run runs as root)"
    make(ldir).close()
    os.chown(ldir / "g.ledger", 12345, 12345)
    with pytest.raises(LedgerError, match="owned by uid 12345"):
        Ledger.open(ldir / "g.ledger")


def test_missing_without_create(ldir):
    with pytest.raises(LedgerError, match="No such file"):
        Ledger.open(ldir / "none.ledger")


def test_ledger_dir_checks(tmp_path, monkeypatch):
    d = tmp_path / "new"
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    assert ledger.ledger_dir(create=False) == d and not d.exists()
    assert ledger.ledger_dir(create=True) == d
    assert (os.stat(d).st_mode & 0o777) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o755)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(loose))
    with pytest.raises(LedgerError, match="group/other permissions"):
        ledger.ledger_dir()
    link = tmp_path / "link"
    link.symlink_to(d)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(link))
    with pytest.raises(LedgerError, match="symbolic link"):
        ledger.ledger_dir(create=True)
    with pytest.raises(LedgerError, match="symbolic link"):
        ledger.group_path("g", create_dir=True)


def test_default_ledger_dir(monkeypatch):
    monkeypatch.delenv("CUDATRACE_LEDGER_DIR", raising=False)
    d = ledger.ledger_dir(create=True)
    uid = os.geteuid()
    if os.path.isdir("/dev/shm"):
        assert d == Path("/dev/shm/cudatrace-%d" % uid)
    else:
        assert d.name in ("cudatrace", "cudatrace-%d" % uid)


@pytest.mark.parametrize(
    "name,ok",
    [
        ("train", True),
        ("a", True),
        ("A-b_c.9", True),
        ("x" * 64, True),
        ("..", False),
        (".hidden", False),
        ("a.b", True),
        ("", False),
        ("x" * 65, False),
        ("a/b", False),
        ("a b", False),
        ("é", False),
        ("a\0b", False),
        ("@run-1", False),
        ("a:b", False),
    ],
)
def test_group_names(ldir, name, ok):
    assert ledger.valid_group(name) is ok
    if ok:
        assert ledger.group_path(name) == ldir / (name + ".ledger")
    else:
        with pytest.raises(LedgerError, match="invalid budget group name"):
            ledger.group_path(name)


# ---- status ----------------------------------------------------------------------------------


def test_status_empty(ldir):
    assert "no budgets in force" in render_status(ledger_status.status_json())
    assert ledger_status.status_json() == {"dir": str(ldir), "ledgers": [], "errors": []}


def test_status(ldir):
    led = make(ldir, "train", limits={0: 1 << 30, 1: 512 * MiB})
    led.join()
    led.reserve(0, 300 * MiB)
    assert not led.reserve(0, 1 << 30)
    (ldir / "broken.ledger").write_bytes(b"junk")
    os.chmod(ldir / "broken.ledger", 0o600)
    js = ledger_status.status_json()
    assert [s["group"] for s in js["ledgers"]] == ["train"]
    assert js["errors"] and "broken.ledger" in js["errors"][0]["path"]
    s = js["ledgers"][0]
    assert s["on_exceed"] == "fail" and s["devices"][0]["in_use"] == 300 * MiB
    assert s["devices"][0]["denials"] == 1
    text = render_status(ledger_status.status_json("train"))
    assert "group train" in text and "pid %d" % os.getpid() in text
    assert "1.00 GiB" in text and "300.0 MiB" in text and "512.0 MiB" in text
    assert "unusable" in render_status(ledger_status.status_json())
    with pytest.raises(LedgerError, match="no budget group 'nope'.*train"):
        render_status(ledger_status.status_json("nope"))
    with pytest.raises(LedgerError, match="invalid budget group name"):
        ledger_status.status_json("a/b")
    import json

    json.dumps(js)


# ---- what `cudatrace run` uses ---------------------------------------------------------------


def test_setup_ledger_private(ldir):
    run, info = budget.setup_ledger("0=1GiB,1=2GiB", None, "fail", False)
    assert run.private and run.path.parent == ldir and run.path.name.startswith("@run-")
    assert info["limits"] == {"0": 1 << 30, "1": 2 << 30} and info["on_exceed"] == "fail"
    assert "run of pid %d" % os.getpid() in render_status(ledger_status.status_json())
    assert run.summary()["devices"][0]["limit"] == 1 << 30
    run.finish()
    assert not run.path.exists()


def test_setup_ledger_group(ldir):
    run, info = budget.setup_ledger("1GiB", "team", "warn", True)
    assert info["created"] and info["on_exceed"] == "warn" and info["count_host"]
    assert len(info["limits"]) == budget.MAX_DEVICES
    # a member: another process (the launcher is a member while it decides, as itself)
    member = children.popen(
        [sys.executable, "-c", "import sys; from cudatrace.record.ledger import Ledger; "
         "led = Ledger.open(sys.argv[1]); led.join(); print('ready', flush=True); sys.stdin.read()",
         str(run.path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert children.readline(member).strip() == "ready"
    # in use: a different budget from a second run is refused, never silently replaced
    # or silently ignored (issue 11 #4)
    with pytest.raises(
        ledger.LedgerError,
        match=f"has a budget of 1.00 GiB on every device, in use by pids {member.pid}",
    ):
        budget.setup_ledger("2GiB", "team", "fail", False)
    assert Ledger.open(run.path).limit(0) == 1 << 30
    run2, info2 = budget.setup_ledger("1GiB", "team", "warn", True)  # the same: joins
    assert not info2["created"] and run2.ledger.limit(0) == 1 << 30
    # idle: the new run's budget replaces it, and says so
    member.communicate("", timeout=30)
    run3, info3 = budget.setup_ledger("0=3GiB", "team", "fail", False)
    assert info3["limits"] == {"0": 3 << 30} and info3["on_exceed"] == "fail"
    assert "no live member" in info3["note"]
    # no budget given: join the group as it is
    run4, info4 = budget.setup_ledger(None, "team", "fail", False)
    assert info4["limits"] == {"0": 3 << 30}
    for r in (run, run2, run3, run4):
        r.finish()
    assert run.path.exists()  # a group's ledger stays


def test_stale_private_ledgers_removed(ldir):
    p = children.popen(["true"])
    p.wait()
    stale = ledger.private_path(pid=p.pid)
    Ledger.create(stale, {0: 1}).close()
    run, _ = budget.setup_ledger("1GiB", None, "fail", False)
    assert not stale.exists()
    run.finish()


def test_concurrent_create(ldir):
    """Many processes creating one group at once: one creates it, all share it, none fails."""
    code = (
        "import sys; from cudatrace.record.ledger import Ledger; "
        "l = Ledger.create(sys.argv[1], {0: 5}); l.join(); "
        "print(int(l.created), l.limit(0), l.reserve(0, 5))"
    )
    path = ldir / "race.ledger"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        children.popen(
            [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(6)
    ]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(int(o[0]) for o in outs) == 1
    assert all(o[1] == "5" for o in outs)
    assert not [n for n in os.listdir(ldir) if n.endswith(".tmp")]
