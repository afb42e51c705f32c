"""Slurm: the environment a job step's tasks get so that cudatrace's group budgets fence the
memory of jobs sharing a GPU (docs/slurm.md).

`cudatrace slurm-taskprolog` runs as Slurm's TaskProlog: Slurm runs it as the job's user, with
the job's environment, before each task, and applies the `export NAME=value` lines it prints to
the task's environment (`print TEXT` lines go to the task's output). Nothing else is needed on
the node: the preload library then creates or joins the GPU's group ledger by itself at the
task's first CUDA call (docs/budgets.md, "Budgets without the launcher").

One group per physical GPU of the node (`slurm-gpu<index>`), so every job on a GPU counts in
one ledger; its budget is the GPU's memory. Each job is a share of that group (its id, at most
8 characters) whose budget is the job's part of the GPU: SLURM_SHARDS_ON_NODE of the GPU's
configured shards times its memory, a whole GPU's memory for a job given the GPU itself, or what
the job asked for explicitly (CUDATRACE_SLURM_BUDGET in its environment).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..errors import CudatraceError
from ..units import UnitError, parse_size

REQUEST_VAR = "CUDATRACE_SLURM_BUDGET"  # a job's explicit request, e.g. 3GiB
SHARE_MAX = 8  # characters of a share name (ledger.h ct_ledger_set_share)


class SlurmError(CudatraceError):
    """The TaskProlog cannot give this task a budget; the message says why."""


@dataclass
class Plan:
    """What one task gets: the exports, and lines for its output."""

    exports: dict[str, str]
    notes: list[str]

    def lines(self) -> list[str]:
        """The TaskProlog protocol: `print TEXT` and `export NAME=value` lines."""
        out = ["print cudatrace: " + n for n in self.notes]
        # Slurm takes the rest of an export line as the value, as is: no shell quoting
        for k, v in self.exports.items():
            if "\n" in v or "\0" in v:
                raise SlurmError(f"{k}'s value holds a line break")
            out.append(f"export {k}={v}")
        return out


def _gpu_indices(env: dict[str, str]) -> list[int] | None:
    """The node's GPU indices the job was given (SLURM_STEP_GPUS / SLURM_JOB_GPUS, else
    CUDA_VISIBLE_DEVICES as Slurm sets it), None when it names none."""
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"):
        v = env.get(var, "").strip()
        if not v:
            continue
        try:
            return [int(x) for x in v.split(",") if x.strip()]
        except ValueError:
            raise SlurmError(f"{var}={v} does not name GPUs by index") from None
    return None


def _int_env(env: dict[str, str], var: str) -> int:
    v = env.get(var, "").strip()
    if not v:
        return 0
    try:
        n = int(v)
    except ValueError:
        raise SlurmError(f"{var}={v} is not a number") from None
    if n < 0:
        raise SlurmError(f"{var}={v} is negative")
    return n


def share_name(job_id: str) -> str:
    """A job's share name: its id, the last 8 characters of it when longer (ids repeat only
    after 10^8 jobs; documented)."""
    s = "".join(c for c in job_id if c.isalnum() or c in "_.-")
    if not s:
        raise SlurmError(f"SLURM_JOB_ID={job_id!r} is not a job id")
    return s[-SHARE_MAX:]


def plan(
    env: dict[str, str],
    shim: str,
    ledger_dir: str,
    shards_per_gpu: int,
    gpu_memory: int,
    on_exceed: str = "fail",
) -> Plan:
    """The exports for one task of a job, from its Slurm environment. A job given no GPU gets
    nothing (no budget, no preload); errors raise SlurmError."""
    if shards_per_gpu <= 0:
        raise SlurmError("--shards-per-gpu must be at least 1")
    if gpu_memory <= 0:
        raise SlurmError("the GPU's memory must be known (--gpu-memory)")
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        raise SlurmError("SLURM_JOB_ID is not set: not run by Slurm as a TaskProlog?")
    gpus = _gpu_indices(env)
    shards = _int_env(env, "SLURM_SHARDS_ON_NODE")
    request = env.get(REQUEST_VAR, "").strip()
    if gpus is None and not shards:
        return Plan({}, [])  # a job without a GPU: nothing to fence
    if gpus is None:
        gpus = [0]  # shards configured by Count= alone: the node's one GPU
    if len(gpus) != 1:
        return Plan(
            {},
            [
                f"job {job} has GPUs {','.join(map(str, gpus))}: a budget group is one GPU, so "
                "this job runs without a cudatrace budget"
            ],
        )
    if shards > shards_per_gpu:
        raise SlurmError(
            f"SLURM_SHARDS_ON_NODE={shards} is more than the {shards_per_gpu} shards per GPU "
            "configured (--shards-per-gpu)"
        )
    whole = gpu_memory
    if request:
        try:
            share = parse_size(request)
        except UnitError as e:
            raise SlurmError(f"{REQUEST_VAR}={request}: {e}") from None
        share = min(share, whole)
        how = f"{REQUEST_VAR}={request}"
    elif shards:
        share = int(Fraction(whole) * shards / shards_per_gpu)
        how = f"{shards} of {shards_per_gpu} shards"
    else:
        share = whole
        how = "the whole GPU"
    if share <= 0:
        raise SlurmError(f"job {job}'s share of the GPU is 0 bytes ({how})")
    name = share_name(job)
    user = env.get("SLURM_JOB_USER", "")
    label = f"slurm job {job}" + (f" ({user})" if user else "")
    parts = env.get("LD_PRELOAD", "").split()
    exports = {
        "LD_PRELOAD": " ".join(parts if shim in parts else [shim, *parts]),
        "CUDATRACE_LEDGER_DIR": ledger_dir,
        "CUDATRACE_GROUP": f"slurm-gpu{gpus[0]}",
        "CUDATRACE_BUDGET": str(whole),
        "CUDATRACE_SHARE": name,
        "CUDATRACE_SHARE_BUDGET": str(share),
        "CUDATRACE_SHARE_LABEL": label,
        "CUDATRACE_ON_EXCEED": on_exceed,
    }
    return Plan(exports, [])


def gpu_memory(index: int) -> int:
    """The node GPU's memory through NVML (the TaskProlog sees every GPU of the node)."""
    from ..nvml import Nvml

    nv = Nvml()
    if not nv.available:
        raise SlurmError(f"cannot read GPU {index}'s memory: {nv.why}; give --gpu-memory")
    try:
        for m in nv.memory():
            if m["index"] == index and "total" in m:
                return int(m["total"])
    finally:
        nv.shutdown()
    raise SlurmError(f"NVML has no memory figure for GPU {index}; give --gpu-memory")


def taskprolog(
    env: dict[str, str],
    shim: str,
    ledger_dir: str,
    shards_per_gpu: int,
    gpu_memory_bytes: int | None,
    on_exceed: str = "fail",
) -> list[str]:
    """The lines `cudatrace slurm-taskprolog` prints. Never fails the task: what prevents a
    budget is printed to the task's output (`print` lines) and the task runs without one."""
    try:
        mem = gpu_memory_bytes
        if mem is None:
            gpus = _gpu_indices(env) or [0]
            mem = gpu_memory(gpus[0]) if len(gpus) == 1 else 1
        return plan(env, shim, ledger_dir, shards_per_gpu, mem, on_exceed).lines()
    except SlurmError as e:
        return [f"print cudatrace: no GPU memory budget for this task: {e}"]
