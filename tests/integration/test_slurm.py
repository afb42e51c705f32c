"""Issue 24 #2: Slurm. A single-node Slurm (munged, slurmctld and slurmd from Debian's packages,
on 127.0.0.1, started here and always stopped) with one simulated GPU configured as a gres with
8 shards (a dummy device node, AutoDetect=off), and `cudatrace slurm-taskprolog` as its
TaskProlog. Two jobs share the GPU: the one that goes over its share (2 of 8 shards) gets an OOM
and an attributed denial in its output naming the job; the other (6 shards) completes; `cudatrace
status` shows both in the GPU's one group. Plus the TaskProlog's lines for the environments a job
would have (no daemons)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cudatrace.record import slurm

GiB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")


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


class Cluster:
    def __init__(self, base: Path, ledgers: Path, env: dict[str, str]):
        self.base, self.ledgers, self.env = base, ledgers, env
        self.procs: list[subprocess.Popen] = []

    def start(self, name, *args):
        log = open(self.base / f"{name}.stdout", "w")
        p = subprocess.Popen([name, *map(str, args)], env=self.env, stdout=log, stderr=log)
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

    def run(self, *args, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(map(str, args)), env=self.env, capture_output=True, text=True, timeout=30, **kw
        )

    def job_state(self, job: str) -> str:
        r = self.run("scontrol", "show", "job", job)
        for tok in r.stdout.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        return ""

    def logs(self) -> str:
        out = []
        for f in sorted(self.base.glob("*.log")) + sorted(self.base.glob("*.stdout")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)


@pytest.fixture
def cluster(ct, sim):
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        pytest.fail(f"Slurm/munge not installed ({', '.join(missing)}): .ci/run installs them")
    if os.geteuid() != 0:
        pytest.fail("slurmd runs as root here (it starts jobs as their users): run as root")
    base = Path(tempfile.mkdtemp(prefix="ct-slurm-"))
    base.chmod(0o755)
    host = socket.gethostname().split(".")[0]
    (base / "state").mkdir()
    (base / "spool").mkdir()
    munge = base / "munge"
    munge.mkdir(mode=0o700)
    (munge / "key").write_bytes(os.urandom(1024))
    (munge / "key").chmod(0o600)
    ledgers = base / "ledgers"
    ledgers.mkdir()
    ledgers.chmod(0o1777)  # the node's shared ledger directory (docs/slurm.md)
    os.mknod(base / "nvidia0", 0o600 | 0o020000, os.makedev(195, 0))  # a dummy GPU device node
    prolog = base / "taskprolog.sh"
    prolog.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={REPO} exec {sys.executable} -m cudatrace slurm-taskprolog "
        f"--ledger-dir {ledgers} --shards-per-gpu 8 --gpu-memory 8GiB\n"
    )
    prolog.chmod(0o755)
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
TaskProlog={prolog}
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Gres=gpu:1,shard:8 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=10 State=UP
"""
    )
    (base / "gres.conf").write_text(
        "AutoDetect=off\n"
        f"NodeName={host} Name=gpu File={base}/nvidia0\n"
        f"NodeName={host} Name=shard Count=8 File={base}/nvidia0\n"
    )
    env = ct.env(state=sim.new_state(), total_bytes=8 * GiB)
    env["SLURM_CONF"] = str(conf)
    env["CUDATRACE_LEDGER_DIR"] = str(ledgers)
    c = Cluster(base, ledgers, env)
    try:
        c.start(
            "munged", "-F", "-f", f"--key-file={munge}/key", f"--socket={munge}/sock",
            f"--pid-file={munge}/pid", f"--log-file={munge}/log", f"--seed-file={munge}/seed",
        )  # fmt: skip
        _wait(lambda: (munge / "sock").exists(), 15, "munged's socket")
        c.start("slurmctld", "-D", "-i", "-f", conf)
        c.start("slurmd", "-D", "-f", conf)
        _wait(lambda: "idle" in c.run("sinfo", "-h", "-o", "%t").stdout, 40, "the node to be idle")
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)


def _sbatch(c: Cluster, shards: int, n_gib: int) -> str:
    script = c.base / f"job-{shards}.sh"
    hold = c.base / "hold"
    script.write_text(
        "#!/bin/sh\n"
        'echo "job $SLURM_JOB_ID: group $CUDATRACE_GROUP, share $CUDATRACE_SHARE_BUDGET bytes"\n'
        f"exec {hold} --exit-after-ms 4000 {n_gib} 1g\n"
    )
    script.chmod(0o755)
    r = c.run("sbatch", "--parsable", f"--gres=shard:{shards}", "-o", f"{c.base}/out-%j.txt",
              script)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def test_two_jobs_on_one_gpu(ct, sim, cluster):
    c = cluster
    shutil.copy2(sim.progs["hold"], c.base / "hold")
    small = _sbatch(c, 2, 3)  # 2 of 8 shards of 8 GiB = 2 GiB; asks for 3 x 1 GiB
    big = _sbatch(c, 6, 5)  # 6 GiB; takes 5 x 1 GiB and completes

    def both_in_status():
        r = ct.cli("status", "slurm-gpu0", "--json", env=c.env)
        if r.returncode != 0:
            return None
        st = json.loads(r.stdout)["ledgers"][0]
        shares = {m["share"] for m in st["members"] if m["state"] == "alive"}
        return st if {small, big} <= shares else None

    try:
        st = _wait(both_in_status, 40, "both jobs in `cudatrace status`")
        text = ct.cli("status", env=c.env).stdout
        assert f"[share {small}: 2.00 GiB" in text and f"[share {big}: 6.00 GiB" in text, text
        assert st["devices"][0]["limit"] == 8 * GiB
        _wait(lambda: c.job_state(small) == "FAILED", 60, f"job {small} to fail")
        _wait(lambda: c.job_state(big) == "COMPLETED", 60, f"job {big} to complete")
    except AssertionError:
        print(c.logs())
        raise
    out_small = (c.base / f"out-{small}.txt").read_text()
    out_big = (c.base / f"out-{big}.txt").read_text()
    assert "cudatrace: budget exceeded: cuMemAlloc_v2 of 1.00 GiB on device 0" in out_small
    assert f"budget 2.00 GiB (share of slurm job {small} (root)), in use 2.00 GiB" in out_small
    assert "at hold_alloc" in out_small and "CUDA_ERROR_OUT_OF_MEMORY" in out_small, out_small
    allocs = [ln for ln in out_big.splitlines() if ln.startswith("alloc cuMemAlloc_v2 1073741824")]
    assert "budget exceeded" not in out_big and len(allocs) == 5, out_big
    assert all(ln.endswith(" 0") for ln in allocs), out_big  # CUDA_SUCCESS, all five
    st = json.loads(ct.cli("status", "slurm-gpu0", "--json", env=c.env).stdout)["ledgers"][0]
    assert st["devices"][0]["denials"] == 1


# ---- the TaskProlog alone: the environments a job would have ---------------------------------


def _lines(**env):
    return slurm.taskprolog(env, "/opt/ct/libcudatrace.so", "/run/cudatrace", 8, 80 * GiB)


def _exports(lines):
    return dict(ln[len("export ") :].split("=", 1) for ln in lines if ln.startswith("export "))


def test_taskprolog_shards_request_and_refusals():
    e = _exports(_lines(SLURM_JOB_ID="1234", SLURM_SHARDS_ON_NODE="2", CUDA_VISIBLE_DEVICES="0",
                        SLURM_JOB_GPUS="3", SLURM_JOB_USER="alice"))  # fmt: skip
    assert e["CUDATRACE_GROUP"] == "slurm-gpu3"  # the node's GPU index, not the job's ordinal
    assert e["CUDATRACE_SHARE_BUDGET"] == str(20 * GiB) and e["CUDATRACE_BUDGET"] == str(80 * GiB)
    assert e["CUDATRACE_SHARE"] == "1234" and e["CUDATRACE_SHARE_LABEL"] == "slurm job 1234 (alice)"
    assert e["LD_PRELOAD"] == "/opt/ct/libcudatrace.so"
    assert e["CUDATRACE_LEDGER_DIR"] == "/run/cudatrace"
    # an explicit request; a whole GPU; LD_PRELOAD kept; a long job id
    e = _exports(_lines(SLURM_JOB_ID="123456789012", SLURM_JOB_GPUS="0", LD_PRELOAD="/x.so",
                        CUDATRACE_SLURM_BUDGET="3GiB"))  # fmt: skip
    assert e["CUDATRACE_SHARE_BUDGET"] == str(3 * GiB) and e["CUDATRACE_SHARE"] == "56789012"
    assert e["LD_PRELOAD"] == "/opt/ct/libcudatrace.so /x.so"
    e = _exports(_lines(SLURM_JOB_ID="7", SLURM_JOB_GPUS="1"))
    assert e["CUDATRACE_SHARE_BUDGET"] == str(80 * GiB)
    assert _lines(SLURM_JOB_ID="7") == []  # no GPU: nothing
    two = _lines(SLURM_JOB_ID="7", SLURM_JOB_GPUS="0,1")
    assert not _exports(two) and "a budget group is one GPU" in two[0]
    bad = _lines(SLURM_JOB_ID="7", SLURM_JOB_GPUS="0", CUDATRACE_SLURM_BUDGET="lots")
    assert bad[0].startswith("print cudatrace: no GPU memory budget") and "lots" in bad[0]
    over = _lines(SLURM_JOB_ID="7", SLURM_JOB_GPUS="0", SLURM_SHARDS_ON_NODE="9")
    assert "more than the 8 shards" in over[0]
    assert "SLURM_JOB_ID" in _lines(SLURM_JOB_GPUS="0")[0]
