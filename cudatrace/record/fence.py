"""Fences set up outside the launcher, and the processes outside every fence.

- A run inside an integration's fence (a sealed fence record: a Slurm job's share of its GPU, a
  container's group, cudatrace/fence_record.py; or an environment that names a CUDATRACE_GROUP;
  docs/budgets.md): the run reports that budget, and `cudatrace run --budget` lowers it for its
  command without leaving it, so the other jobs on the GPU stay fenced from the command
  (docs/slurm.md). Inside a sealed fence the sealed record wins: the command's preload library
  reads it, and the run may only tighten it.
- Unfenced processes: the processes NVML lists on the GPUs that are live members of no ledger
  of the directory, whatever the reason (fencing could not be set up and
  CUDATRACE_ON_FENCE_ERROR=warn; a process that holds a context its fencing refused later; a
  process started without the preload library). `cudatrace status` and `cudatrace metrics`
  both call `unfenced`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import fence_record, native, settings
from ..record_types import LedgerSnapshot, Status, Unfenced, UnfencedProcess
from . import ledger as ledger_mod
from .budget import BudgetError, bytes_text, parse_size
from .ledger_status import status_json

SHARE_MAX = 8  # characters of a share name (ledger.h ct_ledger_set_share)


def sealed_fence(env: dict[str, str]) -> dict | None:
    """The sealed fence record of this process (the preload library's search), as env_fence
    says a fence, with "record" (the FenceRecord, None when it cannot be used: the command's
    library refuses its CUDA and says why) and "path"; None without one."""
    found = fence_record.find(env)
    if found is None:
        return None
    rec = found.record
    return {
        "group": rec.group if rec else None,
        "share": rec.share if rec else None,
        "share_limit": (rec.share_budget or 0) if rec else 0,
        "bound": fence_record.limit(rec) if rec else 0,  # what a run may lower
        "label": (rec.share_label or rec.share) if rec else None,
        "source": "sealed",
        "record": rec,
        "path": found.path,
        "ledger_dir": rec.ledger_dir if rec else None,
    }


def outer_fence(env: dict[str, str]) -> dict | None:
    """The fence a run's command is in: a sealed record's (which wins), else the
    environment's (env_fence)."""
    return sealed_fence(env) or env_fence(env)


def env_fence(env: dict[str, str]) -> dict | None:
    """The fence the environment puts a run's command in: {"group", "share", "share_limit",
    "label"}, or None when it names no group (or the launcher's own ledger names one)."""
    group = settings.value("GROUP", env)
    if not group or settings.value("LEDGER", env):
        return None
    share = settings.value("SHARE", env)
    share_budget = settings.value("SHARE_BUDGET", env)
    limit = 0
    if share and share_budget:
        try:
            limit = parse_size(share_budget)
        except BudgetError:
            limit = 0  # the preload library refuses it (and says why) in the command
    return {
        "group": group,
        "share": share,
        "share_limit": limit,
        "label": settings.value("SHARE_LABEL", env) or share,
        "source": "environment",
    }


def check_group(outer: dict, group: str | None) -> None:
    """A --group other than the fence's is refused: the command would leave the fence."""
    if group is not None and group != outer["group"]:
        by = (
            f"the sealed fence record {outer['path']}"
            if outer["source"] == "sealed"
            else f"{settings.name('GROUP')}, set by an integration such as a Slurm job"
        )
        raise BudgetError(
            f"this run is inside the fence of group {outer['group']} ({by}): --group {group} "
            "would take the command out of it; give --budget alone to lower the fence for "
            "this command",
            forms=False,
        )


def sealed_env(env: dict[str, str], outer: dict, on_exceed: str, count_host: bool) -> None:
    """A run's command inside a sealed fence: env says the record's fence (so its preload
    library has nothing to ignore), with the run's on-exceed where it is stricter and pinned
    host memory counted where the run asks; the launcher's own ledger never."""
    rec = outer["record"]
    env.pop(settings.name("LEDGER"), None)
    if rec is None:
        return
    env.update((k, v) for k, v in fence_record.render(rec).env if k != settings.name("FENCE_ERROR"))
    rank = {"warn": 0, "fail": 1, "abort": 2}
    if rank[on_exceed] > rank[rec.on_exceed or settings.default_text("ON_EXCEED")]:
        env[settings.name("ON_EXCEED")] = on_exceed
    env[settings.name("COUNT_HOST")] = "1" if count_host or rec.count_host else "0"
    if not count_host and not rec.count_host:
        env.pop(settings.name("COUNT_HOST"))


def nest(
    env: dict[str, str], outer: dict, limits: dict[int, int], pid: int
) -> tuple[dict, str | None]:
    """`cudatrace run --budget` inside a fence: the command stays a member of the fence's group
    and counts in a share bounded by the run's budget and the fence's share, whichever is lower
    (env is changed to say so). Returns (the budget info for run.json, a note or None)."""
    asked = min((n for n in limits.values() if n), default=0)
    bound = outer.get("bound") or outer["share_limit"]
    share = min(asked, bound) if bound else asked
    note = None
    if bound and asked > bound:
        note = (
            f"this run's --budget ({bytes_text(asked)} bytes) is above its fence's share "
            f"({outer['label'] or 'group ' + str(outer['group'])}: {bytes_text(bound)} bytes): "
            "the share bounds it"
        )
    info = dict(outer, share_limit=share, limits={str(d): share for d in limits})
    if not outer["share"] and bound and asked >= bound:
        return info, note  # nothing to lower: the command counts in the fence as it is
    name = outer["share"] or f"run{pid}"[-SHARE_MAX:]
    env.update(
        settings.environment(
            SHARE=name,
            SHARE_BUDGET=bytes_text(share),
            SHARE_LABEL=outer["label"] or f"cudatrace run {pid}",
        )
    )
    info["share"] = name
    return info, note


def outer_ledger(group: str, ledger_dir: str | None = None) -> ledger_mod.RunLedger | None:
    """The fence's group ledger as it is now (None when no process has made it yet), for the
    run's denial lines and its last figures: read (this user's part in a shared directory),
    never mapped. ledger_dir: a sealed record's."""
    try:
        if ledger_dir:  # the ledger's rule: this uid's part in a shared directory
            ffi, lib = native.tools()
            buf, err = ffi.new("char[]", 4096), ffi.new("char[]", 512)
            rc = lib.ct_ledger_group_path_at(ledger_dir.encode(), group.encode(), buf, 4096, 0,
                                             err, 512)  # fmt: skip
            if rc not in (lib.CT_LEDGER_OK, lib.CT_LEDGER_ENOENT):
                return None
            path = Path(ffi.string(buf).decode())
        else:
            path = ledger_mod.group_path(group, create_dir=False)
        if not path.exists():
            return None
        return ledger_mod.RunLedger(ledger_mod.Ledger.read(path), private=False)
    except ledger_mod.LedgerError:
        return None


# ---- unfenced processes ------------------------------------------------------------------------


def _pidns(pid: int | str) -> int:
    """The inode of a process's pid namespace (0: unknown)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return 0


def _nspid(pid: int) -> int | None:
    """The process's pid in its own (innermost) pid namespace, None when /proc cannot say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(errors="replace").strip()
    except OSError:
        return ""


def unfenced(ledgers: list[LedgerSnapshot]) -> Unfenced:
    """The processes NVML lists on the GPUs that are live members of none of `ledgers` (status
    snapshots: record/ledger_status.py status_json). {"known": NVML could say, "why": why not, "gpus":
    the NVML indices seen, "processes": [{"gpu", "pid", "bytes", "command"}], "not_visible":
    processes this pid namespace cannot see (not judged)}. A member of another pid namespace
    is matched through /proc/PID/status's NSpid and /proc/PID/ns/pid."""
    from ..nvml import Nvml

    nv = Nvml()
    if not nv.available:
        return {"known": False, "why": nv.why, "gpus": [], "processes": [], "not_visible": 0}
    try:
        per_gpu = nv.processes()
        gpus = [i for i, _ in nv.handles]
    finally:
        nv.shutdown()
    mine = _pidns("self")
    members = {
        (m.get("pidns") or mine, m["pid"])
        for s in ledgers
        for m in s.get("members", [])
        if m.get("state") != "dead"
    }
    out: list[UnfencedProcess] = []
    hidden = 0
    for gpu, procs in sorted(per_gpu.items()):
        for pid, used in sorted(procs.items()):
            if (mine, pid) in members:
                continue
            ns, inner = _pidns(pid), _nspid(pid)
            if not ns:
                hidden += 1  # not in this pid namespace: cannot be judged from here
                continue
            if inner is not None and (ns, inner) in members:
                continue
            out.append({"gpu": gpu, "pid": pid, "bytes": int(used), "command": _comm(pid)})
    return {"known": True, "why": None, "gpus": gpus, "processes": out, "not_visible": hidden}


def status_with_unfenced(group: str | None = None) -> Status:
    """status_json's data with "unfenced" (of the whole directory): what `cudatrace metrics`
    serves."""
    st = status_json(group)
    st["unfenced"] = unfenced(st["ledgers"]) if group is None else None
    return st
