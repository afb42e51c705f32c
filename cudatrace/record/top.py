"""The box now, for `cudatrace top`: one snapshot value (record_types.TopSnapshot) of every GPU
with each process NVML lists and its figure, the budget groups (limit, in use, members, the
processes on their GPUs no ledger counts), the runs being traced with their top call sites,
the latest budget denials with the code that asked, and the watch's breaches.

The devices and groups are the watch's data (record/gpuview.py through record/fence.py's
watch_report: one NVML kept open between readings, one Watch so that its memory of contexts
and of processes joining their ledger carries over) and `status`'s ledgers
(record/ledger_status.py). The runs' sites are the analysis's (analyze/documents/live.py), a floor above
this one: the caller passes them down as a function (`runs`), so this floor reads no trace.

A process writes a run when it maps a trace file of that run's directory (the shim keeps the
file it writes mapped while it lives): what /proc says, not what its environment claims. The
runs looked at are those of the processes NVML lists and of the ledgers' members, and any
folder given (`traces`).

NVML alone (no ledger, no trace) gives the devices and processes; without NVML (no driver) the
snapshot says why, and the groups, runs and denials are still read.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from .. import procfs
from ..errors import CudatraceError
from ..record_types import (
    LedgerSnapshot,
    Status,
    TopDenial,
    TopDevice,
    TopGroup,
    TopGroupDevice,
    TopMember,
    TopProcess,
    TopRun,
    TopSnapshot,
    WatchDevice,
    WatchProcess,
    WatchReport,
)
from . import denials as denials_mod

# the runs being traced among some directories (trace directories, or folders of them), each
# as the analysis reads it now (analyze/documents/live.py Runs.among): passed down by the command
# and what could not be read of them
RunsReader = Callable[[Sequence[Path]], tuple[list[TopRun], list[str]]]
DENIALS = 8  # denials a snapshot keeps, the latest


def group_name(s: LedgerSnapshot) -> str:
    """How a ledger is named in the view: the reader's label, the group's name, or for a run's
    own budget (no group) "run of pid N"."""
    if s.get("label"):
        return s["label"]
    if s["private"] or not s["group"]:
        return s["name"].removesuffix(" (no group)")
    return s["group"]


class Gatherer:
    """Takes snapshots, one a call; keeps NVML open and the watch's memory between them.
    close() shuts NVML."""

    def __init__(
        self,
        runs: RunsReader | None = None,
        traces: Sequence[Path] = (),
        denials: int = DENIALS,
        nvml: bool = True,
    ) -> None:
        from ..nvml import Nvml
        from .watch import Watch

        self.runs = runs
        self.traces = [Path(os.path.realpath(p)) for p in traces]  # as maps name them
        self.denials = denials
        self.nv = Nvml() if nvml else None
        self.watch = Watch()

    def close(self) -> None:
        if self.nv is not None and self.nv.available:
            self.nv.shutdown()
        self.nv = None

    def snapshot(self) -> TopSnapshot:
        """The box as it is now."""
        from .ledger_status import status_json

        errors: list[str] = []
        try:
            st: Status = status_json()
        except CudatraceError as e:
            st = {"ledgers": [], "errors": []}
            errors.append(f"ledgers: {e}")
        errors += [f"{e['path']}: unusable: {e['error']}" for e in st["errors"]]
        rep = self._watch(st)
        names = {s["path"]: group_name(s) for s in st["ledgers"]}
        writes = _Writes()
        devices = [_device(d, names, writes) for d in rep["devices"]]
        groups = [_group(s, rep, writes) for s in st["ledgers"]]
        dirs = writes.dirs() + self.traces
        runs: list[TopRun] = []
        if self.runs is not None and dirs:
            runs, failed = self.runs(dirs)
            errors += failed
        return {
            "time": time.time(),
            "host": socket.gethostname(),
            "nvml": {"known": rep["known"], "why": rep["why"]},
            "devices": devices,
            "groups": groups,
            "runs": runs,
            "denials": _denials(groups, [Path(r["path"]) for r in runs] + dirs, self.denials),
            "findings": rep["findings"],
            "errors": errors,
        }

    def _watch(self, st: Status) -> WatchReport:
        from .fence import watch_report
        from .watch import unknown

        if self.nv is None:
            return unknown("NVML not read")
        if not self.nv.available:
            return unknown(self.nv.why)
        unusable = [e["path"] for e in st["errors"]]
        return watch_report(st["ledgers"], unusable=unusable, held=(self.nv, self.watch))


class _Writes:
    """pid -> the trace directory it writes (from its maps), each pid read once a snapshot."""

    def __init__(self) -> None:
        self._of: dict[int, str] = {}

    def __call__(self, pid: int) -> str:
        if pid not in self._of:
            found = procfs.trace_dirs(pid)
            self._of[pid] = found[0] if found else ""
        return self._of[pid]

    def dirs(self) -> list[Path]:
        return [Path(d) for d in dict.fromkeys(self._of.values()) if d]


def _process(p: WatchProcess, names: Mapping[str, str], writes: _Writes) -> TopProcess:
    m = p["member"]
    return {
        "pid": p["pid"],
        "gpu": p["gpu"],
        "bytes": p["bytes"],
        "command": p["command"],
        "fence": p["fence"],
        "group": (names.get(m["path"]) or m["group"]) if m else "",
        "counted": m["held"] if m and m["device"] >= 0 else None,
        "container": p["container"],
        "run": writes(p["pid"]) if p["fence"] != "not_visible" else "",
    }


def _device(d: WatchDevice, names: Mapping[str, str], writes: _Writes) -> TopDevice:
    return {
        "gpu": d["gpu"],
        "uuid": d["uuid"],
        "name": d["name"],
        "used": d["used"],
        "total": d["total"],
        "source": d["source"],
        "per_process": d["per_process"],
        "why": d["why"],
        "ledgers": d["ledgers"],
        "processes": [_process(p, names, writes) for p in d["processes"]],
    }


def _group(s: LedgerSnapshot, rep: WatchReport, writes: _Writes) -> TopGroup:
    ledger = s.get("label") or s["path"]  # gpuview's Source.name
    gpus = {
        p["device"]: p["gpu"]
        for p in rep["placements"]
        if p["ledger"] == ledger and p["slot"] == -1
    }
    devices: list[TopGroupDevice] = [
        {
            "device": r["device"],
            "gpu": gpus.get(r["device"]),
            "limit": r["limit"],
            "in_use": r["in_use"],
            "peak": r["peak"],
            "denials": r["denials"],
        }  # fmt: skip
        for r in s["devices"]
        if r["in_use"] or r["peak"] or r["denials"]
    ]
    if not devices and s["devices"]:
        r = s["devices"][0]  # an idle group: its budget on its first device
        devices = [{"device": r["device"], "gpu": gpus.get(r["device"]), "limit": r["limit"],
                    "in_use": 0, "peak": r["peak"], "denials": r["denials"]}]  # fmt: skip
    members: list[TopMember] = []
    for m in s["members"]:
        if m["state"] == "dead":
            continue
        st = procfs.proc_stat(m["pid"]) if not m.get("other_pidns") else None
        same = st is not None and (not m["start_ticks"] or st.start_ticks == m["start_ticks"])
        members.append(
            {
                "pid": m["pid"],
                "state": m["state"],
                "held": sum(r["held"] for r in m["devices"].values()),
                "denials": sum(r["denials"] for r in m["devices"].values()),
                "command": st.comm if same and st else "",
                "run": writes(m["pid"]) if same else "",
            }
        )
    on = {d["gpu"] for d in devices}
    unfenced = sorted(
        {
            p["pid"]
            for d in rep["devices"]
            if d["gpu"] in on
            for p in d["processes"]
            if p["fence"] == "unfenced"
        }  # fmt: skip
    )
    return {
        "name": group_name(s),
        "path": s["path"],
        "on_exceed": s["on_exceed"],
        "devices": devices,
        "members": members,
        "unfenced": unfenced,
    }


def _denials(groups: list[TopGroup], dirs: Iterable[Path], last: int) -> list[TopDenial]:
    """The latest denials: those the launchers kept in the runs' denials.jsonl (with the code
    that asked), and each member's count where no run of it kept any (the site then is only in
    the shim's line on that process's stderr)."""
    group_of = {m["pid"]: g["name"] for g in groups for m in g["members"]}
    out: list[TopDenial] = []
    kept: set[int] = set()
    for d in dict.fromkeys(os.path.normpath(p) for p in dirs):
        for x in denials_mod.recent(Path(d), last):
            pid = x["pid"]
            kept.add(pid)
            out.append(
                {
                    "wall_time": x.get("wall_time"),
                    "pid": pid,
                    "group": group_of.get(pid, ""),
                    "label": x.get("label") or "unknown call site",
                    "api": x.get("api", ""),
                    "bytes": x.get("bytes"),
                    "count": x.get("count", 1),
                    "device": x.get("device"),
                    "limit": x.get("limit"),
                    "in_use": x.get("in_use"),
                    "run": d,
                }
            )
    out.sort(key=lambda x: -(x["wall_time"] or 0.0))
    for g in groups:
        for m in g["members"]:
            if m["denials"] and m["pid"] not in kept:
                out.append(
                    {
                        "wall_time": None,
                        "pid": m["pid"],
                        "group": g["name"],
                        "label": None,
                        "api": "",
                        "bytes": None,
                        "count": m["denials"],
                        "device": None,
                        "limit": None,
                        "in_use": None,
                        "run": m["run"],
                    }  # fmt: skip
                )
    return out[:last]
