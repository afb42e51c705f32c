"""Each GPU as NVML sees it beside what the ledgers count: per device, the processes holding
memory there with NVML's figure, the ledger slot that counts each (its figure, its group's
budget) or none, the container its cgroup names; the device's memory and what the ledgers
count on it. The one data layer of the watch (record/watch.py judges it: `cudatrace node`,
`status`, `metrics`) and of a live view of the node.

    view(sources, readings, proc) -> WatchReport (findings empty)

A process NVML lists (by host pid) is a member of a ledger when /proc says it is the process
the ledger's slot names: the same pid in the same pid namespace (its NSpid and ns/pid inode),
the same start time, and, where its maps can be read, it maps that very ledger file (a slot is
written by its member: a tenant could write another process's pid into a slot of its own).

Which GPU a member's CUDA ordinal names: the GPUs whose NVML list has its host pid; one GPU
with at most one ordinal used pairs them exactly, several in NVML's index order (CUDA's with
CUDA_DEVICE_ORDER=PCI_BUS_ID: docs/containers.md). A group's ordinal names the GPU its members'
name; else the one GPU of a one-GPU node, else `fallback` (the reader's CUDA_VISIBLE_DEVICES).

Where NVML gives no per-process figure (an integrated GPU such as a Jetson Thor, a MIG
instance, a driver without the query) the processes it lists keep `bytes` None, never 0, and
the device says why; its memory is NVML's figure, or on a GPU that shares the host's memory
(NVML answers NOT_SUPPORTED) the kernel's: MemTotal less MemAvailable, the CPU's use included.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import cgroups, procfs
from ..nvml import DeviceReading
from ..record_types import (
    LedgerMember,
    LedgerSnapshot,
    WatchDevice,
    WatchMember,
    WatchPlacement,
    WatchProcess,
    WatchReport,
)

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED: what an integrated GPU answers to memory queries
SHIM_NAME = "/libcudatrace.so"  # the preload library, as a process's maps name it


@dataclass
class Source:
    """A ledger's snapshot, and the (device "maj:min", inode) of its file(s) as /proc/PID/maps
    names them (empty: members are matched without looking at their maps)."""

    snap: LedgerSnapshot
    keys: frozenset[tuple[str, int]] = frozenset()

    @property
    def name(self) -> str:
        """The ledger's id in a view: the reader's label for it, else its path."""
        return self.snap.get("label") or self.snap["path"]

    @property
    def group(self) -> str:
        """How the group is named to people: the reader's label, else the group's name."""
        return self.snap.get("label") or self.snap["group"] or Path(self.snap["path"]).stem


def file_keys(path: str | Path) -> frozenset[tuple[str, int]]:
    """The maps key of a file (empty when it cannot be stat'ed from here)."""
    try:
        st = os.stat(path)
    except OSError:
        return frozenset()
    return frozenset({(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", st.st_ino)})


@dataclass
class _Seen:
    """One host pid NVML lists, as /proc shows it, and the member it is (if any)."""

    stat: procfs.ProcStat | None
    container: str = ""
    member: tuple[int, LedgerMember] | None = None  # (source index, member)
    shim: bool = False  # maps the preload library (a member joins at its first counted call)
    elsewhere: bool = False  # maps a ledger the view did not read (made since, or elsewhere)
    gpus: list[int] = field(default_factory=list)  # NVML indices listing it, in order
    ordinals: dict[int, int] = field(default_factory=dict)  # gpu -> the member's CUDA ordinal


def _members(
    sources: Sequence[Source], mine: int
) -> dict[tuple[int, int], list[tuple[int, LedgerMember]]]:
    """(pidns, pid) -> [(source index, member)] of the members alive or unknown."""
    out: dict[tuple[int, int], list[tuple[int, LedgerMember]]] = {}
    for i, s in enumerate(sources):
        for m in s.snap["members"]:
            if m["state"] != "dead":
                out.setdefault((m.get("pidns") or mine, m["pid"]), []).append((i, m))
    return out


def _match(
    st: procfs.ProcStat,
    cands: list[tuple[int, LedgerMember]],
    sources: Sequence[Source],
    proc: str,
) -> tuple[int, LedgerMember] | None:
    maps: set[tuple[str, int]] | None = None
    read = False
    fits: list[tuple[int, LedgerMember]] = []
    for i, m in cands:
        if m["start_ticks"] and st.start_ticks and m["start_ticks"] != st.start_ticks:
            continue
        if sources[i].keys:
            if not read:
                maps, read = procfs.ledger_maps(st.pid, proc), True
            if maps is not None and not (maps & sources[i].keys):
                continue  # it does not map that ledger: the slot names it falsely
        fits.append((i, m))

    def held(im: tuple[int, LedgerMember]) -> int:
        return sum(r["held"] for r in im[1]["devices"].values())

    return max(fits, key=held) if fits else None


def _ordinals(member: LedgerMember, gpus: list[int]) -> dict[int, int]:
    """gpu -> the member's CUDA ordinal on it (agent.py's pairing, per member)."""
    used = sorted(int(d) for d, r in member["devices"].items() if r["held"] or r["context"])
    if len(gpus) == 1:
        return {gpus[0]: used[0] if used else 0} if len(used) <= 1 else {}
    return {g: k for k, g in enumerate(sorted(gpus))}


def _see(
    readings: Sequence[DeviceReading],
    sources: Sequence[Source],
    proc: str,
    known: frozenset[tuple[str, int]],
) -> dict[int, _Seen]:
    known = known.union(*(s.keys for s in sources))
    mine = procfs.proc_stat(os.getpid(), "/proc")
    members = _members(sources, mine.pidns if mine else 0)
    seen: dict[int, _Seen] = {}
    for r in readings:
        for pid in sorted(r.procs or {}):
            s = seen.get(pid)
            if s is None:
                st = procfs.proc_stat(pid, proc)
                s = seen[pid] = _Seen(st)
                if st is not None:
                    s.container = cgroups.parse(procfs.cgroup_of(pid, proc)).container
                    cands = members.get((st.pidns, st.ns_pid), [])
                    s.member = _match(st, cands, sources, proc) if cands else None
                    if s.member is None:
                        s.shim = procfs.maps_name(SHIM_NAME, pid, proc)
                        maps = procfs.ledger_maps(pid, proc) or set()
                        s.elsewhere = bool(maps - known)
            s.gpus.append(r.index)
    for s in seen.values():
        if s.member is not None:
            s.ordinals = _ordinals(s.member[1], s.gpus)
    return seen


def _placements(
    sources: Sequence[Source],
    seen: Mapping[int, _Seen],
    gpus: list[int],
    fallback: Callable[[int], int | None],
) -> list[WatchPlacement]:
    """Members' ordinals (from NVML's lists) and groups' (their members' GPU where they agree;
    the one GPU of the node; fallback)."""
    out: list[WatchPlacement] = []
    by_group: dict[tuple[int, int], set[int]] = {}
    for s in seen.values():
        if s.member is None:
            continue
        i, m = s.member
        for g, d in sorted(s.ordinals.items()):
            out.append({"ledger": sources[i].name, "slot": m["slot"], "device": d, "gpu": g})
            by_group.setdefault((i, d), set()).add(g)
    for i, src in enumerate(sources):
        ords = {r["device"] for r in src.snap["devices"]}
        ords |= {int(d) for m in src.snap["members"] for d in m["devices"]}
        for d in sorted(ords):
            named = by_group.get((i, d), set())
            at: int | None = next(iter(named)) if len(named) == 1 else None
            if at is None and not named:
                at = gpus[0] if len(gpus) == 1 else fallback(d)
            if at is not None:
                out.append({"ledger": src.name, "slot": -1, "device": d, "gpu": at})
    return out


def _member_row(src: Source, m: LedgerMember, d: int) -> WatchMember:
    row = m["devices"].get(d) or {"held": 0, "context": 0}
    limits = {r["device"]: r["limit"] for r in src.snap["devices"]}
    return {
        "group": src.group,
        "ledger": src.name,
        "path": src.snap["path"],
        "slot": m["slot"],
        "device": d,
        "held": row["held"],
        "allocations": max(0, row["held"] - row["context"]),
        "context": row["context"],
        "limit": limits.get(d, 0),
        "on_exceed": src.snap["on_exceed"],
        "share": m.get("share") or "",
    }


def _process(
    pid: int, used: int | None, r: DeviceReading, s: _Seen, sources: Sequence[Source]
) -> WatchProcess:
    row: WatchProcess = {
        "pid": pid,
        "gpu": r.index,
        "bytes": used,
        "command": s.stat.comm if s.stat else "",
        "fence": "not_visible" if s.stat is None else "elsewhere" if s.elsewhere else "unfenced",
        "member": None,
        "container": s.container,
        "shim": s.shim,
    }
    if s.member is not None and r.index in s.ordinals:
        i, m = s.member
        row["fence"] = "member"
        row["member"] = _member_row(sources[i], m, s.ordinals[r.index])
    elif s.member is not None:
        row["fence"] = "member"  # a member whose ordinal here cannot be told: counted somewhere
        row["member"] = _member_row(sources[s.member[0]], s.member[1], -1)
    return row


def _memory(r: DeviceReading) -> tuple[int | None, int | None, str | None]:
    """(used, total, source): NVML's; on a GPU of the host's memory, the kernel's."""
    if r.used is not None:
        return r.used, r.total, "nvml"
    if r.memory_rc == NOT_SUPPORTED:
        mi = procfs.meminfo(("MemTotal", "MemAvailable"))
        if "MemTotal" in mi and "MemAvailable" in mi:
            return mi["MemTotal"] - mi["MemAvailable"], mi["MemTotal"], "meminfo"
    return None, None, None


def _device(
    r: DeviceReading,
    seen: Mapping[int, _Seen],
    sources: Sequence[Source],
    placements: list[WatchPlacement],
) -> WatchDevice:
    procs = [_process(pid, used, r, seen[pid], sources) for pid, used in sorted((r.procs or {}).items())]  # fmt: skip
    names = {s.name: s for s in sources}
    ledgers = 0
    for p in placements:
        if p["slot"] == -1 and p["gpu"] == r.index and p["ledger"] in names:
            rows = names[p["ledger"]].snap["devices"]
            ledgers += sum(x["in_use"] for x in rows if x["device"] == p["device"])
    used, total, source = _memory(r)
    return {
        "gpu": r.index,
        "uuid": r.uuid,
        "name": r.name,
        "per_process": r.per_process,
        "reason": r.procs_reason,
        "why": r.procs_why,
        "listed": r.procs is not None,
        "used": used,
        "total": total,
        "source": source,
        "ledgers": ledgers,
        "context": max((p["member"]["context"] for p in procs if p["member"]), default=0),
        "fenced": ledgers > 0 or any(p["fence"] == "member" for p in procs),
        "processes": procs,
    }


def view(
    sources: Sequence[Source],
    readings: Sequence[DeviceReading],
    proc: str = "/proc",
    fallback: Callable[[int], int | None] = lambda d: None,
    known: frozenset[tuple[str, int]] = frozenset(),
) -> WatchReport:
    """The devices NVML read (readings: nvml.Nvml.read()) beside the ledgers (sources), each
    process looked up in `proc`. A process that is no member of them but maps a ledger file
    that is none of theirs nor of `known` (ledgers the caller could not read) is a member
    "elsewhere": of a ledger made since they were read, or of another directory's."""
    seen = _see(readings, sources, proc, known)
    placements = _placements(sources, seen, [r.index for r in readings], fallback)
    devices = [_device(r, seen, sources, placements) for r in readings]
    hidden = sum(1 for p in seen.values() if p.stat is None)
    return {
        "known": True,
        "why": None,
        "devices": devices,
        "findings": [],
        "placements": placements,
        "not_visible": hidden,
        "tolerance": 0,
    }
