"""The base every document stands on: `Analysis` takes a run through the stages before it, in
order: its trace directory read (read/load.py), replayed (replay/model.py) beside what the
device observed (replay/observed.py), its allocations' stacks made into call sites
(sites/stacks.py, as memray's reporters share one base). The report (documents/report/), diff,
the tree, the ranks, the HTML page and the summary of `cudatrace run` all stand on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...attribution import Attribution
from ...units import parse_moment
from ..read.load import PathArg, ReportError, load
from ..read.runfacts import run_seconds
from ..read.trace import TraceDir
from ..replay.lives import NONE64, Alloc, Groups
from ..replay.model import Model, build
from ..replay.observed import Observed
from ..sites.group import Site, group
from ..sites.layers import compile_patterns
from ..sites.stacks import Stacks, make_symbolizer

if TYPE_CHECKING:
    from ...symbols import Symbolizer
    from ..sites.layers import CallGraph

CONTEXT_FRAMES = 6  # frames listed per stack


class Analysis:
    """Trace directory -> model -> stacks; what every report command starts from."""

    def __init__(
        self,
        path: PathArg,
        attribution: Attribution = Attribution(),
        symbolize: bool = True,
        progress: bool = False,
        td: TraceDir | None = None,
        symbolizer: Symbolizer | None = None,
        graph: CallGraph | None = None,
    ) -> None:
        self.paths = [Path(x) for x in path] if isinstance(path, (list, tuple)) else [Path(path)]
        self.path = self.paths[0]
        self.td = td if td is not None else load(path)
        self.traces = self.td.traces
        self.model: Model = build(self.td)
        self.observed = Observed(self.td)
        self.start_ns = self._start()  # time zero: of the run read and replayed
        if symbolizer is None and symbolize:
            from ...progress import bar

            symbolizer = make_symbolizer(progress=bar if progress else False)
        self.symbolizer = symbolizer
        self.attribution = attribution
        self.full_names = attribution.full_names
        cuda = attribution.show_cuda_frames
        self.stacks = Stacks(
            self.traces,
            symbolizer,
            fold=not cuda,
            layers=attribution.fold and not cuda,  # the raw stacks, as recorded
            patterns=compile_patterns(attribution.fold_patterns),
            graph=graph,
            view=attribution.view,
        )
        self.stacks.set_source(self.model.allocation_stacks)

    def _start(self) -> int:
        """Time zero of "seconds since start": the launcher's start when run.json has it (the
        samples share it), else the first trace's start."""
        starts = [t.start_monotonic_ns for t in self.traces if t.start_monotonic_ns]
        first = min(starts) if starts else self.model.t0
        r = self.td.run.get("start_monotonic_ns")
        if isinstance(r, int) and 0 < r <= (first or r):
            return r
        return first or self.model.t0

    def seconds(self, ts: int | None) -> float | None:
        if ts is None:
            return None
        return round((ts - self.start_ns) / 1e9, 6)

    def sites(
        self, allocs: Groups | Iterable[Alloc], by: str = "site", depth: int = 1
    ) -> list[Site]:
        return group(self.model, allocs, self.stacks, by, depth, context=max(CONTEXT_FRAMES, depth))

    def moment(self, spec: str = "peak", device: int | None = None) -> dict[str, Any]:
        """What --at names: {"spec", "kind", "ts_ns", "seq", "device"}."""
        m = self.model
        s = (spec or "peak").strip().lower()
        if s == "peak":
            if device is None:
                return {
                    "spec": "peak",
                    "kind": "peak",
                    "ts_ns": m.peak_ts if m.found else None,
                    "seq": m.peak_seq if m.found else None,
                    "device": None,
                }
            b, ts = m.device_peaks.get(device, (0, None))
            return {
                "spec": "peak",
                "kind": "peak",
                "ts_ns": ts,
                "seq": m.device_peak_seq.get(device),
                "device": device,
            }
        if s == "end":
            return {
                "spec": "end",
                "kind": "end",
                "ts_ns": m.t_end if m.n_events else None,
                "seq": NONE64 - 1,
                "device": device,
            }
        secs = parse_moment(spec)
        assert not isinstance(secs, str)  # "peak" and "end" were answered above
        self._within_run(spec, secs)
        return {
            "spec": spec,
            "kind": "time",
            "ts_ns": self.start_ns + int(round(secs * 1e9)),
            "seq": None,
            "device": device,
        }

    def run_seconds(self) -> float:
        """How long the run lasted, from its start (runfacts.run_seconds)."""
        ends = [self.model.t_end] if self.model.n_events else []
        return run_seconds(self.td, [*ends, *self.process_ends().values()], self.start_ns)

    def _within_run(self, spec: str, secs: float) -> None:
        """--at TIME names a moment of the run, or is refused: a moment after it ended would
        show nothing live (each process's memory ended with it), which reads as a fact of the
        run when it is none."""
        end = self.run_seconds()
        if secs < 0 or secs > end + 1e-6:
            raise ReportError(
                f"--at {spec}: the run lasted {end:.3f} s (from its start to its end); give a "
                f"time within it, or --at end (what was live when it ended) or --at peak"
            )

    def live(self, moment: dict[str, Any]) -> Groups:
        """What is live at the moment, grouped (sites.group takes it as is)."""
        m, dev = self.model, moment["device"]
        if moment["kind"] == "peak":
            return m.groups_at_peak(dev)
        if moment["kind"] == "end":
            return m.groups_at_end(dev)
        return m.groups_at(moment["ts_ns"], dev)

    def process_ends(self) -> dict[int, int]:
        """pid -> when its traced memory ended (when the launcher saw it die, else its last
        image's exit record: model.process_ends), for the processes that ended; one still
        running or lost is not there."""
        ends: dict[int, int | None] = {}
        for t in self.traces:
            e = max(t.end.ts_ns, t.exit_seen_ns) if t.end else (t.exit_seen_ns or None)
            prev = ends.get(t.pid, 0)
            ends[t.pid] = None if e is None or prev is None else max(prev, e)
        return {pid: e for pid, e in ends.items() if e}

    def budget_limits(self) -> dict[int, int]:
        """device -> limit in bytes, as the shim wrote it into the traces."""
        out: dict[int, int] = {}
        for t in self.traces:
            for k, v in t.info.items():
                if k.startswith("budget."):
                    try:
                        out[int(k[7:])] = int(v)
                    except ValueError:
                        pass
        return out

    def budget_contexts(self) -> dict[int, int]:
        """device -> bytes of CUDA context the budget counted, summed over the processes (each
        trace's last "context.<dev>" figure, measured through NVML by the shim)."""
        out: dict[int, int] = {}
        for t in self.traces:
            for k, v in t.info.items():
                if k.startswith("context.") and v.isdigit():
                    d = int(k[8:]) if k[8:].isdigit() else 0
                    out[d] = out.get(d, 0) + int(v)
        return out


# ---- the report as data --------------------------------------------------------------------
