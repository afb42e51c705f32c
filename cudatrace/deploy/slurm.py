"""Slurm: a job's share of its GPU, sealed where the job cannot write it (docs/slurm.md).

`cudatrace slurm-prolog` runs as Slurm's Prolog (root, on the node, before the job's first
task): it writes the job's fence record, /run/cudatrace/jobs/<job id> (cudatrace/fence_record.py:
root's, 0644, in a directory only root writes), and `cudatrace slurm-epilog` removes it when the
job ends. The preload library of every process of the job reads that record itself: the job is
the one its cgroup names (Slurm's task/cgroup), else SLURM_JOB_ID's when the record is the
process's uid's, so a job's script or environment can never raise its share, move it to
another group or ledger, or turn it off (docs/budgets.md, "The sealed fence").
`cudatrace slurm-taskprolog` (the job's user, each task) only makes the library load: it prints
LD_PRELOAD and the record's own variables, and lowers the share to what the job asked
(CUDATRACE_SLURM_BUDGET), which the environment may.

One group per physical GPU of the node (`slurm-gpu<index>`), so every job on a GPU counts in
one ledger; its budget is the GPU's memory. Each job is a share of that group (its id, at most
8 characters) whose budget is the job's part of the GPU: its shards of the GPU's configured
shards times its memory, or a whole GPU's memory for a job given the GPU itself. A share is a
reservation, so the shares of one GPU never add up to more than the GPU.

Whatever keeps a job that shares a GPU from its budget fences it anyway: the record then says
why (fence-error) and the preload library refuses the job's CUDA (or runs it unfenced under
--on-fence-error warn), with a line.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from .. import fence_record, settings
from ..errors import CudatraceError
from ..fence_record import FenceRecord
from ..record.budget import bytes_text
from ..units import format_bytes

SHARE_MAX = 8  # characters of a share name (ledger.h ct_ledger_set_share)


class SlurmError(CudatraceError):
    """A job that cannot be given its budget; the message says why."""


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


def _gpu_indices(env: Mapping[str, str]) -> list[int] | None:
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


def _int_env(env: Mapping[str, str], var: str) -> int:
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


def _job_id(env: Mapping[str, str]) -> str:
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job.isdigit():
        raise SlurmError(f"SLURM_JOB_ID={job!r} is not a job id: not run by Slurm?")
    return job


def job_gres(job: str) -> tuple[int, list[int] | None]:
    """(shards, GPU indices) of a job on this node from `scontrol show job -d`, for a Prolog:
    Slurm 22.05 gives a Prolog SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES but no
    SLURM_SHARDS_ON_NODE, and scontrol says `JOB_GRES=shard:2` and, per node,
    `GRES=shard:2(IDX:0)` (a typed shard: `shard:TYPE:2`). The per-node item wins."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-d", job], capture_output=True,
                             text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return 0, None
    found = list(re.finditer(r"\bshard(?::[A-Za-z][\w.-]*)?[:=](\d+)(\(([^)]*)\))?", out))
    for m in sorted(found, key=lambda m: m.group(2) is None):
        idx = re.findall(r"\d+", (m.group(3) or "").replace("IDX:", ""))
        return int(m.group(1)), [int(idx[0])] if idx else None
    return 0, None


def _uid(env: Mapping[str, str]) -> int:
    if env.get("SLURM_JOB_UID", "").isdigit():
        return int(env["SLURM_JOB_UID"])
    try:
        return pwd.getpwnam(env.get("SLURM_JOB_USER", "")).pw_uid
    except KeyError:
        raise SlurmError("SLURM_JOB_UID is not set: not run by Slurm as a Prolog?") from None


def _gpus_and_shards(env: Mapping[str, str], job: str) -> tuple[list[int] | None, int]:
    gpus = _gpu_indices(env)
    shards = _int_env(env, "SLURM_SHARDS_ON_NODE")
    if not shards:  # a Prolog's environment: the shards from Slurm itself
        shards, from_scontrol = job_gres(job)
        gpus = gpus or from_scontrol
    return gpus, shards


def job_fence(
    env: Mapping[str, str],
    ledger_dir: str,
    shards_per_gpu: int,
    gpu_memory: int,
    on_exceed: str = "fail",
    on_fence_error: str = "refuse",
    gres: tuple[list[int] | None, int] | None = None,
) -> FenceRecord | None:
    """The job's fence on this node, from a Prolog's environment (gres: its GPUs and shards,
    when known already): None for a job given no GPU or whole GPUs (no other job shares them);
    SlurmError when the job cannot be fenced."""
    if shards_per_gpu <= 0:
        raise SlurmError("--shards-per-gpu must be at least 1")
    job = _job_id(env)
    gpus, shards = gres or _gpus_and_shards(env, job)
    if gpus is None and not shards:
        return None  # a job without a GPU: nothing to fence
    if gpus is None:
        gpus = [0]  # shards configured by Count= alone: the node's one GPU
    if len(gpus) != 1 and not shards:
        return None  # whole GPUs: no other job shares them
    if len(gpus) != 1:
        raise SlurmError(
            f"job {job} holds shards of GPUs {','.join(map(str, gpus))}: a budget group is one "
            "GPU, so this job cannot be fenced"
        )
    if shards > shards_per_gpu:
        raise SlurmError(
            f"the job's {shards} shards are more than the {shards_per_gpu} shards per GPU "
            "configured (--shards-per-gpu)"
        )
    if gpu_memory <= 0:
        raise SlurmError("the GPU's memory must be known (--gpu-memory)")
    share = int(Fraction(gpu_memory) * shards / shards_per_gpu) if shards else gpu_memory
    user = env.get("SLURM_JOB_USER", "")
    return FenceRecord(
        group=f"slurm-gpu{gpus[0]}",
        budget=bytes_text(gpu_memory),
        ledger_dir=ledger_dir,
        share=share_name(job),
        share_budget=share,
        share_label=f"slurm job {job}" + (f" ({user})" if user else ""),
        on_exceed=on_exceed,
        on_fence_error=on_fence_error,
        uid=_uid(env),
        owner=f"slurm job {job}",
    )


def gpu_memory(index: int) -> int:
    """The node GPU's memory through NVML (the Prolog sees every GPU of the node)."""
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


# ---- the Prolog and the Epilog (root) ---------------------------------------------------------


def _root_dir(path: Path, mode: int) -> None:
    """A directory of root's with this mode, its missing parents root's 0755. The directory
    itself, when it is a link or another uid's (made by a user in a sticky /run/cudatrace
    before any Prolog ran), is moved aside and made anew: its owner could replace what is
    written there; a parent that is one is refused."""
    for p in reversed(path.parents):
        if p.is_symlink():
            raise SlurmError(f"{p} is a symbolic link; refusing it")
        if not p.exists():
            p.mkdir(mode=0o755)
    if path.is_symlink() or (path.exists() and path.stat().st_uid != os.geteuid()):
        os.rename(path, path.with_name(f".gone-{path.name}-{os.getpid()}"))
    path.mkdir(mode=0o755, exist_ok=True)
    os.chmod(path, mode)


def ledger_dir_ready(ledger_dir: str) -> None:
    """The node's shared ledger directory for the GPUs' groups: root's, 1777, marked as made
    for ledgers (docs/budgets.md, "Shared ledger directories")."""
    d = Path(ledger_dir)
    _root_dir(d, 0o1777)
    mark = d / fence_record.shared_mark()
    if mark.is_symlink() or (mark.exists() and mark.stat().st_uid != 0):
        mark.unlink()
    if not mark.exists():
        mark.touch(mode=0o444)


def job_path(env: Mapping[str, str]) -> Path:
    return Path(fence_record.jobs_dir()) / _job_id(env)


def prolog(
    env: Mapping[str, str],
    ledger_dir: str,
    shards_per_gpu: int,
    gpu_memory_bytes: int | None,
    on_exceed: str = "fail",
    on_fence_error: str = "refuse",
) -> list[str]:
    """What `cudatrace slurm-prolog` does (root, before the job's first task on the node): the
    job's fence record written whole, or, when the job cannot be fenced, a record that says
    why (its processes' CUDA is refused). Never fails the job (a failing Prolog drains the
    node). Returns lines for slurmd's log."""
    path = job_path(env)
    notes: list[str] = []
    try:
        _root_dir(path.parent, 0o755)
        ledger_dir_ready(ledger_dir)
    except (SlurmError, OSError) as e:
        notes.append(f"job {path.name}: {e}")
    try:
        gpus, shards = _gpus_and_shards(env, path.name)
        if not shards and (gpus is None or len(gpus) != 1):
            return notes  # no GPU, or whole GPUs: no other job shares them
        mem = gpu_memory_bytes
        if mem is None:
            mem = gpu_memory((gpus or [0])[0]) if gpus is None or len(gpus) == 1 else 1
        rec = job_fence(env, ledger_dir, shards_per_gpu, mem, on_exceed, on_fence_error,
                        (gpus, shards))  # fmt: skip
        if rec is None:
            return notes
    except SlurmError as e:
        notes.append(f"job {path.name} cannot be fenced: {e}; its CUDA will be refused")
        rec = _error_record(env, ledger_dir, on_fence_error, str(e))
    try:
        fence_record.write(path, fence_record.render(rec).text)
    except fence_record.FenceRecordError as e:
        notes.append(f"job {path.name}: {e}")
    return notes


def _error_record(
    env: Mapping[str, str], ledger_dir: str, on_fence_error: str, why: str
) -> FenceRecord:
    try:
        uid: int | None = _uid(env)
    except SlurmError:
        uid = None
    job = env.get("SLURM_JOB_ID", "")
    return FenceRecord(
        group="slurm", budget="1MiB", ledger_dir=ledger_dir, on_fence_error=on_fence_error,
        uid=uid, owner=f"slurm job {job}",
    ).with_error(f"the Slurm Prolog could not fence job {job}: {why}")  # fmt: skip


def epilog(env: Mapping[str, str]) -> list[str]:
    """What `cudatrace slurm-epilog` does (root, when the job ends on the node): its record
    removed. Processes the job left behind keep the fence they read."""
    try:
        job_path(env).unlink(missing_ok=True)
    except (SlurmError, OSError) as e:
        return [f"the job's fence record cannot be removed: {e}"]
    return []


# ---- the TaskProlog (the job's user, each task) ------------------------------------------------


def _expects_record(env: Mapping[str, str]) -> bool:
    """Whether the job shares a GPU, so that its Prolog must have written a record."""
    try:
        gpus = _gpu_indices(env)
    except SlurmError:
        return True
    return bool(_int_env(env, "SLURM_SHARDS_ON_NODE")) or (gpus is not None and len(gpus) == 1)


def _lowered(env: Mapping[str, str], rec: FenceRecord) -> tuple[FenceRecord, list[str]]:
    """The job's explicit request (CUDATRACE_SLURM_BUDGET) where it lowers its share (the
    environment may lower a sealed fence, never raise it); said when it cannot."""
    from ..record.budget import BudgetError, parse_size

    var = settings.name("SLURM_BUDGET")
    request = env.get(var, "").strip()
    held = rec.share_budget or 0
    if not request:
        return rec, []
    try:
        asked = parse_size(request)
    except BudgetError as e:
        return rec, [f"{var}={request} is not a size ({e}): the job's share applies"]
    if asked >= held:
        return rec, [
            f"{var}={request} is more than the job holds ({format_bytes(held)}): a share is a "
            "reservation, so the job gets what it holds"
        ]
    return replace(rec, share_budget=asked), []


def taskprolog(env: Mapping[str, str], shim: str) -> list[str]:
    """The lines `cudatrace slurm-taskprolog` prints: LD_PRELOAD (the library first) and the
    variables of the job's record, which the preload library reads for itself; the share
    lowered to CUDATRACE_SLURM_BUDGET. Never fails the task: a job that shares a GPU and has no
    usable record is told why, and its CUDA is refused."""
    preload = fence_record.preload(shim, env.get("LD_PRELOAD", ""))
    found = fence_record.find(env)
    if found is None:
        if not _expects_record(env):
            return []
        why = (
            f"no fence record for job {env.get('SLURM_JOB_ID', '?')} in "
            f"{fence_record.jobs_dir()}: the node's Prolog is not cudatrace slurm-prolog "
            "(docs/slurm.md)"
        )
        return Plan(
            {
                "LD_PRELOAD": preload,
                **settings.environment(FENCE_ERROR=why, ON_FENCE_ERROR="refuse"),
            },
            [f"{why}; CUDA is refused in this task"],
        ).lines()
    if found.record is None:
        return Plan(
            {"LD_PRELOAD": preload}, [f"{found.error}; CUDA is refused in this task"]
        ).lines()
    rec, notes = _lowered(env, found.record)
    if rec.fence_error:
        notes.append(f"{rec.fence_error}; CUDA is refused in this task")
    exports = dict(fence_record.render(rec, shim, env.get("LD_PRELOAD", "")).env)
    return Plan(exports, notes).lines()
