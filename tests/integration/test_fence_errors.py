"""When fencing was asked for and cannot be set up (docs/budgets.md, "When fencing cannot be set
up"): every path refuses the process's CUDA (CUDATRACE_ON_FENCE_ERROR=refuse, the default) with
one line that says why and how to fix it, and never creates what would fence nobody (a ledger
directory of its own uid, a group without a budget); with =warn the process runs unfenced, and
`status` (text and --json), the metrics and the run summary show it. Each path used to run the
process with no budget at all ("budget NOT enforced" on stderr, or nothing)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from cudatrace import native
from cudatrace.errors import RUN_FAILED
from support import children

GiB = 1 << 30
NOT_PERMITTED = 800


@pytest.fixture
def box(ct, sim, tmp_path):
    """A ledger directory of our own and one shared simulated 8 GiB GPU."""
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env(state=sim.new_state(), total_bytes=8 * GiB)
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    env["LD_PRELOAD"] = str(native.shim_path())
    for k in [k for k in env if k.startswith("CUDATRACE_") and k not in ("CUDATRACE_LEDGER_DIR",)]:
        if k not in ("CUDATRACE_CACHE", "CUDATRACE_SIM_BUILDDIR"):
            del env[k]
    return {"dir": d, "env": env, "tmp": tmp_path}


def _hold(sim, env, *args):
    return sim.run("hold", "--exit-after-ms", "1", *(args or ("1", "1g")), env=env)


def _fence_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "fencing cannot be set up" in ln]


def assert_refused(r, *why):
    """cuInit (or the allocation) answered CUDA_ERROR_NOT_PERMITTED, with one line naming why."""
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert (
        f"# cuInit {NOT_PERMITTED}" in r.stdout
        or r.stdout.rstrip().endswith(f" {NOT_PERMITTED}\nready")
        or f" {NOT_PERMITTED}\n" in r.stdout
    ), r.stdout
    lines = _fence_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert "CUDA is refused in this process" in lines[0], lines[0]
    for w in why:
        assert w in lines[0], (w, lines[0])
    assert_clean(lines[0])


def assert_clean(line: str) -> None:
    """Every refusal line reads cleanly: one line, bounded, no stray or doubled punctuation (the
    257th member's read `...many.ledger; : all its member slots are taken`)."""
    assert "\n" not in line and len(line) < 1000, line
    for bad in ("; :", ": ;", ";;", ", ,", "  ", " ;", " ,", "::", "; ;", ": :"):
        assert bad not in line, (bad, line)
    assert not re.search(r"[;:,]$", line), line


def _setup(box, case):
    """The environment (and the state of the disk) of each way fencing can fail."""
    env, d, tmp = dict(box["env"]), box["dir"], box["tmp"]
    grp = {"CUDATRACE_GROUP": "g", "CUDATRACE_BUDGET": "2GiB"}
    if case == "dir missing":
        env.update(grp, CUDATRACE_LEDGER_DIR=str(tmp / "run" / "cudatrace"))
    elif case == "dir too open":
        d.chmod(0o777)
        env.update(grp)
    elif case == "dir of another user":
        os.chown(d, 65534, 65534)
        env.update(grp)
    elif case == "group without budget":
        env.update(CUDATRACE_GROUP="g")
    elif case == "budget as a share":
        env.update(CUDATRACE_GROUP="g", CUDATRACE_BUDGET="60%")
    elif case == "budget without unit":
        env.update(CUDATRACE_GROUP="g", CUDATRACE_BUDGET="12")
    elif case == "budget malformed":
        env.update(CUDATRACE_GROUP="g", CUDATRACE_BUDGET="lots")
    elif case == "budget without group":
        env.update(CUDATRACE_BUDGET="2GiB")
    elif case == "share without its budget":
        env.update(grp, CUDATRACE_SHARE="41")
    elif case == "ledger damaged":
        (d / "g.ledger").write_bytes(b"not a ledger")
        (d / "g.ledger").chmod(0o600)
        env.update(grp)
    elif case == "launcher ledger missing":
        env.update(CUDATRACE_LEDGER=str(d / "@run-1-0.ledger"))
    elif case == "integration failed":
        env.update(CUDATRACE_FENCE_ERROR="the node agent found no GPU group for this pod")
    elif case in BOGUS:
        env.update(grp, **{BOGUS[case]: "bogus"})
    elif case == "long group":
        env.update(CUDATRACE_GROUP="g" * 8190, CUDATRACE_BUDGET="2GiB")
    elif case == "long ledger dir":
        env.update(grp, CUDATRACE_LEDGER_DIR="/" + "d" * 8189)
    elif case == "long share":
        env.update(grp, CUDATRACE_SHARE="s" * 8190, CUDATRACE_SHARE_BUDGET="1GiB")
    elif case == "shared dir not made for ledgers":
        d.chmod(0o1777)  # root's and sticky, as /tmp is: no longer a ledger directory by itself
        env.update(grp)
    return env


BOGUS = {  # the settings that touch the fence and take a few values (CUDATRACE_ON_EXCEED=bogus
    # was taken as fail without a word)
    "on-exceed bogus": "CUDATRACE_ON_EXCEED",
    "on-fence-error bogus": "CUDATRACE_ON_FENCE_ERROR",
    "ledger-dir-make bogus": "CUDATRACE_LEDGER_DIR_MAKE",
    "count-host bogus": "CUDATRACE_COUNT_HOST",
    "count-contexts bogus": "CUDATRACE_COUNT_CONTEXTS",
}


CASES = {
    "dir missing": ("does not exist", "make it at boot"),
    "dir too open": ("group/other permissions",),
    "dir of another user": ("owned by uid 65534",),
    "group without budget": ("group g does not exist, and this process names no budget",),
    "budget as a share": ("CUDATRACE_BUDGET", "resolved by cudatrace run or the integration"),
    "budget without unit": ("CUDATRACE_BUDGET", "has no unit", "write 12GiB"),
    "budget malformed": ("CUDATRACE_BUDGET", "'lots' is not a size"),
    "budget without group": ("CUDATRACE_BUDGET is set, but no CUDATRACE_GROUP",),
    "share without its budget": ("CUDATRACE_SHARE and CUDATRACE_SHARE_BUDGET go together",),
    "ledger damaged": ("unusable", "g.ledger"),
    "launcher ledger missing": ("unusable", "No such file"),
    "integration failed": ("the node agent found no GPU group for this pod",),
    "on-exceed bogus": ("CUDATRACE_ON_EXCEED='bogus' is not fail, warn or abort",),
    "on-fence-error bogus": ("CUDATRACE_ON_FENCE_ERROR='bogus' is not refuse or warn",),
    "ledger-dir-make bogus": ("CUDATRACE_LEDGER_DIR_MAKE='bogus' is not 0 or 1",),
    "count-host bogus": ("CUDATRACE_COUNT_HOST='bogus' is not -1, 0 or 1",),
    "count-contexts bogus": ("CUDATRACE_COUNT_CONTEXTS='bogus' is not 0 or 1",),
    "long group": ("CUDATRACE_GROUP='gggggggg", "...' (8190 bytes) is not a group name"),
    "long ledger dir": ("is longer than a path may be",),
    "long share": ("CUDATRACE_SHARE='sssss", "(8190 bytes) is not a share name"),
    "shared dir not made for ledgers": ("is a shared one", "no root's .cudatrace-shared"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fencing_that_cannot_be_set_up_refuses_cuda(sim, box, case):
    if os.geteuid() != 0 and case == "dir of another user":
        pytest.fail("a directory of another uid needs root (CI runs as root)")
    env = _setup(box, case)
    r = _hold(sim, env)
    assert_refused(r, *CASES[case])
    # nothing that would fence no one was made: no directory of this uid alone, no group
    # without a budget
    assert not (box["tmp"] / "run").exists()
    if case == "group without budget":
        assert not (box["dir"] / "g.ledger").exists()


def test_a_long_setting_never_drops_the_fence(sim, box):
    """One 8,190-byte CUDATRACE_HINTS (any long setting) filled the preload library's settings
    pool, and the group, budget and on-fence-error read after it were dropped as if unset: the
    process ran unfenced, in silence. Every setting is kept now, however long the others."""
    env = _setup(box, "dir too open")
    box["dir"].chmod(0o700)
    for name in ("CUDATRACE_HINTS", "CUDATRACE_FRAMEWORKS", "CUDATRACE_HOST"):
        e = dict(env, **{name: "/" + "h" * 8189})
        r = _hold(sim, e, "2", "1500m")
        allocs = [ln.split()[4] for ln in r.stdout.splitlines() if ln.startswith("alloc ")]
        assert allocs == ["0", "2"], (name, r.stdout, r.stderr)
        assert "budget exceeded" in r.stderr and "budget 2.00 GiB" in r.stderr, r.stderr


def test_a_shell_in_the_same_environment_says_nothing(sim, box):
    """The line comes at the first CUDA call that needs the budget: a shell or helper that never
    calls CUDA runs as before, silently."""
    env = _setup(box, "budget without group")
    r = subprocess.run(["sh", "-c", "echo hi"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == "hi\n" and not _fence_lines(r.stderr), r.stderr


def test_the_257th_member_is_refused(sim, box):
    """256 live members fill a ledger; the next process is refused (its allocation answers
    NOT_PERMITTED), where it used to run unfenced and uncounted."""
    env = dict(box["env"], CUDATRACE_GROUP="g", CUDATRACE_BUDGET="300MiB")
    path = box["dir"] / "g.ledger"
    filler = children.popen(
        [sys.executable, "-c", FILL, str(path)],
        env=env | {"LD_PRELOAD": ""},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert children.readline(filler).strip() == "ready 256"
        r = _hold(sim, env, "1", "1m")
        assert_refused(r, f"cannot join the budget ledger {path}: all its member slots are taken")
        assert f"alloc cuMemAlloc_v2 1048576 0x0 {NOT_PERMITTED}" in r.stdout, r.stdout
    finally:
        filler.communicate("", timeout=60)


FILL = r"""
import os, signal, sys
from cudatrace.record.ledger import Ledger
led = Ledger.create(sys.argv[1], {d: 300 << 20 for d in range(16)}, group="g")
r, w = os.pipe()
kids = []
for i in range(256):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        led.join()
        os.write(w, b"y")
        signal.pause()
    kids.append(pid)
os.close(w)
n = sum(len(os.read(r, 1)) for _ in range(256))
print("ready", n, flush=True)
sys.stdin.read()
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
"""


# ---- warn: unfenced, and visible -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(ct, env) -> str:
    port = _free_port()
    p = children.popen(
        [sys.executable, "-m", "cudatrace", "metrics", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as u:
                    return u.read().decode()
            except OSError:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise
                time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=30)


def _metric(text: str, name: str, gpu: str = "0") -> float:
    m = re.search(rf'^{name}{{gpu="{gpu}"}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


def test_warn_runs_unfenced_and_status_and_metrics_show_it(ct, sim, box):
    env = dict(_setup(box, "dir missing"), CUDATRACE_ON_FENCE_ERROR="warn")
    fenced = dict(box["env"], CUDATRACE_GROUP="g", CUDATRACE_BUDGET="4GiB")
    plain = {k: v for k, v in box["env"].items() if k != "LD_PRELOAD"}
    holders = []
    try:
        for e in (env, fenced):
            p = children.popen([str(sim.progs["hold"]), "1", "1g"], env=e,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            holders.append(p)
            assert children.readline(p).startswith("alloc cuMemAlloc_v2 1073741824 0x")
            assert children.readline(p).strip() == "ready"
        st = json.loads(ct.cli("status", "--json", env=plain).stdout)
        unf = st["unfenced"]
        assert unf["known"] and [(x["pid"], x["bytes"]) for x in unf["processes"]] == [
            (holders[0].pid, GiB)
        ], unf  # the fenced one is a member of g, the other of no ledger
        text = ct.cli("status", env=plain).stdout
        assert "UNFENCED: 1 process" in text and f"pid {holders[0].pid}" in text, text
        scraped = _scrape(ct, plain)
        assert _metric(scraped, "cudatrace_unfenced_processes") == 1
        assert _metric(scraped, "cudatrace_unfenced_bytes") == GiB
    finally:
        for p in holders:
            p.terminate()
        errs = [p.communicate(timeout=30)[1] for p in holders]
    lines = _fence_lines(errs[0])
    assert len(lines) == 1 and "this process runs UNFENCED" in lines[0], errs[0]
    assert not _fence_lines(errs[1]), errs[1]


@pytest.mark.parametrize("mode", ["refuse", "warn"])
def test_the_run_summary_names_a_process_fencing_missed(ct, sim, box, mode):
    """Under `cudatrace run` (tracing only), a child whose own fencing cannot be set up is named
    in the run's summary: refused, or run unfenced."""
    env = dict(_setup(box, "group without budget"), CUDATRACE_ON_FENCE_ERROR=mode)
    del env["LD_PRELOAD"]  # the launcher preloads it
    r = ct.run([sim.progs["hold"], "--exit-after-ms", "1", "1", "1m"], env=env)
    verdict = "CUDA refused" if mode == "refuse" else "ran UNFENCED"
    summary = [ln for ln in r.stderr.splitlines() if "fencing could not be set up" in ln]
    assert len(summary) == 1 and verdict in summary[0], r.stderr
    assert "group g does not exist, and this process names no budget" in summary[0]
    assert r.returncode == (1 if mode == "refuse" else 0), r.stderr


# ---- the group rule: one for the launcher and the environment ------------------------------------


def _holder(sim, env, n="1", size="1g"):
    p = children.popen([str(sim.progs["hold"]), n, size], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    out = []
    while True:
        line = children.readline(p)
        out.append(line)
        if not line or line.strip() == "ready":
            return p, "".join(out)


def test_a_budget_less_creator_cannot_open_the_fence(ct, sim, box):
    """A process naming no budget cannot make the group; the first with a budget makes it, and
    holds others to it: 1 GiB, the second GiB denied (it used to make the group unlimited, and
    budgeted processes then joined it unfenced)."""
    env = box["env"]
    assert_refused(_hold(sim, dict(env, CUDATRACE_GROUP="g")), "names no budget")
    r = _hold(sim, dict(env, CUDATRACE_GROUP="g", CUDATRACE_BUDGET="1GiB"), "2", "1g")
    assert r.returncode == 1 and "budget 1.00 GiB, in use 1.00 GiB" in r.stderr, r.stderr
    r = _hold(sim, dict(env, CUDATRACE_GROUP="g"), "2", "1g")  # no budget of its own: the group's
    assert r.returncode == 1 and "budget 1.00 GiB, in use 1.00 GiB" in r.stderr, r.stderr


def test_a_live_groups_budget_is_kept_and_an_idle_ones_replaced(ct, sim, box):
    env = dict(box["env"], CUDATRACE_GROUP="g")
    a, _ = _holder(sim, dict(env, CUDATRACE_BUDGET="2GiB"))
    try:
        # another budget while the group has a live member: refused (it used to join, warned,
        # under the group's budget)
        r = _hold(sim, dict(env, CUDATRACE_BUDGET="4GiB"))
        assert_refused(r, "group g has a budget of 2.00 GiB on every device",
                       f"in use by pids {a.pid}", "asks for 4.00 GiB")  # fmt: skip
        # the launcher's side of the same rule: exit 2, the group's budget untouched
        lr = ct.run([sim.progs["hold"], "--exit-after-ms", "1", "1", "1m"], "-q", "--group", "g",
                    "--budget", "4GiB", env={k: v for k, v in env.items() if k != "LD_PRELOAD"}
                    | {"CUDATRACE_GROUP": ""})  # fmt: skip
        assert lr.returncode == RUN_FAILED and "has a budget of 2.00 GiB" in lr.stderr, lr.stderr
    finally:
        a.terminate()
        a.communicate(timeout=30)
    # no live member: the next process with a budget replaces it, and says so
    r = _hold(sim, dict(env, CUDATRACE_BUDGET="4GiB"), "3", "1g")
    assert r.returncode == 0, r.stderr
    assert "had a budget of 2.00 GiB on every device and no live member; it is now 4.00 GiB" in (
        r.stderr
    ), r.stderr


def test_the_launchers_group_is_the_environments(ct, sim, box):
    """A group a launcher made with a budget, a member of it live: a process from the
    environment asking another budget is refused; one asking the same joins and is held to it."""
    env = {k: v for k, v in box["env"].items() if k != "LD_PRELOAD"}
    p = children.popen(
        [sys.executable, "-m", "cudatrace", "run", "-q", "--no-trace", "--group", "g", "--budget",
         "3GiB", "--", str(sim.progs["hold"]), "1", "1g"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while children.readline(p).strip() != "ready":
            assert p.poll() is None, children.said(p)
        envp = dict(box["env"], CUDATRACE_GROUP="g")
        assert_refused(_hold(sim, dict(envp, CUDATRACE_BUDGET="1GiB")), "has a budget of 3.00 GiB")
        r = _hold(sim, dict(envp, CUDATRACE_BUDGET="3GiB"), "3", "1g")
        assert r.returncode == 1 and "budget 3.00 GiB, in use 3.00 GiB" in r.stderr, r.stderr
    finally:
        p.terminate()
        p.communicate(timeout=30)


def test_trace_directory_is_made_when_missing(ct, sim, box, tmp_path):
    """CUDATRACE_DIR set by hand to a folder that does not exist yet: it is made (0700), and the
    process traced, where it used to go on untraced."""
    env = {k: v for k, v in box["env"].items()}
    d = tmp_path / "new" / "traces"
    env["CUDATRACE_DIR"] = str(d)
    r = _hold(sim, env, "1", "1m")
    assert r.returncode == 0, r.stderr
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    assert [f.name for f in d.iterdir() if f.name.endswith(".ctrace")], list(d.iterdir())
