"""Replaying traces into live allocations over time: peaks, what is live at a moment, failures.

Counted as device memory: device, pitch, managed, stream-ordered, VMM physical (cuMemCreate),
arrays and graph memory. Pinned host memory is tracked apart (it is host DRAM, except on
unified-memory devices). Imports (IPC, external memory) map memory someone else paid for and
are never counted. A free matches the live allocation of the same process, address space and
address; a free that matches none (memory allocated before tracing, or by an unhooked path) is
counted as unmatched and changes nothing. An allocation at an address still live ends the old
one (counted as reused). cuMemRelease of a VMM handle that is still mapped frees nothing until
its last cuMemUnmap, as in the driver. Failed allocations are listed, never counted.

A process's memory ends when the process ends: when the launcher saw it gone (record/exits.py),
else at its exit record, or when exec replaced its image (the next image's start), whatever it
still held is gone, as the driver gives it back. A process that left no end (killed, still
running) holds its memory to the end of the run. The
run's end figure (`end_bytes`, `live_at_end`) is what was never freed: live at the end, or held
by its process when that process ended.

The events of all processes are merged by timestamp (ties: a process's end first, then trace
order). One pass records every
allocation's lifetime, so what is live at the peak, at the end or at any time is a filter, not
a second replay. The pass runs in C (native/reader/replay.c, in the tools library: backend.py),
decoding a trace's event blocks as it goes (or over the scanner's event array, for older
formats); what it yields (each life, grouped) is lives.py's. The same rules written in Python
(tests/support/replay_oracle.py) are the reference the tests hold the C to; the product uses
the C replay only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from ..read.aggregate import apply_snapshots
from ..read.trace import C, Trace, TraceDir
from .backend import CReplay, Replay, c_backend, c_error
from .lives import NEVER_FREED, Alloc, Groups

T = TypeVar("T")

TIMELINE_BUCKETS = 4096


# ---- the C replay ------------------------------------------------------------------------


# ---- the model ----------------------------------------------------------------------------


@dataclass
class Model:
    traces: list[Trace]
    backend: Replay = field(repr=False)
    found: bool = False  # any device allocation at all
    peak_bytes: int = 0
    peak_ts: int = 0
    peak_seq: int = -1
    end_bytes: int = 0
    device_peaks: dict[int, tuple[int, int]] = field(default_factory=dict)  # dev -> (bytes, ts)
    device_peak_seq: dict[int, int] = field(default_factory=dict)
    device_end: dict[int, int] = field(default_factory=dict)
    device_allocs: dict[int, int] = field(default_factory=dict)
    host_peak: int = 0
    host_peak_ts: int = 0
    host_end: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    procs: list[dict[Any, Any]] = field(default_factory=list)  # per trace: allocs, peak_bytes, ...
    t0: int = 0
    t_end: int = 0
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def peak_index(self) -> int:
        """Merged index of the event that reached the peak; -1 when nothing was allocated."""
        return self.peak_seq if self.found else -1

    @property
    def unmatched_frees(self) -> int:
        return self.counts.get("unmatched_frees", 0)

    @property
    def n_events(self) -> int:
        return self.counts.get("events", 0)

    def _cached(self, key: object, fn: Callable[[], T]) -> T:
        if key not in self._cache:
            self._cache[key] = fn()
        return cast(T, self._cache[key])

    @property
    def live_at_peak(self) -> list[Alloc]:
        """Device allocations live right after the event that reached the peak."""
        if not self.found:
            return []
        return self._cached(("peak", None), lambda: self.backend.select(False, self.peak_seq))

    @property
    def live_at_end(self) -> list[Alloc]:
        """Device allocations never freed (live when the traces end)."""
        return self._cached(("end", None), lambda: self.backend.select(NEVER_FREED, 0))

    def live_at_device_peak(self, device: int) -> list[Alloc]:
        """Allocations on device live at that device's own peak."""
        if device not in self.device_peak_seq:
            return []
        seq = self.device_peak_seq[device]
        return self._cached(("dpeak", device), lambda: self.backend.select(False, seq, device))

    def groups_at_peak(self, device: int | None = None) -> Groups:
        """live_at_peak (or a device's own peak), grouped."""
        if device is None:
            if not self.found:
                return Groups([])
            return self._cached(("gpeak", None), lambda: self.backend.groups(False, self.peak_seq))
        if device not in self.device_peak_seq:
            return Groups([])
        seq = self.device_peak_seq[device]
        return self._cached(("gpeak", device), lambda: self.backend.groups(False, seq, device))

    def groups_at_end(self, device: int | None = None) -> Groups:
        return self._cached(("gend", device), lambda: self.backend.groups(NEVER_FREED, 0, device))

    def groups_at(self, ts: int, device: int | None = None) -> Groups:
        return self.backend.groups(True, ts, device)

    def at(self, ts: int, device: int | None = None) -> list[Alloc]:
        """Allocations live at monotonic time ts (every event at or before ts replayed)."""
        return self.backend.select(True, ts, device)

    def at_seq(self, seq: int, device: int | None = None) -> list[Alloc]:
        return self.backend.select(False, seq, device)

    def live_bytes_at(self, ts: int, device: int | None = None) -> tuple[int, int]:
        """(bytes, count) live at monotonic time ts."""
        return self.backend.live_bytes(True, ts, device)

    def bytes_at(self, times: list[int], device: int | None = None) -> list[int]:
        """Traced live bytes at each of the given monotonic times (ascending)."""
        return self.backend.bytes_at(list(times), device)

    def bytes_max(self, lo: list[int], hi: list[int], device: int | None = None) -> list[int]:
        """The most traced bytes live at any one moment of each window [lo[k], hi[k]] (lo and
        hi each ascending, equal lengths): what the trace held while a reading made somewhere in
        the window was taken."""
        if len(lo) != len(hi):
            raise ValueError("bytes_max: %d window starts, %d ends" % (len(lo), len(hi)))
        if any(a > b for a, b in zip(lo, lo[1:])) or any(a > b for a, b in zip(hi, hi[1:])):
            raise ValueError("bytes_max: the windows' starts and ends must each ascend")
        return self.backend.bytes_max(list(lo), list(hi), device)

    def lifetimes(self) -> list[Alloc]:
        """Every device allocation of the run, with end_ts (None: never freed)."""
        return self._cached(("all", None), self.backend.all)

    def stack_totals(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(trace, leaf stack) -> (count, bytes) of every device allocation of the run."""
        return self._cached(("stacktotals", None), self.backend.stack_totals)

    def allocation_stacks(self) -> list[tuple[int, int]]:
        """Every (trace, leaf) stack that allocated, failed or was denied: the call graph the
        allocator layers are recognized from (analyze/sites/layers.py)."""
        keys = set(self.stack_totals())
        keys.update((x.trace, x.stack) for x in self.failed if x.stack)
        keys.update((x.trace, x.stack) for x in self.denied if x.stack)
        return sorted(keys)

    @property
    def failed(self) -> list[Alloc]:
        return self._cached(("failed", None), lambda: self.backend.listed("failed"))

    @property
    def denied(self) -> list[Alloc]:
        return self._cached(("denied", None), lambda: self.backend.listed("denied"))

    @property
    def meminfo(self) -> list[Alloc]:
        """cuMemGetInfo / NVML memory queries (size: total reported, event[ADDR]: free reported,
        event[AUX] / event[AUX2]: the device's own free / total)."""
        return self._cached(("meminfo", None), lambda: self.backend.listed("meminfo"))

    def timeline_buckets(self, device: int | None = None) -> list[tuple[Any, ...]]:
        """(changes, min, min_ts, max, max_ts, last, last_ts) of each time slice with changes."""
        return self._cached(("tlb", device), lambda: self.backend.timeline(device))

    def timeline_points(self, device: int | None = None) -> list[tuple[int, int]]:
        """(ts, live bytes) steps: each slice's lowest, highest and last value, in time order;
        exact at every slice's extremes (the peak included)."""

        def make() -> list[tuple[int, int]]:
            pts = [(self.t0, 0)]
            for _n, lo, lo_ts, hi, hi_ts, last, last_ts in self.timeline_buckets(device):
                for p in sorted(
                    {(lo_ts, lo), (hi_ts, hi), (last_ts, last)},
                    key=lambda x: (x[0], x == (last_ts, last)),
                ):
                    if p != pts[-1]:
                        pts.append(p)
            return pts

        return self._cached(("tlp", device), make)

    @property
    def timeline(self) -> list[tuple[int, int]]:
        return self.timeline_points()


def build(td: TraceDir | list[Trace], timeline_buckets: int = TIMELINE_BUCKETS) -> Model:
    """Replay the traces of a run (in C: native/reader/replay.c)."""
    traces = td.traces if isinstance(td, TraceDir) else list(td)
    if not c_backend():
        raise RuntimeError(f"the C replay is not available: {c_error[0]}")
    if any(getattr(t, "snap_slots", None) for t in traces):  # --aggregate: from the last snapshot
        for t in traces:
            apply_snapshots(t)
    m = from_replay(traces, CReplay(traces, timeline_buckets))
    if any(getattr(t, "aggregate", None) is not None for t in traces):
        adjust_model(m)  # counts of the run, not of the synthetic events
    return m


def from_replay(traces: list[Trace], r: Any) -> Model:
    """The Model over a finished replay r (the C one, or the tests' Python oracle)."""
    s = r.summary
    m = Model(
        traces=traces,
        backend=r,
        found=bool(s["found"]),
        peak_bytes=s["peak_bytes"],
        peak_ts=s["peak_ts"],
        peak_seq=s["peak_seq"] if s["found"] else -1,
        end_bytes=s["end_bytes"],
        host_peak=s["host_peak"],
        host_peak_ts=s["host_peak_ts"],
        host_end=s["host_end"],
        counts=dict(r.counts),
        procs=r.procs,
        t0=s["t0"],
        t_end=s["t_end"],
    )
    for dev, d in sorted(r.devices.items()):
        m.device_peaks[dev] = (d["peak_bytes"], d["peak_ts"])
        m.device_peak_seq[dev] = d["peak_seq"]
        m.device_end[dev] = d["end_bytes"]
        m.device_allocs[dev] = d["allocs"]
    return m


def adjust_model(m: Model) -> None:
    """Counts the replay took from synthetic events of --aggregate traces (read/aggregate.py),
    put back to the run's own."""
    K = C()
    host_g = K["CT_SNAP_HOST_GROUP"]
    for i, t in enumerate(m.traces):
        snap = getattr(t, "aggregate", None)
        if snap is None or not snap.head or i >= len(m.procs):
            continue
        h, p = snap.head, m.procs[i]
        dev_keys = [k for k in snap.keys if k["group"] != host_g]
        host_keys = [k for k in snap.keys if k["group"] == host_g]
        old = {n: p.get(n, 0) for n in ("allocs", "frees", "host_allocs")}
        p["allocs"] = sum(k["allocs"] for k in dev_keys)
        p["frees"] = sum(k["frees"] for k in dev_keys)
        p["host_allocs"] = sum(k["allocs"] for k in host_keys)
        seen = (
            h["allocs"]
            + h["frees"]
            + h["unmatched_frees"]
            + h["failed"]
            + h["denied"]
            + h["meminfo"]
            + h["other"]
        )
        c = m.counts
        c["events"] = c.get("events", 0) - p.get("events", 0) + seen
        p["events"] = seen
        c["allocs"] = c.get("allocs", 0) - old["allocs"] + p["allocs"]
        c["frees"] = c.get("frees", 0) - old["frees"] + p["frees"]
        c["host_allocs"] = c.get("host_allocs", 0) - old["host_allocs"] + p["host_allocs"]
        c["host_frees"] = sum(k["frees"] for k in host_keys)
        c["unmatched_frees"] = c.get("unmatched_frees", 0) + h["unmatched_frees"]
        for g in snap.groups:
            if g["allocs"] and g is not snap.groups[host_g] and g["device"] in m.device_allocs:
                m.device_allocs[g["device"]] = g["allocs"]
