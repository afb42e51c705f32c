"""`cudatrace run` and `demo` given bad input, signals and a killed launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cudatrace.analyze.read.trace import read_dir
from cudatrace.errors import RUN_FAILED
from support import children


def no_traceback(r):
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("cudatrace: ") or "\ncudatrace: " in r.stderr, r.stderr


# ---- #5: clear errors, no tracebacks ----------------------------------------------------------


def test_script_without_shebang(ct, tmp_path):
    s = tmp_path / "script"
    s.write_text("echo hi\n")
    s.chmod(0o755)
    out = tmp_path / "o"
    r = ct.run([s], out=out)
    no_traceback(r)
    assert r.returncode == 126
    assert "#!" in r.stderr
    assert not out.exists()  # nothing half-made left behind


def test_seven_byte_elf(ct, tmp_path):
    s = tmp_path / "tiny"
    s.write_bytes(b"\x7fELF\x02\x01\x01")
    s.chmod(0o755)
    r = ct.run([s], out=tmp_path / "o")
    no_traceback(r)
    assert r.returncode == 126
    assert "ELF" in r.stderr


def test_output_under_a_file(ct, sim, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = ct.run([sim.progs["route_link"]], out=f / "sub")
    no_traceback(r)
    assert r.returncode == RUN_FAILED
    assert "afile" in r.stderr


@pytest.fixture
def readonly_dir(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("needs root to mount a read-only tmpfs (root ignores permission bits)")
    d = tmp_path / "ro"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_unwritable_output_and_cwd(ct, sim, readonly_dir):
    r = ct.run([sim.progs["route_link"]], out=readonly_dir / "t")
    no_traceback(r)
    assert r.returncode == RUN_FAILED
    r = ct.cli("run", "--", sim.progs["route_link"], cwd=readonly_dir)
    no_traceback(r)
    assert r.returncode == RUN_FAILED


def test_demo_output_is_a_file(ct, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = ct.cli("demo", "--simulated", "-o", f)
    no_traceback(r)
    assert r.returncode == 2


# ---- #8: planted links --------------------------------------------------------------------------


@pytest.mark.parametrize("force", [False, True])
def test_planted_links_are_never_followed(ct, sim, tmp_path, force):
    out = tmp_path / "shared"
    out.mkdir()
    victims = [tmp_path / "victim-run", tmp_path / "victim-samples"]
    (out / "run.json").symlink_to(victims[0])
    (out / "samples.jsonl").symlink_to(victims[1])
    r = ct.run([sim.progs["route_link"]], *(["--force"] if force else []), out=out)
    assert "Traceback" not in r.stderr
    assert not any(v.exists() for v in victims)
    if r.returncode == 0:
        assert not (out / "run.json").is_symlink()
        assert (out / "run.json").stat().st_mode & 0o077 == 0  # private by default


# ---- #6 #7: signals -------------------------------------------------------------------------------

TRAP_C = r"""
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <time.h>
static volatile sig_atomic_t got[65];
static void on(int s) { got[s]++; }
int main(int argc, char **argv)
{
    int sigs[] = {SIGTERM, SIGUSR2, SIGINT};
    for (int i = 0; i < 3; i++)
        signal(sigs[i], on);
    FILE *f = fopen(argv[1], "w");
    fputs("ready", f);
    fclose(f);
    int n = 0;
    for (int t = 0; t < 300 && !n; t++) {
        usleep(10000);
        n = got[SIGTERM] + got[SIGUSR2] + got[SIGINT];
    }
    usleep(500000); /* a second copy of the signal would arrive now */
    n = got[SIGTERM] + got[SIGUSR2] + got[SIGINT];
    fprintf(stderr, "got TERM %d USR2 %d INT %d\n", got[SIGTERM], got[SIGUSR2], got[SIGINT]);
    return 10 + n;
}
"""


def start_trapped(ct, tmp_path, *opts):
    src = tmp_path / "trap.c"
    src.write_text(TRAP_C)
    prog = tmp_path / "trap"
    subprocess.run(["cc", "-O1", "-o", prog, src], check=True)
    ready = tmp_path / "ready"
    p = children.popen(
        [sys.executable, "-m", "cudatrace", "run", "-o", tmp_path / "t", *opts, "--", prog, ready],
        env=ct.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    for _ in range(400):
        if ready.exists():
            break
        time.sleep(0.025)
    assert ready.exists()
    return p


def test_sigusr2_is_forwarded_not_a_budget_abort(ct, tmp_path):
    p = start_trapped(ct, tmp_path)
    os.kill(p.pid, signal.SIGUSR2)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 11, err
    assert "USR2 1" in err
    import json

    run = json.loads((tmp_path / "t" / "run.json").read_text())
    assert run["budget_aborted"] is False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_group_signal_reaches_the_command_once(ct, tmp_path, sig):
    p = start_trapped(ct, tmp_path)
    # off a terminal, CMD has a process group of its own, so a signal to the launcher's group
    # cannot reach it directly as well as forwarded (whether two copies of a signal are seen
    # twice or merged by the kernel depends on timing: the group is what decides)
    kids = open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()
    child = int(kids[0])
    pgrp = int(open("/proc/%d/stat" % child).read().rsplit(")", 1)[1].split()[2])
    assert pgrp != os.getpgid(p.pid)
    os.killpg(p.pid, sig)  # the launcher leads its own session and group here
    out, err = p.communicate(timeout=30)
    assert p.returncode == 11, err


# ---- #19: SIGKILL of the launcher -------------------------------------------------------------------


def test_killed_launcher_takes_the_command_with_it(ct, sim, tmp_path):
    hold = sim.progs["hold"]
    out = tmp_path / "t"
    p = children.popen(
        [sys.executable, "-m", "cudatrace", "run", "-o", out, "--", hold, "1", "1m"],
        env=ct.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.time() + 30
    child = None
    while time.time() < deadline and child is None:
        try:
            kids = open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()
            child = int(kids[0]) if kids else None
        except OSError:
            pass
        time.sleep(0.05)
    assert child
    time.sleep(0.5)
    p.kill()
    p.wait()
    for _ in range(100):
        if (
            not os.path.exists("/proc/%d" % child)
            or open("/proc/%d/stat" % child).read().split(")")[-1].split()[0] == "Z"
        ):
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the command outlived its killed launcher")
    td = read_dir(out)
    assert td.traces and not td.errors
    assert td.traces[0].complete  # SIGTERM: the command ended cleanly, END written


# ---- #14: output paths longer than the shim holds -----------------------------------------------


def test_output_path_too_long_for_the_shim_is_refused(ct, sim, tmp_path):
    deep = tmp_path
    while len(str(deep)) < 1150:
        deep = deep / ("d" * 200)
    r = ct.run([sim.progs["route_link"]], out=deep)
    no_traceback(r)
    assert r.returncode == RUN_FAILED, r.stderr
    assert "shorter" in r.stderr


# ---- #16: processes that end with _exit ------------------------------------------------------------


def test_exit_by_underscore_exit_is_not_called_a_crash(ct, sim, tmp_path):
    # dash ends `sh -c` with _exit; the shim notes it, so the file is complete with its status
    r = ct.run(["/bin/sh", "-c", '"$0" 0; exit 3', sim.progs["route_link"]])
    assert r.returncode == 3, r.stderr
    td = read_dir(r.out)
    sh = [t for t in td.traces if t.exe.endswith("dash") or t.exe.endswith("sh")]
    assert sh, [t.exe for t in td.traces]
    assert sh[0].complete and sh[0].end.exit_code == 3, sh[0].describe()
    assert "without a clean exit record" not in r.stderr, r.stderr


# ---- rough edge: traces and run.json hold argv and cwd: private unless asked ----------------------


def test_trace_files_are_private_unless_asked(ct, sim, tmp_path):
    r = ct.run([sim.progs["route_link"]])
    assert r.returncode == 0, r.stderr
    for p in list(r.out.glob("*.ctrace")) + [r.out / "run.json", r.out / "samples.jsonl"]:
        assert p.stat().st_mode & 0o777 == 0o600, (p, oct(p.stat().st_mode))
    env = ct.env()
    env["CUDATRACE_FILE_MODE"] = "0644"
    r = ct.run([sim.progs["route_link"]], env=env)
    for p in list(r.out.glob("*.ctrace")) + [r.out / "run.json"]:
        assert p.stat().st_mode & 0o777 == 0o644 & ~_umask(), p


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_outlive_launcher_when_asked(ct, sim, tmp_path):
    hold = sim.progs["hold"]
    p = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-o",
            tmp_path / "t",
            "--outlive-launcher",
            "--",
            hold,
            "--exit-after-ms",
            "3000",
            "1",
            "1m",
        ],
        env=ct.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    child = None
    for _ in range(400):
        try:
            kids = open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()
            child = int(kids[0]) if kids else None
        except OSError:
            pass
        if child:
            break
        time.sleep(0.025)
    assert child
    time.sleep(0.3)
    p.kill()
    p.wait()
    time.sleep(0.5)
    alive = (
        os.path.exists("/proc/%d" % child)
        and open("/proc/%d/stat" % child).read().split(")")[-1].split()[0] != "Z"
    )
    if alive:
        os.kill(child, signal.SIGKILL)
    assert alive
