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
  process started without the preload library), and the watch's breaches beside them
  (record/watch.py: members holding more than their ledger counts, groups over budget by
  NVML's count). `cudatrace status` and `cudatrace metrics` both call
  `status_with_unfenced`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from .. import fence_record, native, settings
from ..record_types import (
    BudgetInfo,
    LedgerSnapshot,
    Status,
    Unfenced,
    UnfencedProcess,
    WatchReport,
)
from . import ledger as ledger_mod
from .budget import BudgetError, bytes_text, parse_size
from .ledger_status import status_json

if TYPE_CHECKING:
    from ..nvml import Nvml
    from .gpuview import Source
    from .watch import Watch

SHARE_MAX = 8  # characters of a share name (ledger.h ct_ledger_set_share)


class _FenceRequired(TypedDict):
    group: str | None  # None: a sealed record that cannot be used
    share: str | None
    share_limit: int  # bytes of the share (0: none)
    label: str | None
    source: Literal["sealed", "environment"]


class Fence(_FenceRequired, total=False):
    """The fence a run's command is in (outer_fence); a sealed record's has the rest."""

    bound: int  # what a run may lower (fence_record.limit)
    record: fence_record.FenceRecord | None  # None: the command's library refuses its CUDA
    path: str  # the record's
    ledger_dir: str | None


def sealed_fence(env: Mapping[str, str]) -> Fence | None:
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


def outer_fence(env: Mapping[str, str]) -> Fence | None:
    """The fence a run's command is in: a sealed record's (which wins), else the
    environment's (env_fence)."""
    return sealed_fence(env) or env_fence(env)


def env_fence(env: Mapping[str, str]) -> Fence | None:
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


def check_group(outer: Fence, group: str | None) -> None:
    """A --group other than the fence's is refused: the command would leave the fence."""
    if group is not None and group != outer["group"]:
        by = (
            f"the sealed fence record {outer.get('path')}"
            if outer["source"] == "sealed"
            else f"{settings.name('GROUP')}, set by an integration such as a Slurm job"
        )
        raise BudgetError(
            f"this run is inside the fence of group {outer['group']} ({by}): --group {group} "
            "would take the command out of it; give --budget alone to lower the fence for "
            "this command",
            forms=False,
        )


def sealed_env(
    env: MutableMapping[str, str], outer: Fence, on_exceed: str, count_host: bool
) -> None:
    """A run's command inside a sealed fence: env says the record's fence (so its preload
    library has nothing to ignore), with the run's on-exceed where it is stricter and pinned
    host memory counted where the run asks; the launcher's own ledger never."""
    rec = outer.get("record")
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
    env: MutableMapping[str, str], outer: BudgetInfo, limits: Mapping[int, int], pid: int
) -> tuple[BudgetInfo, str | None]:
    """`cudatrace run --budget` inside a fence: the command stays a member of the fence's group
    and counts in a share bounded by the run's budget and the fence's share, whichever is lower
    (env is changed to say so). Returns (the budget info for run.json, a note or None)."""
    asked = min((n for n in limits.values() if n), default=0)
    bound = outer.get("bound") or outer.get("share_limit", 0)
    share = min(asked, bound) if bound else asked
    note = None
    if bound and asked > bound:
        note = (
            f"this run's --budget ({bytes_text(asked)} bytes) is above its fence's share "
            f"({outer.get('label') or 'group ' + str(outer.get('group'))}: {bytes_text(bound)} "
            "bytes): "
            "the share bounds it"
        )
    info = outer.copy()
    info["share_limit"] = share
    info["limits"] = {str(d): share for d in limits}
    if not outer.get("share") and bound and asked >= bound:
        return info, note  # nothing to lower: the command counts in the fence as it is
    name = outer.get("share") or f"run{pid}"[-SHARE_MAX:]
    env.update(
        settings.environment(
            SHARE=name,
            SHARE_BUDGET=bytes_text(share),
            SHARE_LABEL=outer.get("label") or f"cudatrace run {pid}",
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


# ---- unfenced processes and the watch -----------------------------------------------------------


def unfenced_of(rep: WatchReport) -> Unfenced:
    """The processes of the watch's view that are members of no ledger, on any GPU: {"known":
    NVML could say, "why": why not, "gpus": the NVML indices seen, "processes": [{"gpu",
    "pid", "bytes" (None: NVML gives no figure), "command"}], "not_visible": processes this
    pid namespace cannot see (not judged)}."""
    if not rep["known"]:
        return {"known": False, "why": rep["why"], "gpus": [], "processes": [], "not_visible": 0}
    out: list[UnfencedProcess] = [
        {"gpu": p["gpu"], "pid": p["pid"], "bytes": p["bytes"], "command": p["command"]}
        for d in rep["devices"]
        for p in d["processes"]
        if p["fence"] == "unfenced"
    ]
    gpus = [d["gpu"] for d in rep["devices"]]
    return {"known": True, "why": None, "gpus": gpus, "processes": out,
            "not_visible": rep["not_visible"]}  # fmt: skip


def _sources(ledgers: list[LedgerSnapshot]) -> list[Source]:
    """The snapshots with their files' keys (a group of users' parts: every part's)."""
    from .gpuview import Source, file_keys

    def keys(s: LedgerSnapshot) -> frozenset[tuple[str, int]]:
        paths = [p["path"] for p in s.get("parts") or []] or [s["path"]]
        return frozenset().union(*(file_keys(p) for p in paths))

    return [Source(s, keys(s)) for s in ledgers]


def watch_report(
    ledgers: list[LedgerSnapshot],
    reread: bool = True,
    unusable: Sequence[str] = (),
    held: tuple[Nvml, Watch] | None = None,
) -> WatchReport:
    """The watch's view of this host's GPUs beside `ledgers` (status snapshots), its breaches
    confirmed by reading the directory's ledgers again (reread); the members of `unusable`
    ledgers (paths) are not fenced by them. A process that maps a ledger of another directory
    is a member elsewhere: not judged from here (the node agent sees every ledger). `held`: an
    NVML the caller keeps open and the Watch it keeps between readings (`cudatrace top`);
    otherwise NVML is opened and shut for this one reading."""
    from ..nvml import Nvml
    from . import watch as watch_mod
    from .gpuview import file_keys

    nv, watch = held if held is not None else (Nvml(), None)
    first = [True]

    def sources() -> list[Source]:
        if first[0] or not reread:
            first[0] = False
            return _sources(ledgers)
        return _sources(status_json()["ledgers"])

    try:
        known = frozenset().union(*(file_keys(p) for p in unusable))
        where = watch_mod.Where(fallback=_visible_fallback(), known=known)
        return watch_mod.report(sources, nv, watch=watch, where=where)
    finally:
        if nv.available and held is None:
            nv.shutdown()


def _visible_fallback() -> Callable[[int], int | None]:
    """A CUDA ordinal -> NVML index through this process's CUDA_VISIBLE_DEVICES (an index;
    a UUID is left to the view's own pairing)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")

    def of(d: int) -> int | None:
        if vis is None:
            return d
        items = [x.strip() for x in vis.split(",") if x.strip()]
        return int(items[d]) if 0 <= d < len(items) and items[d].isdigit() else None

    return of


def unfenced(ledgers: list[LedgerSnapshot]) -> Unfenced:
    """The processes NVML lists on the GPUs that are live members of none of `ledgers` (status
    snapshots: record/ledger_status.py status_json); see unfenced_of. A member of another pid
    namespace is matched through /proc/PID/status's NSpid and /proc/PID/ns/pid."""
    return unfenced_of(watch_report(ledgers, reread=False))


def status_with_unfenced(group: str | None = None) -> Status:
    """status_json's data with "unfenced" and "watch" (of the whole directory; None for a
    GROUP): what `cudatrace status` shows and `cudatrace metrics` serves."""
    st = status_json(group)
    if group is None:
        rep = watch_report(st["ledgers"], unusable=[e["path"] for e in st["errors"]])
        st["watch"] = rep
        st["unfenced"] = unfenced_of(rep)
    else:
        st["watch"] = st["unfenced"] = None
    return st
