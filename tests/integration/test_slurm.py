"""Slurm (docs/slurm.md): a single-node Slurm (munged, slurmctld and slurmd from Debian's packages,
on 127.0.0.1, started here once for the module and always stopped) with one simulated 8 GiB GPU
configured as a gres of 8 shards (a dummy device node, AutoDetect=off), and the shipped Prolog,
Epilog and TaskProlog wrappers (contrib/slurm/, their settings filled in) calling cudatrace by
absolute path from an install every job user can read, none of it on the jobs' PATH. slurmd runs
in a mount namespace of its own where /etc and /run are private (tests/support/sealroot.py), so
the Prolog's records (/run/cudatrace/jobs/<job>) are this test's alone. Jobs run as two ordinary
users made here. The GPU's memory is read through NVML (no --gpu-memory) by the Prolog.

- a job's own script cannot raise its share: `export CUDATRACE_SHARE_BUDGET=8589934592` on
  `shard:2` (it got 8 GiB), another group and ledger directory in an `srun` step, a cleared
  SLURM_JOB_ID, another user's job id: each is ignored or refused with a line, the shard:6 job
  beside it keeps its 6 GiB;

- two users' jobs on the GPU: the one over its share (2 of 8 shards) gets the OOM and a line naming
  its job, the other (6 shards) completes, `cudatrace status` shows both;
- `sbatch -n2 --gres=shard:3` with `srun -n2` steps: the steps share the job's 3 GiB;
- an explicit CUDATRACE_SLURM_BUDGET above the shards held is bounded by them: a 7 GiB request on
  `shard:1` never denies a `shard:6` job its 6 GiB;
- a Prolog that cannot run cudatrace: the task's output says so and its CUDA is refused; a
  ledger directory missing after a reboot is made by the Prolog; never a silent run without a
  budget.
Plus the records and TaskProlog lines for the environments a job would have (no daemons)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cudatrace import fence_record, native
from cudatrace.deploy import slurm
from support import sealroot, simbuild

GiB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "useradd", "setpriv", "su")
USERS = ("ctjob-alice", "ctjob-bob")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _open_to_all(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        p.chmod(mode | stat.S_IROTH | stat.S_IRGRP | (0o055 if p.is_dir() or mode & 0o100 else 0))


def _python_for(user: str) -> str:
    """An interpreter of this Python version that the job user can run."""
    exe = os.path.realpath(sys.executable)
    for cand in (exe, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"):
        r = subprocess.run(["su", "-s", "/bin/sh", user, "-c", f"{cand} -c 'print(1)'"],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode == 0:
            return cand
    pytest.fail(f"no Python {sys.version_info[:2]} that {user} may run (CI's is /usr/bin's)")


def install(opt: Path, user: str) -> dict:
    """cudatrace installed where every job user can read it (docs/slurm.md): its package with
    the native libraries and the headers, click and cffi beside it, a `bin/cudatrace` that runs
    it by absolute path, and a stable link to the preload library."""
    import cffi
    import click
    import pycparser

    lib = opt / "lib"
    lib.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "cudatrace", lib / "cudatrace", ignore=ignore)
    shutil.copytree(REPO / "native", lib / "cudatrace" / "_native" / "native", ignore=ignore)
    shim = native.shim_path()
    shutil.copy2(shim, lib / "cudatrace" / "_native" / shim.name)  # newer than the copied sources
    shutil.copy2(shim.with_name(native.TOOLS_LIB), lib / "cudatrace" / "_native" / native.TOOLS_LIB)
    for mod in (click, cffi, pycparser):
        shutil.copytree(Path(mod.__file__).parent, lib / mod.__name__, ignore=ignore)
    import _cffi_backend

    shutil.copy2(_cffi_backend.__file__, lib / Path(_cffi_backend.__file__).name)
    (opt / "bin").mkdir()
    py = _python_for(user)
    (opt / "bin" / "cudatrace").write_text(
        f'#!/bin/sh\nPYTHONPATH={lib} exec {py} -m cudatrace "$@"\n'
    )
    (opt / "bin" / "cudatrace").chmod(0o755)
    (opt / "libcudatrace.so").symlink_to(lib / "cudatrace" / "_native" / shim.name)
    _open_to_all(opt)
    return {"cudatrace": opt / "bin" / "cudatrace", "shim": opt / "libcudatrace.so", "py": py}


def wrapper(base: Path, name: str, cudatrace: Path, shim: Path, ledgers: Path,
            which: str = "taskprolog") -> Path:  # fmt: skip
    """contrib/slurm/<which>.sh with its settings filled in, as an operator edits it. The
    Prolog's also says where the simulated driver is: slurmd gives a Prolog an environment of
    its own (NVML is in the system's library path on a real node)."""
    text = (REPO / f"contrib/slurm/{which}.sh").read_text()
    if which == "prolog":
        sim = simbuild.sim_env(base / "pub", state=base / "gpu", total_bytes=8 * GiB)
        exports = "".join(f"export {k}={v}\n" for k, v in sim.items())
        text = text.replace("\nCUDATRACE=", f"\n{exports}CUDATRACE=", 1)
    for key, value in (("CUDATRACE", cudatrace), ("SHIM", shim), ("SHARDS_PER_GPU", 8),
                       ("LEDGER_DIR", ledgers)):  # fmt: skip
        if f"\n{key}=" not in text:
            continue
        lines = text.splitlines()
        hits = [i for i, ln in enumerate(lines) if ln.startswith(f"{key}=")]
        assert len(hits) == 1, key
        lines[hits[0]] = f"{key}={value}"
        text = "\n".join(lines) + "\n"
    path = base / name
    path.write_text(text)
    path.chmod(0o755)
    return path


class Cluster:
    def __init__(self, base: Path, ledgers: Path, env: dict[str, str]):
        self.base, self.ledgers, self.env = base, ledgers, env
        self.procs: list[subprocess.Popen] = []
        self.made_users: list[str] = []

    def start(self, name, *args):
        log = open(self.base / f"{name}.stdout", "w")
        # from the base folder: a `python -m cudatrace` of the Prolog or a job imports no
        # checkout from its working directory
        p = subprocess.Popen([name, *map(str, args)], env=self.env, stdout=log, stderr=log,
                             cwd=self.base)  # fmt: skip
        self.procs.append(p)
        return p

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=15)

    def run(self, *args, user: str | None = None, env=None, **kw) -> subprocess.CompletedProcess:
        pre = [] if user is None else ["setpriv", f"--reuid={user}", f"--regid={user}",
                                       "--init-groups"]  # fmt: skip
        kw.setdefault("cwd", self.base)
        return subprocess.run([*pre, *map(str, args)], env=env or self.env, capture_output=True,
                              text=True, timeout=60, **kw)  # fmt: skip

    def use_prolog(self, path: Path, which: str = "taskprolog") -> None:
        """The (Task)Prolog slurm.conf names is a link: pointed at another wrapper for a test."""
        link = self.base / f"{which}.sh"
        tmp = self.base / f"{which}.new"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(path)
        os.replace(tmp, link)

    def sbatch(self, user: str, script: str, *opts, env_add=None) -> str:
        path = self.base / "jobs" / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
        env = dict(self.env, **(env_add or {}))
        r = self.run("sbatch", "--parsable", "-o", f"{self.base}/out/%j.txt", *opts, path,
                     user=user, env=env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().split(";")[0]

    def job_state(self, job: str) -> str:
        r = self.run("scontrol", "show", "job", job)
        for tok in r.stdout.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        return ""

    def finished(self, job: str, timeout: float = 90) -> str:
        return _wait(
            lambda: (s := self.job_state(job)) in ("COMPLETED", "FAILED", "CANCELLED") and s,
            timeout,
            f"job {job} to end",
        )

    def output(self, job: str) -> str:
        return (self.base / "out" / f"{job}.txt").read_text()

    def status(self) -> dict:
        env = {k: v for k, v in self.env.items() if k != "LD_PRELOAD"}
        r = subprocess.run([sys.executable, "-m", "cudatrace", "status", "slurm-gpu0", "--json"],
                           env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        return json.loads(r.stdout)["ledgers"][0] if r.returncode == 0 else {}

    def logs(self) -> str:
        out = []
        files = sorted(self.base.glob("*.log")) + sorted(self.base.glob("*.stdout"))
        for f in files + sorted(self.base.glob("out/*.txt")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)


def _users(c: Cluster) -> None:
    for u in USERS:
        try:
            pwd.getpwnam(u)
        except KeyError:
            r = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", u],
                               capture_output=True, text=True)  # fmt: skip
            assert r.returncode == 0, r.stderr
            c.made_users.append(u)


def _conf(base: Path, host: str, munge: Path) -> Path:
    conf = base / "slurm.conf"
    conf.write_text(
        f"""ClusterName=cudatrace
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge}/sock
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu,shard
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MinJobAge=600
TaskProlog={base}/taskprolog.sh
Prolog={base}/prolog.sh
Epilog={base}/epilog.sh
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Gres=gpu:1,shard:8 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=10 State=UP
"""
    )
    (base / "gres.conf").write_text(
        "AutoDetect=off\n"
        f"NodeName={host} Name=gpu File={base}/nvidia0\n"
        f"NodeName={host} Name=shard Count=8 File={base}/nvidia0\n"
    )
    return conf


def _tree(sim) -> tuple[Path, dict]:
    """The base folder: the shared ledger directory, the simulated driver, hold and the GPU's
    state open to the job users, folders for job scripts and outputs."""
    base = Path(tempfile.mkdtemp(prefix="ct-slurm-"))
    base.chmod(0o755)
    for d in ("state", "spool", "pub"):
        (base / d).mkdir()
    for d in ("jobs", "out"):
        (base / d).mkdir(mode=0o1777)
        (base / d).chmod(0o1777)
    ledgers = base / "ledgers"
    ledgers.mkdir()
    ledgers.chmod(0o1777)  # the node's shared ledger directory (docs/slurm.md)
    for f in sim.lib.iterdir():
        shutil.copy2(f, base / "pub" / f.name, follow_symlinks=True)
    shutil.copy2(sim.progs["hold"], base / "pub" / "hold")
    shutil.copy2(sim.progs["steps"], base / "pub" / "steps")
    _open_to_all(base / "pub")
    os.mknod(base / "nvidia0", 0o600 | 0o020000, os.makedev(195, 0))  # a dummy GPU device node
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDATRACE_", "CUDASIM_"))}
    env.pop("LD_PRELOAD", None)
    env.update(simbuild.sim_env(base / "pub", state=base / "gpu", total_bytes=8 * GiB))
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # no cudatrace on it: the jobs' PATH
    env["CUDATRACE_LEDGER_DIR"] = str(ledgers)
    env["PYTHONPATH"] = str(REPO)  # for the test's own `cudatrace status`
    return base, env


@pytest.fixture(scope="module")
def cluster(sim):
    missing = [d for d in DAEMONS if not shutil.which(d, path="/usr/sbin:/usr/bin:/sbin:/bin")]
    if missing:
        pytest.fail(f"Slurm/munge not installed ({', '.join(missing)}): .ci/run installs them")
    if os.geteuid() != 0:
        pytest.fail("slurmd runs as root here (it starts jobs as their users): run as root")
    base, env = _tree(sim)
    host = socket.gethostname().split(".")[0]
    munge = base / "munge"
    munge.mkdir(mode=0o700)
    (munge / "key").write_bytes(os.urandom(1024))
    (munge / "key").chmod(0o600)
    conf = _conf(base, host, munge)
    env["SLURM_CONF"] = str(conf)
    c = Cluster(base, base / "ledgers", env)
    try:
        _users(c)
        sim.run("simstat", env=env, check=True)  # the GPU's state file, open to the job users
        (base / "gpu").chmod(0o666)
        c.installed = install(base / "opt", USERS[0])
        c.good = {
            which: wrapper(
                base,
                f"{which}-good.sh",
                c.installed["cudatrace"],
                c.installed["shim"],
                c.ledgers,
                which,
            )  # fmt: skip
            for which in ("prolog", "epilog", "taskprolog")
        }
        for which, path in c.good.items():
            c.use_prolog(path, which)
        c.start(
            "munged", "-F", "-f", f"--key-file={munge}/key", f"--socket={munge}/sock",
            f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed",
        )  # fmt: skip
        _wait(lambda: (munge / "sock").exists(), 15, "munged's socket")
        (munge).chmod(0o755)  # the users' commands reach munged's socket
        c.start("slurmctld", "-D", "-i", "-f", conf)
        # slurmd (and the Prolog, the jobs) in a private /etc and /run: the records are ours
        c.start(*sealroot.prefix(base / "ns"), "slurmd", "-D", "-f", conf)
        _wait(lambda: "idle" in c.run("sinfo", "-h", "-o", "%t").stdout, 40, "the node to be idle")
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()
        for u in c.made_users:
            subprocess.run(["userdel", u], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def cl(cluster):
    """The cluster with the good wrappers, after the previous test's jobs have ended."""
    for which, path in cluster.good.items():
        cluster.use_prolog(path, which)
    _wait(lambda: not cluster.run("squeue", "-h").stdout.strip(), 60, "the queue to empty")
    return cluster


def _hold(c: Cluster) -> str:
    return str(c.base / "pub" / "hold")


def test_two_users_jobs_on_one_gpu(cl):
    c = cl
    small = c.sbatch(USERS[0],
                     'command -v cudatrace || echo "cudatrace is not on the job\'s PATH"\n'
                     f"exec {_hold(c)} --exit-after-ms 4000 3 1g\n", "--gres=shard:2")  # fmt: skip
    big = c.sbatch(USERS[1], f"exec {_hold(c)} --exit-after-ms 4000 5 1g\n", "--gres=shard:6")

    def both_in_status():
        st = c.status()
        shares = {m["share"] for m in st.get("members", []) if m["state"] == "alive"}
        return st if {small, big} <= shares else None

    try:
        st = _wait(both_in_status, 60, "both jobs in `cudatrace status`")
        assert st["devices"][0]["limit"] == 8 * GiB  # the GPU's memory, read through NVML
        limits = {m["share"]: m["share_limit"] for m in st["members"]}
        assert limits[small] == 2 * GiB and limits[big] == 6 * GiB, limits
        assert c.finished(small) == "FAILED" and c.finished(big) == "COMPLETED"
    except AssertionError:
        print(c.logs())
        raise
    out_small, out_big = c.output(small), c.output(big)
    assert "cudatrace is not on the job's PATH" in out_small, out_small
    assert "cudatrace: budget exceeded: cuMemAlloc_v2 of 1.00 GiB on device 0" in out_small
    assert (
        f"budget 2.00 GiB (share of slurm job {small} ({USERS[0]})), in use 2.00 GiB" in out_small
    ), out_small
    allocs = [ln for ln in out_big.splitlines() if ln.startswith("alloc cuMemAlloc_v2 1073741824")]
    assert "budget exceeded" not in out_big and len(allocs) == 5, out_big
    assert all(ln.endswith(" 0") for ln in allocs), out_big


def test_a_user_who_damages_the_ledgers_kills_no_other_users_job(cl):
    """Alice's job truncates every ledger file of the node's directory it can while Bob's job
    runs (the per-GPU ledger was one file, 0666: Bob's job died of SIGBUS at its next
    allocation). She can only reach her own part of the GPU's group: Bob's running process
    allocates on, within his share, and `cudatrace status` still reads the group."""
    c = cl
    sync = c.base / "jobs" / f"sync-{time.monotonic_ns()}"
    steps = c.base / "pub" / "steps"
    bob = c.sbatch(
        USERS[1],
        f'(echo "a 1g"; touch {sync}.bob; while [ ! -e {sync}.done ]; do sleep 0.1; done; '
        f'echo "a 1g"; echo "a 1g"; echo q) | {steps}; echo "steps exit $?"\n',
        "--gres=shard:6",
    )
    alice = c.sbatch(
        USERS[0],
        f"{_hold(c)} 1 1g & H=$!; while [ ! -e {sync}.bob ]; do sleep 0.1; done; sleep 0.5\n"
        'for f in "$CUDATRACE_LEDGER_DIR"/*.ledger; do\n'
        '  truncate -s 0 "$f" 2>/dev/null && echo "truncated $f"\n'
        '  printf x >> "$f" 2>/dev/null && echo "wrote $f"\n'
        f"done\ntouch {sync}.done\nsleep 2\nkill $H\n",
        "--gres=shard:2",
    )
    uid = pwd.getpwnam(USERS[0]).pw_uid
    try:
        assert c.finished(bob) == "COMPLETED", c.output(bob)
        c.finished(alice)
        st = c.status()
        assert st and st["group"] == "slurm-gpu0", st
    except AssertionError:
        print(c.logs())
        raise
    finally:  # her part is hers to remove (the next tests' jobs of hers would be refused)
        (c.ledgers / f"slurm-gpu0@{uid}.ledger").unlink(missing_ok=True)
    out_bob, out_alice = c.output(bob), c.output(alice)
    replies = [ln for ln in out_bob.splitlines() if ln == "ok" or ln.startswith(("#", "steps"))]
    assert replies == ["ok", "ok", "ok", "steps exit 0"], out_bob
    uid = pwd.getpwnam(USERS[0]).pw_uid  # her part counts as its last figure, said once
    assert out_bob.count(f"note: uid {uid}'s part of budget group slurm-gpu0") == 1, out_bob
    touched = [
        ln.split(" ", 1)[1]
        for ln in out_alice.splitlines()
        if ln.startswith(("truncated", "wrote"))
    ]
    assert touched and {Path(t).name for t in touched} == {f"slurm-gpu0@{uid}.ledger"}, out_alice


def test_srun_steps_share_the_jobs_share(cl):
    """Each step's TaskProlog runs in the job's environment (the shim preloaded): it still reads
    the GPU's 8 GiB, so the steps get the job's 3 GiB (they got 1.12 GiB and a group budget that
    "differs"), and together they hold 3 GiB: of 2 x 2 GiB asked, 1 GiB is denied."""
    c = cl
    job = c.sbatch(
        USERS[0],
        f"srun -n2 sh -c 'echo share $CUDATRACE_SHARE_BUDGET; "
        f"exec {_hold(c)} --exit-after-ms 3000 2 1g'\n",
        "-n2",
        "--gres=shard:3",
    )
    c.finished(job)
    out = c.output(job)
    assert out.count(f"share {3 * GiB}") == 2, out
    ok = [ln for ln in out.splitlines() if ln.startswith("alloc ") and ln.endswith(" 0")]
    assert len(ok) == 3, out
    assert f"budget 3.00 GiB (share of slurm job {job} ({USERS[0]})), in use 3.00 GiB" in out, out
    assert "differs" not in out and "fencing cannot be set up" not in out, out


def test_an_explicit_request_is_bounded_by_the_shards_held(cl):
    """CUDATRACE_SLURM_BUDGET=7GiB on shard:1 gets its shard's 1 GiB, and says so; the shard:6
    job beside it gets its 6 GiB (it was denied at its 2nd GiB)."""
    c = cl
    greedy = c.sbatch(USERS[1], f"exec {_hold(c)} --exit-after-ms 5000 7 1g\n", "--gres=shard:1",
                      env_add={"CUDATRACE_SLURM_BUDGET": "7GiB"})  # fmt: skip
    _wait(lambda: c.job_state(greedy) == "RUNNING", 60, "the greedy job to start")
    time.sleep(1)
    fair = c.sbatch(USERS[0], f"exec {_hold(c)} --exit-after-ms 1000 6 1g\n", "--gres=shard:6")
    assert c.finished(fair) == "COMPLETED", c.output(fair)
    c.finished(greedy)
    out = c.output(greedy)
    assert "CUDATRACE_SLURM_BUDGET=7GiB is more than the job holds (1.00 GiB)" in out, out
    assert f"budget 1.00 GiB (share of slurm job {greedy}" in out, out
    assert "budget exceeded" not in c.output(fair)


def test_a_malformed_request_keeps_the_share(cl):
    c = cl
    job = c.sbatch(USERS[1], f"exec {_hold(c)} --exit-after-ms 1 3 1g\n", "--gres=shard:2",
                   env_add={"CUDATRACE_SLURM_BUDGET": "lots"})  # fmt: skip
    c.finished(job)
    out = c.output(job)
    assert "CUDATRACE_SLURM_BUDGET=lots is not a size" in out, out
    assert f"budget 2.00 GiB (share of slurm job {job}" in out, out


def test_a_prolog_that_cannot_run_cudatrace_refuses_cuda(cl):
    """The wrappers' cudatrace is gone (an upgrade half done): the task still runs, its output
    says why, and its CUDA is refused by the preload library, told by the record the Prolog
    wrapper wrote (it used to fail every job on the node with status 127, or, had the hook
    been skipped, run it without a budget)."""
    c = cl
    for which in ("prolog", "taskprolog"):
        c.use_prolog(wrapper(c.base, f"{which}-broken.sh", c.base / "opt" / "bin" / "gone",
                             c.installed["shim"], c.ledgers, which), which)  # fmt: skip
    job = c.sbatch(USERS[0], f"echo task ran\nexec {_hold(c)} --exit-after-ms 1 1 1g\n",
                   "--gres=shard:2")  # fmt: skip
    c.finished(job)
    out = c.output(job)
    assert "task ran" in out, out
    assert "the TaskProlog could not run" in out, out
    assert "fencing cannot be set up: the Slurm Prolog could not run cudatrace" in out, out
    assert "# cuInit 800" in out, out


def test_a_missing_ledger_directory_is_made_by_the_prolog(cl):
    """/run/cudatrace/slurm gone after a reboot: the Prolog (root) makes it, root's, 1777 and
    marked as made for ledgers, and the jobs are fenced in it (the first job used to make the
    directory its own, and every other user's jobs then ran without a budget)."""
    c = cl
    missing = c.base / "run" / "cudatrace-slurm"
    c.use_prolog(wrapper(c.base, "prolog-nodir.sh", c.installed["cudatrace"],
                         c.installed["shim"], missing, "prolog"), "prolog")  # fmt: skip
    job = c.sbatch(USERS[0], f"exec {_hold(c)} --exit-after-ms 1 3 1g\n", "--gres=shard:2")
    c.finished(job)
    out = c.output(job)
    assert f"budget 2.00 GiB (share of slurm job {job}" in out, out
    st = missing.stat()
    assert st.st_uid == 0 and st.st_mode & 0o7777 == 0o1777
    assert (missing / ".cudatrace-shared").is_file()
    assert list(missing.glob("slurm-gpu0@*.ledger"))  # the job's user's part of the GPU's group


# ---- what a job's own script can try -----------------------------------------------------------


def test_a_jobs_script_cannot_raise_its_share(cl):
    """The attack: a shard:2 job whose script runs `export CUDATRACE_SHARE_BUDGET=8589934592`
    got an 8 GiB share and took 4 GiB; the shard:6 job beside it was denied at its 5th GiB. Its
    budget is the Prolog's record now: the variables are ignored with one line, and the shard:6
    job gets its 6 GiB."""
    c = cl
    greedy = c.sbatch(USERS[0], "export CUDATRACE_SHARE_BUDGET=8589934592\n"
                      "export CUDATRACE_BUDGET=8589934592 CUDATRACE_ON_EXCEED=warn\n"
                      # one long setting pushed the fence's out of the library's settings
                      "export CUDATRACE_HINTS=/$(printf '%08189d' 0)\n"
                      f"exec {_hold(c)} --exit-after-ms 5000 4 1g\n", "--gres=shard:2")  # fmt: skip
    _wait(lambda: c.job_state(greedy) == "RUNNING", 60, "the greedy job to start")
    time.sleep(1.5)
    fair = c.sbatch(USERS[1], f"exec {_hold(c)} --exit-after-ms 1 6 1g\n", "--gres=shard:6")
    assert c.finished(fair) == "COMPLETED", c.output(fair)
    c.finished(greedy)
    out = c.output(greedy)
    assert _results(out) == ["0", "0", "2", "2"], out
    (line,) = [ln for ln in out.splitlines() if "the sealed fence" in ln]
    assert f"(/run/cudatrace/jobs/{greedy})" in line, line
    for said in ("CUDATRACE_SHARE_BUDGET='8589934592' (not below the fence)",
                 "CUDATRACE_ON_EXCEED='warn'"):  # fmt: skip
        assert said in line, line
    assert f"budget 2.00 GiB (share of slurm job {greedy} ({USERS[0]}))" in out, out
    assert "budget exceeded" not in c.output(fair)


def test_an_srun_step_cannot_move_its_group_or_clear_its_job(cl):
    """`srun` steps whose command names another group in /tmp, or clears SLURM_JOB_ID and every
    CUDATRACE_ variable: still the job's 2 GiB (the job's record is found without them)."""
    c = cl
    mine = f"mine-{os.urandom(4).hex()}"
    job = c.sbatch(USERS[1], f"srun -n1 env CUDATRACE_GROUP={mine} CUDATRACE_LEDGER_DIR=/tmp "
                   f"{_hold(c)} --exit-after-ms 1 3 1g\n"
                   f"srun -n1 env -i LD_PRELOAD=$LD_PRELOAD LD_LIBRARY_PATH=$LD_LIBRARY_PATH "
                   f"CUDASIM_STATE=$CUDASIM_STATE {_hold(c)} --exit-after-ms 1 3 1g\n",
                   "--gres=shard:2")  # fmt: skip
    c.finished(job)
    out = c.output(job)
    assert _results(out) == ["0", "0", "2"] * 2, out
    assert out.count(f"budget 2.00 GiB (share of slurm job {job}") == 2, out
    assert f"CUDATRACE_GROUP='{mine}', CUDATRACE_LEDGER_DIR='/tmp'" in out, out
    assert not Path(f"/tmp/{mine}.ledger").exists()


def test_another_users_job_id_is_refused(cl):
    """A job naming another user's job (SLURM_JOB_ID of a shard:6 job) to spend its share: the
    record is the other uid's, and the process's CUDA is refused with a line."""
    c = cl
    big = c.sbatch(USERS[0], "sleep 8\n", "--gres=shard:6")
    _wait(lambda: c.job_state(big) == "RUNNING", 60, "the big job to start")
    thief = c.sbatch(USERS[1], f"SLURM_JOB_ID={big} exec {_hold(c)} --exit-after-ms 1 1 1g\n",
                     "--gres=shard:1")  # fmt: skip
    c.finished(thief)
    out = c.output(thief)
    assert "# cuInit 800" in out, out
    assert f"the fence record /run/cudatrace/jobs/{big} is another user's job's" in out, out
    c.run("scancel", big)


def _results(out: str) -> list[str]:
    return [ln.split()[4] for ln in out.splitlines() if ln.startswith("alloc ")]


def test_cudatrace_run_in_a_job_reports_the_share(cl):
    c = cl
    out_dir = c.base / "out" / "traced"
    job = c.sbatch(USERS[1], f"exec {c.installed['cudatrace']} run -q -o {out_dir} -- "
                   f"{_hold(c)} --exit-after-ms 1 3 1g\n", "--gres=shard:2")  # fmt: skip
    c.finished(job)
    env = {k: v for k, v in c.env.items() if k != "LD_PRELOAD"}
    r = subprocess.run([sys.executable, "-m", "cudatrace", "report", str(out_dir), "--json"],
                       env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, (r.stderr, c.output(job))
    b = json.loads(r.stdout)["budget"]
    assert b["limits"]["0"] == 2 * GiB and b["share"] == f"slurm job {job} ({USERS[1]})", b


# ---- the records and the TaskProlog alone: the environments a job would have -----------------


def _fence(**env):
    return slurm.job_fence(env, "/run/cudatrace/slurm", 8, 80 * GiB)


def test_a_jobs_record(monkeypatch):
    monkeypatch.setattr(slurm, "job_gres", lambda job: (0, None))  # no scontrol here
    r = _fence(SLURM_JOB_ID="1234", SLURM_SHARDS_ON_NODE="2", CUDA_VISIBLE_DEVICES="0",
               SLURM_JOB_GPUS="3", SLURM_JOB_USER="alice", SLURM_JOB_UID="1000")  # fmt: skip
    assert r.group == "slurm-gpu3"  # the node's GPU index, not the job's ordinal
    assert r.share_budget == 20 * GiB and r.budget == str(80 * GiB) and r.uid == 1000
    assert r.share == "1234" and r.share_label == "slurm job 1234 (alice)"
    assert r.on_fence_error == "refuse" and r.ledger_dir == "/run/cudatrace/slurm"
    text = fence_record.render(r).text
    assert fence_record.parse(text) == r
    # a whole GPU; a long job id
    r = _fence(SLURM_JOB_ID="123456789012", SLURM_JOB_GPUS="0", SLURM_JOB_UID="7")
    assert r.share_budget == 80 * GiB and r.share == "56789012"
    assert _fence(SLURM_JOB_ID="7", SLURM_JOB_UID="7") is None  # no GPU: nothing
    assert _fence(SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,1", SLURM_JOB_UID="7") is None  # whole GPUs
    for env, why in (
        ({"SLURM_SHARDS_ON_NODE": "9", "SLURM_JOB_GPUS": "0"}, "more than the 8 shards"),
        ({"SLURM_SHARDS_ON_NODE": "2", "SLURM_JOB_GPUS": "0,1"}, "holds shards of GPUs 0,1"),
        ({"SLURM_JOB_ID": "", "SLURM_JOB_GPUS": "0"}, "SLURM_JOB_ID"),
    ):
        with pytest.raises(slurm.SlurmError, match=why):
            _fence(**{"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "7", **env})


def test_the_shards_of_a_prolog_without_them_in_its_environment(monkeypatch):
    """Slurm gives a Prolog no SLURM_SHARDS_ON_NODE: `scontrol show job -d` says them."""
    shown = (
        "JobId=41 JobName=x\n   JOB_GRES=shard:2\n"
        "     Nodes=gpu01 CPU_IDs=0 Mem=0 GRES=shard:2(IDX:0)\n"
    )  # as Slurm 22.05 says it

    class Done:
        stdout = shown

    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: Done)
    assert slurm.job_gres("41") == (2, [0])
    r = _fence(SLURM_JOB_ID="41", SLURM_JOB_UID="1000")
    assert r.group == "slurm-gpu0" and r.share_budget == 20 * GiB


def test_taskprolog_lines(monkeypatch):
    """The TaskProlog prints LD_PRELOAD (the library first) and the record's variables, lowered
    to the job's explicit request (never raised); on a node whose Prolog wrote no record (not
    configured), a job that shares a GPU is told so and its CUDA is refused; a job without a
    GPU gets nothing."""
    rec = fence_record.FenceRecord(group="slurm-gpu0", budget=str(80 * GiB), ledger_dir="/l",
                                   share="7", share_budget=20 * GiB, uid=7)  # fmt: skip
    found = fence_record.Found("/run/cudatrace/jobs/7", rec)
    monkeypatch.setattr(fence_record, "find", lambda env: found)
    shim = "/opt/ct/libcudatrace.so"

    def exports(lines):
        return dict(ln[len("export ") :].split("=", 1) for ln in lines if ln.startswith("export "))

    e = exports(slurm.taskprolog({"SLURM_JOB_ID": "7", "LD_PRELOAD": "/x.so"}, shim))
    assert e["LD_PRELOAD"] == f"{shim} /x.so" and e["CUDATRACE_SHARE_BUDGET"] == str(20 * GiB)
    assert e["CUDATRACE_GROUP"] == "slurm-gpu0" and e["CUDATRACE_SHARE"] == "7"
    for request, share, said in (("3GiB", 3 * GiB, None), ("70GiB", 20 * GiB, "more than the job"),
                                 ("lots", 20 * GiB, "is not a size")):  # fmt: skip
        lines = slurm.taskprolog({"SLURM_JOB_ID": "7", "CUDATRACE_SLURM_BUDGET": request}, shim)
        assert exports(lines)["CUDATRACE_SHARE_BUDGET"] == str(share), lines
        assert (said is None) == (not lines[0].startswith("print")) and (
            not said or said in lines[0]
        )
    monkeypatch.setattr(fence_record, "find", lambda env: None)
    lines = slurm.taskprolog({"SLURM_JOB_ID": "7", "SLURM_SHARDS_ON_NODE": "2"}, shim)
    e = exports(lines)
    assert e["LD_PRELOAD"] == shim and "no fence record for job 7" in e["CUDATRACE_FENCE_ERROR"]
    assert lines[0].startswith("print cudatrace: no fence record for job 7")
    assert slurm.taskprolog({"SLURM_JOB_ID": "7"}, shim) == []


def test_the_prologs_directories_are_roots(tmp_path):
    """A directory a user made first (in a sticky /run/cudatrace, before any Prolog ran) is moved
    aside and made anew, root's: its owner could have replaced the records written there. The
    shared ledger directory is marked as made for ledgers."""
    if os.geteuid() != 0:
        pytest.fail("the Prolog runs as root: run as root (CI does)")
    run = tmp_path / "run"
    run.mkdir(mode=0o1777)
    run.chmod(0o1777)
    planted = run / "jobs"
    planted.mkdir()
    (planted / "41").write_text("a user's own record")
    os.chown(planted, 65534, 65534)
    slurm._root_dir(planted, 0o755)
    st = planted.stat()
    assert st.st_uid == 0 and st.st_mode & 0o7777 == 0o755 and not (planted / "41").exists()
    assert [p.name for p in run.iterdir() if p.name.startswith(".gone-jobs-")]
    slurm.ledger_dir_ready(str(run / "slurm"))
    assert (run / "slurm").stat().st_mode & 0o7777 == 0o1777
    mark = run / "slurm" / fence_record.shared_mark()
    assert mark.is_file() and mark.stat().st_uid == 0
