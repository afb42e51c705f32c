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
the job asked for explicitly (CUDATRACE_SLURM_BUDGET in its environment) where that is less: a
share is a reservation, so the shares of one GPU never add up to more than the GPU.

The GPU's memory is the physical device's: cudatrace's own process never reads NVML through
a preload library the job's environment carries (cli.py), so a step's TaskProlog inside a job
reads the GPU, not the job's share. Whatever keeps a task that shares a GPU from its budget
fences it anyway: the exports then name the reason (CUDATRACE_FENCE_ERROR) and the preload
library refuses the task's CUDA (or runs it unfenced under --on-fence-error warn), with a line.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from fractions import Fraction

from .. import settings
from ..errors import CudatraceError
from .budget import bytes_text

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


def _share(
    env: dict[str, str], shards: int, shards_per_gpu: int, whole: int
) -> tuple[int, str, list]:
    """(the job's share in bytes, how it was reached, notes): its part of the GPU (its shards',
    or the whole GPU's), lowered by an explicit CUDATRACE_SLURM_BUDGET, never raised by one; a
    malformed one is said and changes nothing."""
    from .budget import BudgetError, parse_size

    held = int(Fraction(whole) * shards / shards_per_gpu) if shards else whole
    how = f"{shards} of {shards_per_gpu} shards" if shards else "the whole GPU"
    var = settings.name("SLURM_BUDGET")  # a job's explicit request, e.g. 3GiB
    request = env.get(var, "").strip()
    if not request:
        return held, how, []
    try:
        asked = parse_size(request)
    except BudgetError as e:
        return held, how, [f"{var}={request} is not a size ({e}): the job's {how} apply"]
    if asked > held:
        return (
            held,
            how,
            [
                f"{var}={request} is more than the job holds ({how}, {held} bytes): a share "
                "is a reservation, so the job gets what it holds"
            ],
        )
    return asked, f"{var}={request}", []


def _dir_problem(ledger_dir: str) -> str | None:
    """Why the node's shared ledger directory cannot fence jobs (None: it can): the preload
    library then refuses their CUDA, and the task's output says why beforehand."""
    try:
        st = os.stat(ledger_dir)
    except FileNotFoundError:
        return (
            f"the ledger directory {ledger_dir} does not exist (it is made at boot: "
            "docs/slurm.md, tmpfiles.d)"
        )
    except OSError as e:
        return f"the ledger directory {ledger_dir} cannot be read: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode) or not st.st_mode & stat.S_ISVTX or not st.st_mode & 0o022:
        return (
            f"{ledger_dir} is not a shared ledger directory (mode {st.st_mode & 0o7777:04o}; "
            "it must be sticky and writable by the jobs: install -d -m 1777 -o root -g root)"
        )
    return None


def plan(
    env: dict[str, str],
    shim: str,
    ledger_dir: str,
    shards_per_gpu: int,
    gpu_memory: int,
    on_exceed: str = "fail",
    on_fence_error: str = "refuse",
) -> Plan:
    """The exports for one task of a job, from its Slurm environment. A job given no GPU gets
    nothing (no budget, no preload), nor one given whole GPUs (no other job shares them);
    errors raise SlurmError."""
    if shards_per_gpu <= 0:
        raise SlurmError("--shards-per-gpu must be at least 1")
    if gpu_memory <= 0:
        raise SlurmError("the GPU's memory must be known (--gpu-memory)")
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        raise SlurmError("SLURM_JOB_ID is not set: not run by Slurm as a TaskProlog?")
    gpus = _gpu_indices(env)
    shards = _int_env(env, "SLURM_SHARDS_ON_NODE")
    if gpus is None and not shards:
        return Plan({}, [])  # a job without a GPU: nothing to fence
    if gpus is None:
        gpus = [0]  # shards configured by Count= alone: the node's one GPU
    if len(gpus) != 1 and not shards:
        return Plan(
            {},
            [
                f"job {job} has GPUs {','.join(map(str, gpus))} to itself: no other job shares "
                "them, so it runs without a cudatrace budget"
            ],
        )
    if len(gpus) != 1:
        raise SlurmError(
            f"job {job} holds shards of GPUs {','.join(map(str, gpus))}: a budget group is one "
            "GPU, so this task cannot be fenced"
        )
    if shards > shards_per_gpu:
        raise SlurmError(
            f"SLURM_SHARDS_ON_NODE={shards} is more than the {shards_per_gpu} shards per GPU "
            "configured (--shards-per-gpu)"
        )
    share, how, notes = _share(env, shards, shards_per_gpu, gpu_memory)
    if share <= 0:
        raise SlurmError(f"job {job}'s share of the GPU is 0 bytes ({how})")
    problem = _dir_problem(ledger_dir)
    if problem:
        notes.append(f"{problem}: CUDA will be refused in this task")
    user = env.get("SLURM_JOB_USER", "")
    label = f"slurm job {job}" + (f" ({user})" if user else "")
    exports = {
        "LD_PRELOAD": _preload(env, shim),
        **settings.environment(
            LEDGER_DIR=ledger_dir,
            GROUP=f"slurm-gpu{gpus[0]}",
            BUDGET=bytes_text(gpu_memory),
            SHARE=share_name(job),
            SHARE_BUDGET=bytes_text(share),
            SHARE_LABEL=label,
            ON_EXCEED=on_exceed,
            ON_FENCE_ERROR=on_fence_error,
        ),
    }
    return Plan(exports, notes)


def _preload(env: dict[str, str], shim: str) -> str:
    """LD_PRELOAD with the preload library first (once), the job's own after it."""
    parts = env.get("LD_PRELOAD", "").split()
    return " ".join(parts if shim in parts else [shim, *parts])


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
    on_fence_error: str = "refuse",
) -> list[str]:
    """The lines `cudatrace slurm-taskprolog` prints. Never fails the task, and never lets a
    task that shares a GPU run unfenced in silence: what prevents its budget is printed to the
    task's output (`print` lines) and named to the preload library (CUDATRACE_FENCE_ERROR),
    which refuses the task's CUDA (or, with --on-fence-error warn, runs it unfenced)."""
    try:
        mem = gpu_memory_bytes
        if mem is None:
            gpus = _gpu_indices(env) or [0]
            mem = gpu_memory(gpus[0]) if len(gpus) == 1 else 1
        return plan(env, shim, ledger_dir, shards_per_gpu, mem, on_exceed, on_fence_error).lines()
    except SlurmError as e:
        verdict = "CUDA is refused in it" if on_fence_error != "warn" else "it runs unfenced"
        return Plan(
            {
                "LD_PRELOAD": _preload(env, shim),
                **settings.environment(
                    FENCE_ERROR=f"the Slurm TaskProlog could not fence this task: {e}",
                    ON_FENCE_ERROR=on_fence_error,
                ),
            },
            [f"no GPU memory budget for this task: {e}; {verdict}"],
        ).lines()
