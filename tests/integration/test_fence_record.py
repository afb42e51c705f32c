"""The sealed fence record (docs/budgets.md, "The sealed fence"), read by the preload library where
the workload cannot write it: /etc/cudatrace/fence (a container's, mounted read-only) and
/run/cudatrace/jobs/<job> (a Slurm job's). Each test runs its processes in a private mount
namespace (tests/support/sealroot.py) as one of two ordinary uids, on a simulated 8 GiB GPU.

- the record fences a process whose environment says nothing, and the environment may only
  lower it: a larger CUDATRACE_BUDGET (it took 4 GiB of a 1 GiB container), another
  CUDATRACE_GROUP with CUDATRACE_LEDGER_DIR=/tmp (4 GiB of team-a's 1 GiB), on-exceed warn,
  on-fence-error warn, contexts off, cudatrace_exempt(): each ignored with one line, the budget
  held; a lower CUDATRACE_BUDGET is honoured;
- every malformed or untrusted record refuses CUDA with one clean line (the parser's cases);
- Slurm's records: the job of the process's cgroup, else SLURM_JOB_ID's when the record is its
  uid's, else the strictest of its uid's; another user's record is refused."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cudatrace import fence_record, native
from cudatrace.fence_record import FenceRecord
from support import sealroot
from support.fence_cases import MALFORMED

GiB = 1 << 30
USERS = (65534, 65533)  # two ordinary uids (no name needed: setpriv takes numbers)
NOT_PERMITTED = 800


@pytest.fixture
def box(ct, sim):
    """A world-readable copy of the preload library, the simulated driver and the programs, a
    simulated 8 GiB GPU every uid may use, a ledger directory root made for the fences
    (mode 1777, as `cudatrace cdi` makes a group's) and a folder of records (root's)."""
    sealroot.need_root()
    base = Path(tempfile.mkdtemp(prefix="ct-fence-"))
    base.chmod(0o755)
    pub, ledgers, records = base / "pub", base / "ledgers", base / "records"
    for d in (pub, records):
        d.mkdir(mode=0o755)
    ledgers.mkdir()
    ledgers.chmod(0o1777)
    for f in sim.lib.iterdir():
        shutil.copy2(f, pub / f.name, follow_symlinks=True)
    for prog in ("hold", "meminfo"):
        shutil.copy2(sim.progs[prog], pub / prog)
    shutil.copy2(native.shim_path(), pub / "libcudatrace.so")
    for f in pub.iterdir():
        f.chmod(0o755)
    state = base / "gpu"
    env = ct.env(total_bytes=8 * GiB)
    env = {k: v for k, v in env.items() if not k.startswith("CUDATRACE_")}
    env.update(CUDASIM_STATE=str(state), LD_LIBRARY_PATH=str(pub),
               LD_PRELOAD=str(pub / "libcudatrace.so"))  # fmt: skip
    sim.run("simstat", env=env, check=True)
    state.chmod(0o666)
    n = [0]

    def record(rec: FenceRecord | str, mode: int = 0o644, owner: int = 0) -> Path:
        n[0] += 1
        p = records / f"fence-{n[0]}"
        p.write_text(rec if isinstance(rec, str) else fence_record.render(rec).text)
        os.chown(p, owner, owner)
        p.chmod(mode)
        return p

    def run(cmd, fence=None, jobs=None, user=USERS[0], env_add=None, read_only=True, **kw):
        e = dict(env, **(env_add or {}))
        n[0] += 1
        argv = sealroot.prefix(base / f"ns-{n[0]}", fence=fence, jobs=jobs, user=user,
                               read_only=read_only)  # fmt: skip
        return subprocess.run([*argv, *map(str, cmd)], env=e, capture_output=True, text=True,
                              timeout=60, **kw)  # fmt: skip

    yield {"base": base, "pub": pub, "ledgers": ledgers, "records": records, "state": state,
           "env": env, "record": record, "run": run, "sim": sim}  # fmt: skip
    shutil.rmtree(base, ignore_errors=True)


def team(box, **kw) -> FenceRecord:
    """A container group's record: team-a, 1 GiB."""
    args = {"group": "team-a", "budget": str(GiB), "ledger_dir": str(box["ledgers"]),
            "on_exceed": "fail", "on_fence_error": "refuse", "owner": "cdi group team-a"}  # fmt: skip
    args.update(kw)
    return FenceRecord(**args)


def hold(box, n, size, *more):
    return [box["pub"] / "hold", "--exit-after-ms", "1", *more, n, size]


def allocs(out: str) -> list[str]:
    return [ln.split()[4] for ln in out.splitlines() if ln.startswith("alloc ")]


def sealed_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if "the sealed fence" in ln]


def fence_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if "fencing cannot be set up" in ln]


def clean(line: str) -> None:
    """A line that reads cleanly: one line, no doubled or stray punctuation, not cut."""
    assert "\n" not in line and len(line) < 1000, line
    for bad in ("; :", ": ;", ";;", ", ,", "  ", " ;", " ,", "::", "; ;"):
        assert bad not in line, (bad, line)
    assert not re.search(r"[;:,]$", line), line


# ---- the record fences; the environment only lowers it ---------------------------------------


def test_the_record_fences_a_process_whose_environment_says_nothing(box):
    r = box["run"](hold(box, 3, "400m"), fence=box["record"](team(box)))
    assert allocs(r.stdout) == ["0", "0", "2"], (r.stdout, r.stderr)
    assert "budget exceeded" in r.stderr and "budget 1.00 GiB, in use 800.00 MiB" in r.stderr
    assert list(box["ledgers"].glob("team-a@*.ledger"))  # its uid's part of the group
    assert not sealed_lines(r.stderr), r.stderr


@pytest.mark.parametrize("user", USERS)
def test_a_larger_budget_in_the_environment_is_ignored_with_a_line(box, user):
    """The container attack: `sh -c 'CUDATRACE_BUDGET=8589934592 prog'` took 4 GiB of a 1 GiB
    fence (the first process made the group with its own budget)."""
    fence = box["record"](team(box, group="container"))
    r = box["run"](["sh", "-c", f"CUDATRACE_BUDGET=8589934592 exec {box['pub']}/hold "
                    "--exit-after-ms 1 4 1g"], fence=fence, user=user)  # fmt: skip
    assert allocs(r.stdout) == ["0", "2", "2", "2"], (r.stdout, r.stderr)
    (line,) = sealed_lines(r.stderr)
    assert "CUDATRACE_BUDGET='8589934592' (not below the fence)" in line, line
    assert "/etc/cudatrace/fence" in line
    clean(line)
    assert box["sim"].stats(box["state"])[0]["hwm"] <= GiB


def test_another_group_and_ledger_dir_are_ignored(box):
    """The group attack: CUDATRACE_GROUP=mine CUDATRACE_LEDGER_DIR=/tmp took 4 GiB of team-a's
    1 GiB (any sticky root's directory was a ledger directory)."""
    mine = f"mine-{os.urandom(4).hex()}"
    r = box["run"](hold(box, 4, "1g"), fence=box["record"](team(box)),
                   env_add={"CUDATRACE_GROUP": mine, "CUDATRACE_LEDGER_DIR": "/tmp",
                            "CUDATRACE_BUDGET": "8GiB"})  # fmt: skip
    assert allocs(r.stdout) == ["0", "2", "2", "2"], (r.stdout, r.stderr)
    (line,) = sealed_lines(r.stderr)
    for said in (
        f"CUDATRACE_GROUP='{mine}'",
        "CUDATRACE_LEDGER_DIR='/tmp'",
        "CUDATRACE_BUDGET='8GiB'",
    ):
        assert said in line, line
    clean(line)
    assert not Path(f"/tmp/{mine}.ledger").exists()
    assert list(box["ledgers"].glob("team-a@*.ledger"))  # its uid's part of the group


def test_settings_that_would_loosen_the_fence_are_ignored(box):
    loosen = {"CUDATRACE_ON_EXCEED": "warn", "CUDATRACE_ON_FENCE_ERROR": "warn",
              "CUDATRACE_COUNT_CONTEXTS": "0", "CUDATRACE_COUNT_HOST": "-1",
              "CUDATRACE_LEDGER_DIR_MAKE": "1", "CUDATRACE_SHARE": "x",
              "CUDATRACE_FENCE_ERROR": "no", "CUDATRACE_LEDGER": "/tmp/l.ledger",
              "CUDATRACE_MODE": "none"}  # fmt: skip
    r = box["run"](hold(box, 3, "400m"), fence=box["record"](team(box)), env_add=loosen)
    assert allocs(r.stdout) == ["0", "0", "2"], (r.stdout, r.stderr)
    (line,) = sealed_lines(r.stderr)
    for k in loosen:
        if k != "CUDATRACE_MODE":  # tracing is the process's own business, not the fence's
            assert k in line, (k, line)
    assert "CUDATRACE_MODE" not in line
    assert "allowed (--on-exceed warn)" not in r.stderr
    clean(line)


def test_a_lower_budget_in_the_environment_is_honoured(box):
    r = box["run"](hold(box, 3, "400m"), fence=box["record"](team(box)),
                   env_add={"CUDATRACE_BUDGET": "500MiB"})  # fmt: skip
    assert allocs(r.stdout) == ["0", "2", "2"], (r.stdout, r.stderr)
    assert "budget 500.00 MiB" in r.stderr, r.stderr
    assert not sealed_lines(r.stderr), r.stderr
    # the same fence's stricter on-exceed is taken too: abort ends the process
    r = box["run"](hold(box, 3, "400m"), fence=box["record"](team(box)),
                   env_add={"CUDATRACE_ON_EXCEED": "abort"})  # fmt: skip
    assert r.returncode != 0 and "stopping the process tree" in r.stderr, r.stderr


def test_cudatrace_exempt_cannot_lift_a_sealed_fence(box, ct):
    """cudatrace_exempt() is exported (cudatrace's own processes call it to observe): a program
    that calls it inside a sealed fence may observe, and its allocations are refused."""
    prog = box["base"] / "exempt.py"
    prog.write_text(
        "import ctypes\n"
        "ctypes.CDLL(None).cudatrace_exempt()\n"
        "cu = ctypes.CDLL('libcuda.so.1')\n"
        "print('init', cu.cuInit(0))\n"
        "d, c, p = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()\n"
        "cu.cuDeviceGet(ctypes.byref(d), 0)\n"
        "cu.cuCtxCreate_v2(ctypes.byref(c), 0, d)\n"
        "print('alloc', cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 30)))\n"
    )
    prog.chmod(0o644)
    r = box["run"](["python3", prog], fence=box["record"](team(box)))
    assert "init 0" in r.stdout and f"alloc {NOT_PERMITTED}" in r.stdout, (r.stdout, r.stderr)
    assert "declared itself cudatrace's own (cudatrace_exempt) inside the sealed fence" in r.stderr
    # without a sealed record it exempts, as before (cudatrace's own processes)
    env = dict(box["env"], CUDATRACE_GROUP="g", CUDATRACE_BUDGET="1MiB",
               CUDATRACE_LEDGER_DIR=str(box["base"]))  # fmt: skip
    r = subprocess.run(["python3", prog], env=env, capture_output=True, text=True, timeout=60)
    assert "alloc 0" in r.stdout, (r.stdout, r.stderr)


# ---- records that cannot be used: refused, one clean line ------------------------------------


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_record_refuses_cuda_with_one_clean_line(box, case):
    text, why = MALFORMED[case]
    fence = box["record"](text.replace("LEDGERS", str(box["ledgers"])))
    r = box["run"](hold(box, 1, "1g"), fence=fence, env_add={"CUDATRACE_ON_FENCE_ERROR": "warn"})
    assert f"# cuInit {NOT_PERMITTED}" in r.stdout, (r.stdout, r.stderr)
    (line,) = fence_lines(r.stderr)
    assert line.startswith("cudatrace: fencing cannot be set up: the fence record "
                           "/etc/cudatrace/fence"), line  # fmt: skip
    assert why in line, (why, line)
    assert "the sealed fence's on-fence-error=refuse" in line, line  # warn from env: ignored
    clean(line)


def test_a_record_the_workload_could_write_is_refused(box):
    """Not root's; writable by others; on a writable mount in a directory others may write
    (a root's record on a path only root writes is trusted without a read-only mount: a Slurm
    job's, a host's /etc/cudatrace/fence)."""
    good = team(box)
    drop = ["setpriv", f"--reuid={USERS[0]}", f"--regid={USERS[0]}", "--clear-groups"]
    opened = ["sh", "-c", 'chmod 777 /etc/cudatrace && exec "$@"', "sh", *drop]
    cases = {
        "another user's": (box["record"](good, owner=USERS[1]), True, [], "is not root's"),
        "group-writable": (box["record"](good, mode=0o664), True, [], "others may write it"),
        "writable": (box["record"](good), False, opened, "could be rewritten by the workload"),
    }
    for name, (fence, ro, pre, why) in cases.items():
        r = box["run"]([*pre, *hold(box, 1, "1g")], fence=fence, read_only=ro,
                       user=None if pre else USERS[0])  # fmt: skip
        assert f"# cuInit {NOT_PERMITTED}" in r.stdout, (name, r.stdout, r.stderr)
        (line,) = fence_lines(r.stderr)
        assert why in line, (name, line)
        clean(line)
    r = box["run"](hold(box, 2, "1g"), fence=box["record"](good), read_only=False)
    assert allocs(r.stdout) == ["0", "2"], (r.stdout, r.stderr)  # root's path: trusted


def test_a_record_reached_through_a_link_or_not_a_file_is_refused(box):
    real = box["record"](team(box))
    script = {
        "link": f"ln -sf {real} /etc/cudatrace/fence",
        "fifo": "mkfifo /etc/cudatrace/fence",
    }
    for name, setup in script.items():
        n = len(list(box["base"].iterdir()))
        argv = sealroot.shell(box["base"] / f"ns-link-{n}", f"{setup} && exec setpriv "
                              f"--reuid={USERS[0]} --regid={USERS[0]} --clear-groups "
                              + sealroot.quote([str(a) for a in hold(box, 1, "1g")]))  # fmt: skip
        r = subprocess.run(argv, env=box["env"], capture_output=True, text=True, timeout=60)
        assert f"# cuInit {NOT_PERMITTED}" in r.stdout, (name, r.stdout, r.stderr)
        (line,) = fence_lines(r.stderr)
        why = "through a symbolic link" if name == "link" else "is not a regular file"
        assert why in line, (name, line)
        clean(line)


# ---- Slurm: the job's record ----------------------------------------------------------------


def job_record(box, job: str, uid: int, share_gib: int) -> FenceRecord:
    return FenceRecord(group="slurm-gpu0", budget=str(8 * GiB), ledger_dir=str(box["ledgers"]),
                       share=job, share_budget=share_gib * GiB,
                       share_label=f"slurm job {job}", uid=uid, owner=f"slurm job {job}")  # fmt: skip


@pytest.fixture
def jobs(box):
    d = box["base"] / "jobs"
    d.mkdir(mode=0o755)
    for job, uid, share in (("41", USERS[0], 2), ("42", USERS[1], 6), ("43", USERS[0], 1)):
        p = d / job
        p.write_text(fence_record.render(job_record(box, job, uid, share)).text)
        p.chmod(0o644)
    return d


def test_a_slurm_job_is_fenced_by_its_record_and_its_variables_cannot_raise_it(box, jobs):
    """The Slurm attack: a shard:2 job whose script exports CUDATRACE_SHARE_BUDGET=8589934592
    got an 8 GiB share."""
    r = box["run"](hold(box, 3, "1g"), jobs=jobs, user=USERS[0],
                   env_add={"SLURM_JOB_ID": "41", "CUDATRACE_SHARE_BUDGET": "8589934592",
                            "CUDATRACE_SHARE": "42"})  # fmt: skip
    assert allocs(r.stdout) == ["0", "0", "2"], (r.stdout, r.stderr)
    assert "budget 2.00 GiB (share of slurm job 41), in use 2.00 GiB" in r.stderr, r.stderr
    (line,) = sealed_lines(r.stderr)
    assert "CUDATRACE_SHARE_BUDGET='8589934592' (not below the fence)" in line, line
    assert "CUDATRACE_SHARE='42'" in line and "/run/cudatrace/jobs/41" in line, line
    clean(line)


def test_another_users_job_record_is_refused(box, jobs):
    r = box["run"](hold(box, 1, "1g"), jobs=jobs, user=USERS[0], env_add={"SLURM_JOB_ID": "42"})
    assert f"# cuInit {NOT_PERMITTED}" in r.stdout, (r.stdout, r.stderr)
    (line,) = fence_lines(r.stderr)
    assert "/run/cudatrace/jobs/42 is another user's job's" in line, line
    clean(line)


def test_a_job_that_clears_its_job_id_gets_its_users_strictest_record(box, jobs):
    """SLURM_JOB_ID unset (or naming no record): the process is still fenced, by the least
    share its uid holds on the node (job 43's 1 GiB), never by another user's."""
    for env_add in ({}, {"SLURM_JOB_ID": "99"}):
        r = box["run"](hold(box, 2, "1g"), jobs=jobs, user=USERS[0], env_add=env_add)
        assert allocs(r.stdout) == ["0", "2"], (r.stdout, r.stderr)
        assert "budget 1.00 GiB (share of slurm job 43)" in r.stderr, r.stderr
    r = box["run"](hold(box, 7, "1g"), jobs=jobs, user=USERS[1])
    assert allocs(r.stdout) == ["0"] * 6 + ["2"], (r.stdout, r.stderr)
    # a uid with no record on the node: not fenced by anyone's
    r = box["run"](hold(box, 1, "1g"), jobs=jobs, user=65532)
    assert allocs(r.stdout) == ["0"] and "budget" not in r.stderr, (r.stdout, r.stderr)


def _cgroup_dir() -> Path | None:
    """A cgroup hierarchy this test may make a job_<id> cgroup in (v1 pids, or v2)."""
    for d in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if (d / "cgroup.procs").is_file() and os.access(d, os.W_OK):
            return d
    return None


def test_the_job_of_the_cgroup_wins_over_the_environment(box, jobs):
    """Where Slurm tracks jobs with cgroups (task/cgroup: /slurm/uid_U/job_J/step_S on v1), the
    job is the cgroup's, whatever SLURM_JOB_ID says: job 43's 1 GiB, not job 41's 2 GiB."""
    top = _cgroup_dir()
    if top is None:
        pytest.fail(
            "no writable cgroup hierarchy (the tests run as root on a cgroup v1 or v2 host)"
        )
    root = top / f"ct-fence-{os.getpid()}"
    cg = root / "slurm" / f"uid_{USERS[0]}" / "job_43" / "step_0"
    cg.mkdir(parents=True)
    try:
        drop = ["setpriv", f"--reuid={USERS[0]}", f"--regid={USERS[0]}", "--clear-groups"]
        script = f'echo $$ > {cg}/cgroup.procs && exec "$@"'
        r = box["run"](["sh", "-c", script, "sh", *drop, *hold(box, 2, "1g")], jobs=jobs,
                       user=None, env_add={"SLURM_JOB_ID": "41"})  # fmt: skip
        assert allocs(r.stdout) == ["0", "2"], (r.stdout, r.stderr)
        assert "budget 1.00 GiB (share of slurm job 43)" in r.stderr, r.stderr
    finally:
        for d in [cg, *cg.parents]:
            if d == top:
                break
            d.rmdir()


# ---- cudatrace run inside a sealed fence --------------------------------------------------------


def test_cudatrace_run_inside_a_sealed_fence_keeps_it_and_may_only_lower_it(box):
    """`cudatrace run` by a user keeps the environment contract; inside a sealed fence the record
    wins: its command counts in the fence's group (no ledger of the run's own), --budget lowers
    it, a larger one is bounded by the fence, --group is refused; nothing is ignored."""
    repo = Path(__file__).resolve().parents[2]
    fence = box["record"](team(box))
    run = [sys.executable, "-m", "cudatrace", "run", "-q", "--no-trace"]
    # the launcher preloads the checkout's library: the same one (two copies would both fence)
    env = {"PYTHONPATH": str(repo), "LD_PRELOAD": str(native.shim_path())}
    r = box["run"]([*run, "--budget", "500MiB", "--", *hold(box, 3, "400m")], fence=fence,
                   user=None, env_add=env)  # fmt: skip
    assert allocs(r.stdout) == ["0", "2", "2"], (r.stdout, r.stderr)
    assert "budget 500.00 MiB (share of cudatrace run" in r.stderr, r.stderr
    assert not sealed_lines(r.stderr), r.stderr
    r = box["run"]([*run, "--budget", "8GiB", "--", *hold(box, 3, "400m")], fence=fence,
                   user=None, env_add=env)  # fmt: skip
    assert allocs(r.stdout) == ["0", "0", "2"], (r.stdout, r.stderr)
    assert "is above its fence's share" in r.stderr and not sealed_lines(r.stderr), r.stderr
    assert not list(box["ledgers"].glob("@run-*"))  # the run made no ledger of its own
    r = box["run"]([*run, "--group", "mine", "--budget", "8GiB", "--", *hold(box, 1, "1m")],
                   fence=fence, user=None, env_add=env)  # fmt: skip
    assert r.returncode != 0 and "inside the fence of group team-a" in r.stderr, r.stderr
    assert "the sealed fence record /etc/cudatrace/fence" in r.stderr, r.stderr
