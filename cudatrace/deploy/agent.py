"""`cudatrace node`: the node agent, one process per GPU host (a systemd unit or a DaemonSet).

At start, and again when the groups config changes, it does what `cudatrace cdi` does: installs
the preload library (versioned, atomic), makes the named groups' ledger directories, writes
the CDI specs. Then, every --interval seconds, one pass:

- **ledgers**: every ledger some process on the node maps (procscan.py), wherever it lives (a
  group's host directory, a container's tmpfs, a pod's emptyDir), opened through the member's
  own mapping and read with pread, never mapped (a ledger a tenant truncates, grows, garbles or
  replaces is skipped, said once, and listed in what the metrics count as errors); the parts of
  one group (one file per user in a shared directory) are published as one group;
- **contexts**: a member in another pid namespace cannot find itself in NVML's list (NVML names
  host pids), so its CUDA context would count for nothing. The agent maps each such member to
  its host pid (the pid in its namespace and its start time, among the processes that map that
  ledger), reads NVML's figure for it and counts what is not allocations as its context
  (ct_ledger_set_member_context). A reading can be high only if an allocation was made and freed
  between the two reads of the ledger around it; the agent counts the smaller of its last two
  readings, so such a moment is never counted;
- **identities**: who each process is, from its cgroup, confirmed by the API server
  (identity.py); only a verified pod is named in a label or sent an Event, and an environment
  that claims another pod is said, once;
- **denials**: a member's denial counter that grew is said on stderr and, on Kubernetes, as an
  Event of the pod (kube.py); a process given a budget that uses CUDA without the preload
  library (it could not be loaded) likewise, once;
- **the watch**: NVML's figures against the ledgers' (record/watch.py): a member holding more
  than its ledger counts, a process without a fence on a GPU fenced processes use, a group over
  its budget by NVML's count; each said once and sent as an Event to its verified pod, and with
  --enforce the process is stopped (enforce.py);
- **groups gone**: the directory of a group no longer offered is removed once no member lives;
- **metrics**: the budgets' metrics (present/metrics.py) with namespace/pod/container labels
  and the GPUs' `gpu` and `UUID`, the watch's, served as of the last pass (agentserve.py:
  over HTTPS with --metrics-cert, to whom the API server authorizes with --metrics-auth
  kubernetes), beside /healthz (a pass finished lately: liveness) and /readyz (the first pass
  is done: readiness).

Events wait in a queue while the API server cannot take them (kube.EventQueue): tried again at
later passes, after growing pauses.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

from .. import native, procfs, settings
from ..nvml import DeviceReading, Nvml
from ..record import watch as watch_mod
from ..record.fence import unfenced_of
from ..record.gpuview import Source
from ..record.ledger import Ledger, LedgerError, part_of
from ..record.ledger_status import merge_parts
from ..record_types import (
    LedgerMember,
    LedgerSnapshot,
    Status,
    UnusableLedger,
    WatchFinding,
    WatchProcess,
    WatchReport,
)
from ..units import format_bytes
from . import cdi, install, plan, procscan
from .enforce import GRACE_S, Enforcer, Stopping
from .identity import Identities, Identity
from .kube import EventQueue, Kube

GC_EVERY = 30  # passes between two looks for installs nobody uses
STATUS_FILE = "node-status.json"  # in --state: the last pass, for `cudatrace status --node`
UNMAPPED_PASSES = 3  # a member's denials wait this many passes for its process to be seen
EVENT_REASON_DENIED = "GPUMemoryBudgetExceeded"
EVENT_REASON_UNFENCED = "GPUMemoryBudgetNotEnforced"
EVENT_REASONS = {  # the watch's breaches (record/watch.py)
    "outside_ledger": "GPUMemoryOutsideBudget",
    "unfenced": EVENT_REASON_UNFENCED,
    "group_over_budget": "GPUMemoryGroupOverBudget",
}
EVENT_REASON_STOPPED = "GPUMemoryProcessStopped"


@dataclass
class Config:
    """What `cudatrace node` was told (commands/node.py builds it)."""

    budgets: tuple[str, ...] = ()
    groups: Path | None = None
    on_exceed: str = "fail"
    root: Path = Path(plan.DEFAULT_ROOT)
    state: Path = Path(plan.DEFAULT_STATE)
    cdi_dir: Path | None = Path(plan.DEFAULT_CDI_DIR)
    vendor: str = plan.VENDOR
    preload: str = "file"
    shim: Path | None = None
    interval: float = 2.0
    node: str = ""
    kube: Kube | None = None
    proc: Path = Path("/proc")
    enforce: bool = False  # stop the processes of the watch's breaches
    grace: float = GRACE_S  # seconds between SIGTERM and SIGKILL
    margin: int = watch_mod.MARGIN  # a member's tolerance with a counted context
    once: bool = False  # one read-only pass (no housekeeping; nothing written)


_Slot = tuple[int, int, int]  # a member: (slot, pid, start ticks)
_SlotDevice = tuple[int, int, int, int]  # a member on a CUDA ordinal
_GroupKey = tuple[Union[str, int], ...]  # ("file", dev, ino) or ("group", dev, dir, group)


@dataclass
class Tracked:
    """A ledger the agent has open, and what it remembers of its members."""

    ledger: Ledger
    mapping: procscan.Mapping
    denials: dict[_SlotDevice, int] = field(default_factory=dict)
    readings: dict[_SlotDevice, list[int]] = field(default_factory=dict)
    unmapped: dict[_Slot, int] = field(default_factory=dict)  # passes a member went unmapped
    unreadable: str | None = None  # why it could not be read at the last pass (said once)


def _member_key(m: LedgerMember) -> _Slot:
    return (m["slot"], m["pid"], m["start_ticks"])


def _known_figures(readings: list[DeviceReading] | None) -> dict[int, dict[int, int]] | None:
    """NVML index -> {host pid: bytes} of the processes NVML gives a figure for."""
    if readings is None:
        return None
    return {r.index: {p: b for p, b in (r.procs or {}).items() if b is not None} for r in readings}


Parts = tuple[list["Tracked"], LedgerSnapshot]  # a group's parts (one ledger, most often), merged


def _member_key_of(p: WatchProcess) -> tuple[str, int, int] | None:
    m = p["member"]
    return None if m is None else (m["ledger"], m["slot"], m["device"])


class Agent:
    def __init__(
        self, cfg: Config, say: Callable[[str], None] | None = None, nvml: Nvml | None = None
    ):
        self.cfg = cfg
        self.say = say or (lambda line: print(f"cudatrace node: {line}", file=sys.stderr))
        self.nvml = nvml
        self.tracked: dict[tuple[str, int], Tracked] = {}
        self.offered: list[plan.Fence] = []
        self.installed: install.Installed | None = None
        self.groups_mtime: float | None = None
        self.unfenced_seen: set[tuple[int, int]] = set()
        self.unfenced: list[procscan.Proc] = []
        self.open_errors: dict[tuple[str, int], tuple[str, str]] = {}  # key -> (path, why)
        self.contexts_counted = 0
        self.passes = 0
        self.pass_ended: float | None = None  # time.monotonic() at the end of the last pass
        self.events = EventQueue(cfg.kube, self.say) if cfg.kube is not None else None
        self.watch = watch_mod.Watch(cfg.margin)
        post = self.events.post if self.events is not None else None
        self.ids = Identities(cfg.kube, cfg.node, self.say, str(cfg.proc), post)
        self.breaches: dict[watch_mod.Key, WatchFinding] = {}  # said, while they last
        self.stopped: dict[tuple[str, str, str], int] = {}  # (gpu, UUID, kind) -> processes
        self.enforcer = (
            Enforcer(self.say, cfg.grace, str(cfg.proc), self._stopped) if cfg.enforce else None
        )
        self._lock = threading.Lock()
        self._published: Status = {"ledgers": [], "errors": []}

    # ---- set-up ---------------------------------------------------------------------------

    def prepare(self) -> None:
        """Install, make the groups' directories, write the specs (start, config changed)."""
        c = self.cfg
        self.offered = plan.fences(c.budgets, c.groups, c.on_exceed, required=False)
        self.installed, _, written = cdi.prepare(
            self.offered, c.root, c.state, c.cdi_dir, c.vendor, c.preload, c.shim
        )
        self.groups_mtime = self._groups_mtime()
        names = ", ".join(f"{c.vendor}/{f.kind}={f.name}" for f in self.offered) or "no device"
        self.say(f"preload library {self.installed.lib}; offering {names}")
        for p in written:
            self.say(f"wrote {p}")

    def _groups_mtime(self) -> float | None:
        try:
            return os.stat(self.cfg.groups).st_mtime if self.cfg.groups else None
        except OSError:
            return None

    def _reload(self) -> None:
        if self.cfg.groups is None or self._groups_mtime() == self.groups_mtime:
            return
        try:
            self.prepare()
        except Exception as e:  # a config being edited: keep what is offered, say why
            self.groups_mtime = self._groups_mtime()
            self.say(f"groups config not taken: {e}")

    # ---- one pass ---------------------------------------------------------------------------

    def cycle(self) -> None:
        if self.events is not None:
            self.events.flush()
        self._reload()
        scan = procscan.scan(self.cfg.proc)
        self._track(scan)
        readings = self._nvml_read()
        self._identify(scan, readings)
        nv = _known_figures(readings)
        out: list[LedgerSnapshot] = []
        keyed: list[tuple[list[Tracked], LedgerSnapshot]] = []  # a group's parts, merged
        errors: list[UnusableLedger] = [
            {"path": p, "error": e} for p, e in self.open_errors.values()
        ]
        labels_used: set[str] = set()
        groups: dict[_GroupKey, list[tuple[Tracked, LedgerSnapshot]]] = {}
        for _key, t in sorted(self.tracked.items(), key=lambda kv: kv[0]):
            try:
                snap = t.ledger.snapshot()
                if nv is not None and self._contexts(t, snap, nv):
                    snap = t.ledger.snapshot()
                self._denials(t, snap)
            except LedgerError as e:
                self._unreadable(t, str(e))
                errors.append({"path": t.mapping.path, "error": str(e)})
                continue
            if t.unreadable is not None:
                self.say(f"the ledger {t.mapping.path} reads again")
                t.unreadable = None
            groups.setdefault(self._group_key(t, snap), []).append((t, snap))
        own = self._own_ledgers()
        # this node's named groups take their names first: a ledger anywhere else that calls
        # itself by one of them (a tenant can write any name into its own) is labelled `<name>#2`
        for parts in sorted(
            groups.values(), key=lambda ps: all(t.mapping.key not in own for t, _ in ps)
        ):
            labels = [self._labels_of(t, s) for t, s in parts]
            snap = merge_parts([s for _, s in parts], labels)
            snap["label"] = self._label(snap, parts[0][0], labels_used)
            out.append(snap)
            keyed.append(([t for t, _ in parts], snap))
        self._report_unfenced(scan)
        rep = self._watch(keyed, readings)
        self._act(rep)
        self.passes += 1
        if not self.cfg.once:
            self._forget_groups()
            if self.passes % GC_EVERY == 1:
                self._gc_installs()
        with self._lock:
            self._published = {"ledgers": out, "errors": errors, "watch": rep,
                               "unfenced": unfenced_of(rep)}  # fmt: skip
        self.pass_ended = time.monotonic()
        if not self.cfg.once:
            self._write_status()

    def _write_status(self) -> None:
        """The pass's view for `cudatrace status --node` (STATUS_FILE in --state, root's 0600:
        it names pids and pods); where --state is not there yet, nothing."""
        import json

        from ..outputs import OutputError, write_output

        path = self.cfg.state / STATUS_FILE
        if not self.cfg.state.is_dir():
            return
        try:
            write_output(path, json.dumps(self.published()))
        except OutputError as e:
            if self.passes == 1:
                self.say(f"cannot write {path}: {e}")

    def finish(self) -> None:
        """Wait for the stops under way (--enforce), then close the ledgers."""
        if self.enforcer is not None:
            self.enforcer.wait()
        for t in self.tracked.values():
            t.ledger.close()
        self.tracked.clear()

    def _own_ledgers(self) -> set[tuple[str, int]]:
        """(device as /proc/PID/maps writes it, inode) of each ledger in this node's named
        groups' directories (<state>/groups/<name>/, made by the agent, root's)."""
        out: set[tuple[str, int]] = set()
        base = self.cfg.state.absolute() / cdi.GROUPS_DIR
        try:
            dirs = [d for d in os.scandir(base) if d.is_dir(follow_symlinks=False)]
        except OSError:
            return out
        for d in dirs:
            try:
                files = [f for f in os.scandir(d.path) if f.name.endswith(".ledger")]
                for f in files:
                    st = f.stat(follow_symlinks=False)
                    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
                    out.add((dev, st.st_ino))
            except OSError:
                continue
        return out

    def _unreadable(self, t: Tracked, why: str) -> None:
        """A ledger that cannot be read now (a tenant truncated, grew, garbled or replaced it):
        skipped this pass, said once."""
        if t.unreadable != why:
            self.say(f"skipping the ledger {t.mapping.path}: {why}")
        t.unreadable = why

    @staticmethod
    def _group_key(t: Tracked, snap: LedgerSnapshot) -> _GroupKey:
        """The parts of one group (a user's part, <group>@<uid>.ledger, in one directory of one
        file system) share a key; any other ledger is its own."""
        group, uid = part_of(Path(t.mapping.path))
        if uid is None or group != snap["group"]:
            return ("file", *t.mapping.key)
        return ("group", t.mapping.key[0], os.path.dirname(t.mapping.path), group)

    def _track(self, scan: procscan.Scan) -> None:
        for key in list(self.tracked):
            if key not in scan.ledgers:
                self.tracked.pop(key).ledger.close()
        for key in list(self.open_errors):
            if key not in scan.ledgers:
                del self.open_errors[key]
        for key, m in scan.ledgers.items():
            if key in self.tracked:
                self.tracked[key].mapping = m
                continue
            led = self._open(m)
            if led is not None:
                self.tracked[key] = Tracked(led, m)
                self.open_errors.pop(key, None)

    def _open(self, m: procscan.Mapping) -> Ledger | None:
        """The ledger through the first member link that opens; None (error kept) if none."""
        ffi, lib = native.tools()
        why = "no process maps it any more"
        for _proc, link in m.links:
            try:  # O_NONBLOCK: whatever the member mapped, opening it never waits
                fd = os.open(link, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError as e:
                why = f"{link}: {e.strerror}"
                continue
            err = ffi.new("char[]", 512)
            try:
                h = lib.ct_ledger_open_fd(fd, m.path.encode(), err, 512)
            finally:
                os.close(fd)
            if h != ffi.NULL:
                return Ledger(h, Path(m.path))
            why = ffi.string(err).decode()
        if self.open_errors.get(m.key) != (m.path, why):
            self.say(f"cannot read the ledger {m.path}: {why}")
        self.open_errors[m.key] = (m.path, why)
        return None

    def _nvml_read(self) -> list[DeviceReading] | None:
        """NVML's view of every GPU now (None without NVML)."""
        if self.nvml is None:
            from ..nvml import Nvml

            self.nvml = Nvml()
            if not self.nvml.available:
                self.say(
                    f"no NVML ({self.nvml.why}): contexts in containers are not counted, and "
                    "the watch cannot compare the GPUs with the ledgers"
                )
        return self.nvml.read() if self.nvml.available else None

    # ---- contexts of members in other pid namespaces ----------------------------------------

    @staticmethod
    def _host_proc(t: Tracked, m: LedgerMember) -> procscan.Proc | None:
        # pid 1 of two containers started in the same clock tick share (ns_pid, start_ticks):
        # their pid namespaces tell them apart (an unknown one, 0, matches as before)
        for p, _link in t.mapping.links:
            if (
                p.ns_pid == m["pid"]
                and p.start_ticks == m["start_ticks"]
                and (not p.pidns or not m["pidns"] or p.pidns == m["pidns"])
            ):
                return p
        return None

    @staticmethod
    def _ordinals(m: LedgerMember, listed: Mapping[int, int]) -> dict[int, int]:
        """CUDA ordinal (the ledger's device) -> NVML's figure. One GPU listed: the member's one
        device (0 before its first allocation); several: in NVML index order, which is CUDA's
        with CUDA_DEVICE_ORDER=PCI_BUS_ID (docs/containers.md, multi-GPU limits)."""
        held = sorted(int(d) for d in m["devices"])
        if len(listed) == 1:
            if len(held) > 1:
                return {}
            return {held[0] if held else 0: next(iter(listed.values()))}
        return {k: listed[i] for k, i in enumerate(sorted(listed))}

    def _contexts(
        self, t: Tracked, snap: LedgerSnapshot, nv: Mapping[int, Mapping[int, int]]
    ) -> bool:
        """Count the contexts of this ledger's members in other pid namespaces; True when a
        figure changed."""
        _, lib = native.tools()
        changed = False
        after = None
        for m in snap["members"]:
            if m["state"] != "alive" or not m["other_pidns"]:
                continue
            p = self._host_proc(t, m)
            if p is None:
                continue
            listed = {i: procs[p.pid] for i, procs in nv.items() if p.pid in procs}
            for dev, used in self._ordinals(m, listed).items():
                if after is None:
                    after = {_member_key(x): x for x in t.ledger.snapshot()["members"]}
                now = after.get(_member_key(m), m)
                row0 = m["devices"].get(dev, {"held": 0, "context": 0})
                row1 = now["devices"].get(dev, {"held": 0, "context": 0})
                allocs = max(row0["held"] - row0["context"], row1["held"] - row1["context"])
                ctx = (max(0, used - allocs) + 1023) & ~1023
                hist = t.readings.setdefault((*_member_key(m), dev), [])
                hist[:] = (hist + [ctx])[-2:]
                count = min(hist) if len(hist) == 2 else None
                if count is None or count == row1["context"]:
                    continue
                rc = lib.ct_ledger_set_member_context(
                    t.ledger.h, m["slot"], m["pid"], m["start_ticks"], dev, count
                )
                if rc == 0:
                    changed = True
                    self.contexts_counted += 1
        return changed

    # ---- what is said: denials, unfenced processes --------------------------------------------

    def _denials(self, t: Tracked, snap: LedgerSnapshot) -> None:
        limits = {r["device"]: r["limit"] for r in snap["devices"]}
        in_use = {r["device"]: r["in_use"] for r in snap["devices"]}
        alive: set[_SlotDevice] = set()
        for m in snap["members"]:
            p = self._host_proc(t, m)
            waits = t.unmapped.get(_member_key(m), 0)
            if p is None and waits < UNMAPPED_PASSES:
                # joined after this pass's scan: said at the next, with its container's names
                t.unmapped[_member_key(m)] = waits + 1
                alive.update((*_member_key(m), d) for d in m["devices"])
                continue
            for dev, row in m["devices"].items():
                k = (*_member_key(m), dev)
                alive.add(k)
                seen = t.denials.get(k, 0)
                t.denials[k] = row["denials"]
                if row["denials"] <= seen:
                    continue
                n = row["denials"] - seen
                msg = (
                    f"{n} GPU memory allocation{'s' if n > 1 else ''} denied on device {dev}: "
                    f"budget {format_bytes(limits.get(dev, 0))}, in use "
                    f"{format_bytes(in_use.get(dev, 0))} (group {snap['group']}; the "
                    "container's log names the call site)"
                )
                self._tell(p, m["pid"], EVENT_REASON_DENIED, msg, n)
        for k in list(t.denials):
            if k not in alive:
                del t.denials[k]
        members = {_member_key(m) for m in snap["members"]}
        t.unmapped = {k: v for k, v in t.unmapped.items() if k in members}

    def _report_unfenced(self, scan: procscan.Scan) -> None:
        self.unfenced = scan.unfenced
        for p in scan.unfenced:
            if (p.pid, p.start_ticks) in self.unfenced_seen:
                continue
            self.unfenced_seen.add((p.pid, p.start_ticks))
            msg = (
                f"a process given the budget group {p.env.get(settings.name('GROUP'))} uses CUDA "
                "without the cudatrace preload library (it could not be loaded: see the "
                "container's log for ld.so's line): its GPU memory is not fenced"
            )
            self._tell(p, p.ns_pid, EVENT_REASON_UNFENCED, msg, 1)
        live = {(p.pid, p.start_ticks) for p in scan.unfenced}
        self.unfenced_seen &= live

    def _tell(self, p: procscan.Proc | None, pid: int, reason: str, msg: str, n: int) -> None:
        if p is None:  # a member whose process was never seen: its pid is its namespace's
            self.say(f"pid {pid}: {msg}")
            return
        self.ids.tell(p.pid, p.container, reason, msg, n)

    def _identify(self, scan: procscan.Scan, readings: list[DeviceReading] | None) -> None:
        """The identity of every process that maps a ledger, runs CUDA unfenced, or holds GPU
        memory (identity.py)."""
        pids = {p.pid: p.env for p in scan.procs.values()}
        pids.update({p.pid: p.env for p in scan.unfenced})
        for r in readings or []:
            for pid in r.procs or {}:
                if pid not in pids:
                    pids[pid] = procscan.environ(pid, self.cfg.proc)
        self.ids.refresh(pids)

    @property
    def identities(self) -> dict[int, Identity]:
        return self.ids.now

    # ---- labels for the metrics ---------------------------------------------------------------

    @staticmethod
    def _label(snap: LedgerSnapshot, t: Tracked, used: set[str]) -> str:
        """The group label: the group's name; a container's own budget (every one of them is
        named `container`) with its container's id; made unique within a pass."""
        base = snap["group"] or Path(t.mapping.path).stem
        if base == plan.CONTAINER_GROUP and t.mapping.links:
            first = t.mapping.links[0][0]
            base = f"{base}@{first.container[:12] or first.pid}"
        label, n = base, 1
        while label in used:
            n += 1
            label = f"{base}#{n}"
        used.add(label)
        return label

    def _labels_of(self, t: Tracked, snap: LedgerSnapshot) -> dict[int, tuple[str, str, str]]:
        out = {}
        for m in snap["members"]:
            p = self._host_proc(t, m) if m["other_pidns"] else None
            ident = self.identities.get(p.pid) if p is not None else None
            out[m["slot"]] = ident.labels() if ident else p.labels() if p else ("", "", "")
        return out

    # ---- the watch: NVML against the ledgers --------------------------------------------------

    def _watch(self, keyed: list[Parts], readings: list[DeviceReading] | None) -> WatchReport:
        def source(ts: list[Tracked], snap: LedgerSnapshot) -> Source:
            return Source(snap, frozenset(t.mapping.key for t in ts))

        first = [source(ts, s) for ts, s in keyed]
        reads = [0]

        def sources() -> list[Source]:
            reads[0] += 1
            if reads[0] == 1:
                return first
            fresh = []
            for ts, snap in keyed:  # again, for the breaches' confirmation
                try:
                    again = merge_parts([t.ledger.snapshot() for t in ts])
                except LedgerError:
                    continue
                again["label"] = snap["label"]
                fresh.append(source(ts, again))
            return fresh

        pending = self._pending(keyed)
        # ledgers tried (read or not): a process fenced by one that cannot be read is not fenced
        unreadable = frozenset(self.open_errors) | frozenset(self.tracked)
        where = watch_mod.Where(str(self.cfg.proc), known=unreadable)
        rep = watch_mod.report(sources, self.nvml, self.watch, where, readings=readings,
                               pending=lambda p: _member_key_of(p) in pending)  # fmt: skip
        for d in rep["devices"]:
            for p in d["processes"]:
                self._describe(p)
        return rep

    @staticmethod
    def _pending(keyed: list[Parts]) -> set[tuple[str, int, int]]:
        """(ledger label, slot, ordinal) of the members in other pid namespaces whose context
        this agent counts and has not counted yet (two readings: _contexts). A group of several
        parts numbers part i's slot s i * CT_LEDGER_MAX_MEMBERS + s (merge_parts)."""
        n = int(native.tools()[1].CT_LEDGER_MAX_MEMBERS)
        out = set()
        for ts, snap in keyed:
            for m in snap["members"]:
                if m["state"] == "dead" or not m["other_pidns"]:
                    continue
                part, slot = divmod(m["slot"], n) if len(ts) > 1 else (0, m["slot"])
                t, key = ts[part], (slot, m["pid"], m["start_ticks"])
                for dev in range(16):
                    row = m["devices"].get(dev)
                    if row is not None and row["context"]:
                        continue
                    if len(t.readings.get((*key, dev), [])) < 2:
                        out.add((snap["label"], m["slot"], dev))
        return out

    def _describe(self, p: WatchProcess) -> None:
        ident = self.identities.get(p["pid"])
        if ident is None or ident.ref is None:
            return
        ref = ident.ref
        p["namespace"], p["pod"], p["pod_uid"] = ref.namespace, ref.pod, ref.uid
        p["container_name"], p["verified"] = ref.container, True

    def _act(self, rep: WatchReport) -> None:
        """Say each new breach, send it to its process's pod, and stop the process with
        --enforce."""
        now: dict[watch_mod.Key, WatchFinding] = {}
        # a process in two breaches is stopped for the more particular: outside its ledger
        for f in sorted(rep["findings"], key=lambda f: watch_mod.KINDS.index(f["kind"])):
            key = (f["kind"], f["gpu"], f["pid"], f["group"])
            now[key] = f
            told = f["kind"] == "unfenced" and any(p.pid == f["pid"] for p in self.unfenced)
            if key not in self.breaches and not told:  # (_report_unfenced told that one)
                self.ids.tell(f["pid"], "", EVENT_REASONS[f["kind"]], f["message"])
            if self.enforcer is not None and f["pid"]:
                self._enforce(f)
        self.breaches = now

    def _enforce(self, f: WatchFinding) -> None:
        st = procfs.proc_stat(f["pid"], str(self.cfg.proc))
        if st is None or self.enforcer is None or self.enforcer.busy(f["pid"], st.start_ticks):
            return
        tag = (str(f["gpu"]), f["uuid"], f["kind"])
        if self.enforcer.stop(f["pid"], st.start_ticks, f["message"], tag) is None:
            return
        msg = f"stopped (--enforce: SIGTERM, SIGKILL after {self.cfg.grace:g} s): {f['message']}"
        self.ids.tell(f["pid"], "", EVENT_REASON_STOPPED, msg)

    def _stopped(self, s: Stopping) -> None:
        gpu, uuid, kind = (*s.tag, "", "", "")[:3]
        key = (gpu, uuid, kind)
        with self._lock:
            self.stopped[key] = self.stopped.get(key, 0) + 1

    def stops(self) -> dict[tuple[str, str, str], int]:
        """(gpu, UUID, kind) -> processes --enforce stopped, 0 for every kind of every GPU the
        last pass watched."""
        with self._lock:
            done = dict(self.stopped)
            watch = self._published.get("watch")
        for d in watch["devices"] if watch else []:
            for kind in watch_mod.KINDS:
                done.setdefault((str(d["gpu"]), d["uuid"], kind), 0)
        return done

    def published(self) -> Status:
        with self._lock:
            return self._published

    @staticmethod
    def member_labels(s: LedgerSnapshot, m: LedgerMember) -> tuple[str, str, str]:
        return s.get("member_labels", {}).get(m["slot"], ("", "", ""))

    # ---- housekeeping -----------------------------------------------------------------------

    def _forget_groups(self) -> None:
        """Remove the directories of groups no longer offered, once no member of theirs lives."""
        names = {f.group for f in self.offered if f.group}
        for d in cdi.stale_group_dirs(self.cfg.state, names):
            try:
                if not cdi.ledger_dir_idle(d):
                    continue
            except LedgerError as e:
                self.say(f"group directory {d} kept: {e}")
                continue
            try:
                cdi.remove_group_dir(d)
                self.say(f"group {d.name} is gone: removed {d}")
            except OSError as e:
                self.say(f"cannot remove {d}: {e.strerror}")

    def _gc_installs(self) -> None:
        keep = cdi.referenced_idents(self.cfg.root, cdi.CDI_DIRS + (str(self.cfg.cdi_dir),))
        if self.installed is not None:
            keep.add(self.installed.ident)
        for ident in install.gc(self.cfg.root, keep, self.cfg.proc):
            self.say(f"removed the unused preload library {ident}")

    # ---- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            self.cycle()
            stop.wait(max(0.0, self.cfg.interval - (time.monotonic() - t0)))
        self.finish()
