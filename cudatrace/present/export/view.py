"""What every exporter reads: one moment of a run, attributed as `report` attributes it.

The moment comes from `Analysis.moment` (so --at means what it means to `report`), what is
live then from `Analysis.live`, and each stack's frames from `Analysis.stacks.frames`: the
frames `report` groups into sites, CUDA's own folded unless --show-cuda-frames. Exporters
never symbolize, fold or name frames themselves: when attribution changes there, every
export follows.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable

from ...analyze.documents.analysis import Analysis
from ...analyze.documents.ranks import split_devices
from ...analyze.read.tags import device_label, rank_label_of, tagged
from ...analyze.read.trace import host_of
from ...analyze.replay.lives import Alloc
from ...analyze.sites.group import NO_STACK, process_label
from ...analyze.sites.stacks import SFrame
from . import ExportError


class View:
    def __init__(self, a: Analysis, at: str = "peak", device: int | None = None):
        m = a.model
        if device is not None and split_devices(a):
            raise ExportError(
                "--device picks a device ordinal, and in this run one ordinal names "
                "several devices (several hosts, or CUDA_VISIBLE_DEVICES differing between "
                "processes): export one host's or process's trace with --device (docs/ranks.md)"
            )
        if device is not None and device not in m.device_peaks:
            seen = ", ".join(str(d) for d in sorted(m.device_peaks)) or "none"
            raise ExportError(
                "no device memory was traced on device %d (devices with "
                "allocations: %s)" % (device, seen)
            )
        self.a = a
        self.model = m
        self.traces = a.traces
        self.device = device
        self.moment = a.moment(at, device)
        self.live = a.live(self.moment)  # Groups: what report's sites are made of
        self.total = self.live.bytes
        self.count = self.live.count
        used = {r[0] for r in self.live.rows} | {k[0] for k in m.stack_totals()}
        self.multi_process = len(used) > 1
        # many ranks (docs/ranks.md): processes named by rank; devices by host and GPU when
        # the run spans hosts (device 0 of two hosts is two devices)
        self.rank_labels = rank_label_of(self.traces) if tagged(self.traces) else None
        self.split_devices = split_devices(a)

    # ---- the moment ----
    @property
    def moment_ts(self) -> int:
        """Monotonic ns of the moment (the trace's end when nothing was allocated)."""
        ts = self.moment["ts_ns"]
        return ts if ts is not None else self.model.t_end

    def seconds(self, ts: int | None) -> float | None:
        return self.a.seconds(ts)

    def moment_text(self) -> str:
        k = self.moment["kind"]
        t = self.seconds(self.moment["ts_ns"])
        when = f"{t:.3f} s" if t is not None else "-"
        return {"peak": f"at the peak ({when})", "end": f"at the end ({when})"}.get(
            k, f"at {when}"
        ) + ("" if self.device is None else " on device %d" % self.device)

    def included(self, x: Alloc) -> bool:
        """x happened at or before the moment (and on the chosen device)."""
        if self.device is not None and x.device != self.device:
            return False
        seq: int | None = self.moment["seq"]
        if seq is not None:
            return x.seq <= seq
        return x.ts <= self.moment_ts

    def live_allocations(self) -> list[Alloc]:
        """The allocations live at the moment, one by one (with addresses)."""
        m, mom = self.model, self.moment
        if mom["kind"] == "peak":
            return m.live_at_peak if self.device is None else m.live_at_device_peak(self.device)
        if mom["kind"] == "end":
            return [x for x in m.live_at_end if self.device is None or x.device == self.device]
        return m.at(mom["ts_ns"], self.device)

    # ---- attribution ----
    def prepare(self, keys: Iterable[tuple[int, int]]) -> None:
        """Symbolize the given (trace, leaf) stacks at once (module by module)."""
        self.a.stacks.prepare({k for k in keys if k[1]})

    def frames(self, ti: int, leaf: int) -> list[SFrame]:
        """A stack's frames as report attributes them, innermost first: from the responsible
        frame up (the program's allocator layers folded, as report's sites)."""
        return self.a.stacks.site_frames(ti, leaf) if leaf else []

    def process(self, ti: int) -> str:
        if self.rank_labels is not None:
            return "%s: %s" % (self.rank_labels[ti], process_label(self.traces[ti]))
        return process_label(self.traces[ti])

    def device_key(self, x: Alloc) -> int | tuple[str, str]:
        """What one device is: its ordinal, or (host, physical device) over several hosts."""
        if not self.split_devices:
            return x.device
        t = self.traces[x.trace]
        return (host_of(t), device_label(t, x.device))

    @staticmethod
    def device_name(key: int | tuple[str, str]) -> str:
        if isinstance(key, tuple):
            return "%s:%s" % key
        return str(key) if key >= 0 else "?"

    def names(self, ti: int, leaf: int) -> list[str]:
        """Frame names root first, as flame graphs stack them: the process first when the run
        had several, then the frames (report's labels), or a note for a stack not recorded."""
        fr = self.frames(ti, leaf)
        out = [self.process(ti)] if self.multi_process else []
        if not fr:
            out.append(NO_STACK)
        else:
            out.extend(f.label() for f in reversed(fr))
        return out

    def live_stacks(self) -> dict[tuple[int, int], list[int]]:
        """(trace, leaf) -> [count, bytes] live at the moment (summed over APIs and devices)."""
        out: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
        for r in self.live.rows:
            x = out[(r[0], r[1])]
            x[0] += r[5]
            x[1] += r[6]
        return dict(out)

    def run_stacks(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(trace, leaf) -> (count, bytes) of every device allocation of the run (the chosen
        device's only, with --device)."""
        if self.device is None:
            return self.model.stack_totals()
        out: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
        for x in self.model.lifetimes():
            if x.device == self.device:
                y = out[(x.trace, x.stack)]
                y[0] += 1
                y[1] += x.size
        return {k: (v[0], v[1]) for k, v in out.items()}

    def command(self) -> str:
        argv = self.a.td.run.get("argv") or (self.traces[0].argv if self.traces else [])
        return " ".join(argv) or os.path.basename(str(self.a.path))
