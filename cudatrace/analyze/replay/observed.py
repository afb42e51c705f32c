"""Traced versus observed: what the device showed for the process tree next to what the trace
holds live. The difference is memory no hook sees (CUDA contexts, module images, paths not
hooked) — the RSS-versus-free mismatch of the report cudatrace was born from, at a glance.

The launcher samples every ~100 ms (samples.jsonl): NVML's per-process device memory for the
traced tree and each device's used/total, plus MemAvailable and the tree's RSS, which are all a
unified-memory device (Jetson) offers. Nothing here is estimated: a figure that was not sampled
is absent (None), and the reason is given.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

from ..read.trace import TraceDir

# An event's time can trail or lead the driver's own bookkeeping by the wrapper's few
# microseconds (an allocation is stamped after the driver returns, a free before it calls), more
# when the thread is preempted: a reading is set beside this much more of the trace either side.
SLACK_NS = 2_000_000
NVML_NOT_SUPPORTED = 3  # what NVML's memory queries answer on an integrated device


def _read_windows(samples: list[dict[str, Any]], ts: list[int]) -> tuple[list[int], list[int]]:
    """Per sample, the span within which NVML was read: its "nvml_t" pair widened by SLACK_NS,
    or the sample's time alone (samplers before round 3 did not record one). Starts and ends
    each ascend (an end never earlier than the one before: a window only widens)."""
    lo: list[int] = []
    hi: list[int] = []
    for s, t in zip(samples, ts):
        w = s.get("nvml_t")
        if (
            isinstance(w, list)
            and len(w) == 2
            and all(isinstance(x, int) for x in w)
            and t <= w[0] <= w[1]
        ):
            a, b = w[0] - SLACK_NS, w[1] + SLACK_NS
        else:
            a, b = t, t
        lo.append(max(a, lo[-1]) if lo else a)
        hi.append(max(b, hi[-1]) if hi else b)
    return lo, hi


class Observed:
    def __init__(self, td: TraceDir):
        self.samples = td.samples()
        self.samples.sort(key=lambda s: s.get("t", 0))
        self.ts = [s.get("t", 0) for s in self.samples]
        self.windows = _read_windows(self.samples, self.ts)
        self._tree: list[int | None] = []  # per sample, the tree's device bytes (compare)
        self.sampler = td.run.get("sampler", {}) or {}
        self.has_run = bool(td.run)
        self.several_dirs = len(td.dirs) > 1  # a run of many ranks (docs/ranks.md)

    # ---- one sample ----
    def near(self, ts: int) -> dict[str, Any] | None:
        """The sample closest to monotonic time ts (None if there are none)."""
        if not self.samples:
            return None
        i = bisect.bisect_left(self.ts, ts)
        cands = [j for j in (i - 1, i) if 0 <= j < len(self.samples)]
        return self.samples[min(cands, key=lambda j: abs(self.ts[j] - ts))]

    def _tree_at(self, k: int, device: int | None, ends: dict[int, int]) -> int | None:
        """The tree's device bytes in sample k, less the processes whose traced memory had
        ended before NVML was read (where the sample lists processes apart)."""
        s, lo = self.samples[k], self.windows[0][k]
        by_pid = s.get("tree_device_pids")
        gone = {str(p) for p, e in ends.items() if e < lo}
        if not gone or not isinstance(by_pid, dict):
            return self.tree_device_bytes(s, device)
        keep = [
            b
            for d, m in by_pid.items()
            if (device is None or d == str(device)) and isinstance(m, dict)
            for p, b in m.items()
            if p not in gone and isinstance(b, int)
        ]
        return sum(keep) if by_pid and (device is None or str(device) in by_pid) else None

    @staticmethod
    def tree_device_bytes(s: dict[str, Any], device: int | None = None) -> int | None:
        d = s.get("tree_device_bytes")
        if d is None:
            return None
        if device is not None:
            v = d.get(str(device))
            return int(v) if v is not None else None
        return sum(int(v) for v in d.values())

    @staticmethod
    def _device_rows(s: dict[str, Any], device: int | None = None) -> list[dict[str, Any]]:
        return [
            d
            for d in s.get("devices") or []
            if "used" in d and (device is None or d.get("index") == device)
        ]

    def device_used(self, s: dict[str, Any], device: int | None = None) -> tuple[int, int] | None:
        """(used, total) over the devices NVML answered for (or one)."""
        devs = self._device_rows(s, device)
        if not devs:
            return None
        return sum(d["used"] for d in devs), sum(d.get("total", 0) for d in devs)

    # ---- what there is ----
    def nvml_devices(self, device: int | None = None) -> bool:
        """Some sample has NVML's used/total for the device(s)."""
        return any(self._device_rows(s, device) for s in self.samples)

    def per_process_for(self, device: int | None = None) -> bool:
        """Some sample has a non-zero NVML figure for the traced tree. All zeros is taken as no
        figure: NVML leaves out processes whose usage it cannot tell (N/A on integrated devices,
        in some containers and drivers), which reads the same as zero."""
        return any((self.tree_device_bytes(s, device) or 0) > 0 for s in self.samples)

    @property
    def per_process(self) -> bool:
        return self.per_process_for()

    @property
    def nvml(self) -> bool:
        """NVML answered something usable: device figures or per-process ones."""
        return self.nvml_devices() or self.per_process

    def why_no_nvml(self) -> str:
        if not self.has_run:
            return "no run.json beside the trace (a single file was given, or a copy without it)"
        if self.several_dirs:
            return (
                "a run of several trace directories: each host sampled its own devices "
                "(report one directory to compare)"
            )
        if not self.samples:
            return "no samples were recorded (samples.jsonl missing or empty)"
        if self.sampler.get("nvml_why"):
            result: str = self.sampler["nvml_why"]
            return result
        errs = sorted(
            {
                (d.get("index"), d.get("error"))
                for s in self.samples
                for d in s.get("devices") or []
                if "error" in d
            },
            key=str,
        )
        if errs and all(e == NVML_NOT_SUPPORTED for _, e in errs):
            return (
                "the device reports no memory use to NVML (integrated devices, as Jetson's, do not)"
            )
        if errs:
            return "NVML could not read the device's memory ({})".format(
                ", ".join("device {}: NVML error {}".format(*e) for e in errs[:4])
            )
        return "no NVML samples"

    def why_no_per_process(self) -> str:
        if not any(s.get("tree_device_bytes") is not None for s in self.samples):
            return "the sampler recorded no per-process figures"
        return (
            "NVML listed no device memory for the traced processes in any sample (per-process "
            "figures are N/A on some drivers, in some containers and on integrated devices)"
        )

    def interval_ms(self) -> float | None:
        """The samples' spacing: the median between two, else the sampler's own setting."""
        if len(self.ts) < 2:
            every = self.sampler.get("interval_ms")
            return float(every) if isinstance(every, (int, float)) and every > 0 else None
        d = sorted(b - a for a, b in zip(self.ts, self.ts[1:]))
        result: float | None = d[len(d) // 2] / 1e6
        return result

    # ---- the comparison ----
    def compare(
        self,
        peak_ts: int,
        traced_max: Callable[[list[int], list[int]], list[int]],
        start_ns: int,
        device: int | None = None,
        ends: dict[int, int] | None = None,
    ) -> dict[str, Any]:
        """Traced versus observed near the peak and over the run.

        traced_max(lo, hi) gives the most traced live bytes at any one moment of each window
        [lo[k], hi[k]] (Model.bytes_max): every observed figure is set beside what the trace
        held while NVML was being read, so a reading made while an allocation was on its way
        through the wrapper never counts that allocation as untraced. ends (pid -> when its
        traced memory ended, Analysis.process_ends): NVML's figure for a process read after
        that is left out of the tree's (the driver gives an exiting process's memory back
        after its exit record; counted, it would read as untraced memory)."""

        def sec(ts: int) -> float:
            return round((ts - start_ns) / 1e9, 6)

        per_process = self.per_process_for(device)
        nvml = self.nvml_devices(device) or per_process
        out: dict[str, Any] = {
            "samples": len(self.samples),
            "nvml": nvml,
            "nvml_why": None if nvml else self.why_no_nvml(),
            "per_process": per_process,
            "per_process_why": None if per_process or not nvml else self.why_no_per_process(),
            "interval_ms": self.interval_ms(),
            "overlap": False,
            "near_peak": None,
            "max": None,
            "baseline": None,
        }
        if not self.samples:
            return out
        traced = list(traced_max(*self.windows))
        self._tree = [self._tree_at(k, device, ends or {}) for k in range(len(self.samples))]
        live = [k for k, v in enumerate(traced) if v > 0]
        out["overlap"] = bool(live)
        out["baseline"] = base = self._baseline(device, sec)
        out["near_peak"] = self._near_peak(peak_ts, traced, live, base, device, per_process, sec)
        out["max"] = self._maxima(traced, base, device, per_process, sec)
        return out

    def _baseline(self, device: int | None, sec: Callable[[int], float]) -> dict[str, Any]:
        """The first sample: what the machine held before the run allocated."""
        first = self.samples[0]
        base = {
            "time": sec(first["t"]),
            "mem_available": first.get("mem_available"),
            "device_used": None,
            "device_total": None,
            "tree_rss": first.get("tree_rss"),
        }
        du = self.device_used(first, device)
        if du:
            base["device_used"], base["device_total"] = du[0], du[1] or None
        base["mem_free"] = first.get("mem_free")
        return base

    def _near_peak(
        self,
        peak_ts: int,
        traced: list[int],
        live: list[int],
        base: dict[str, Any],
        device: int | None,
        per_process: bool,
        sec: Callable[[int], float],
    ) -> dict[str, Any]:
        """The sample nearest the traced peak (that saw something traced live), beside it."""
        k = min(range(len(self.ts)), key=lambda j: (abs(self.ts[j] - peak_ts), j))
        note = None
        if traced[k] == 0 and live:
            k = min(live, key=lambda j: (abs(self.ts[j] - peak_ts), j))
            note = (
                "the sample nearest the peak saw nothing traced live; this is the nearest that did"
            )
        s = self.samples[k]
        near = {
            "time": sec(s["t"]),
            "ts_ns": s["t"],
            "offset_ms": round((s["t"] - peak_ts) / 1e6, 3),
            "traced_bytes": traced[k],
            "tree_device_bytes": None,
            "untraced_bytes": None,
            "device_used": None,
            "device_total": None,
            "device_used_rise": None,
            "mem_available": s.get("mem_available"),
            "mem_available_drop": None,
            "tree_rss": s.get("tree_rss"),
            "tree_pss": s.get("tree_pss"),
            "mem_free": s.get("mem_free"),
            "mem_free_drop": None,
            "note": note,
        }
        if per_process:
            tb = self._tree[k]
            if tb is not None:
                near["tree_device_bytes"] = tb
                near["untraced_bytes"] = tb - traced[k]
        du = self.device_used(s, device)
        if du:
            near["device_used"], near["device_total"] = du
            if base["device_used"] is not None:
                near["device_used_rise"] = du[0] - base["device_used"]
        for key in ("mem_available", "mem_free"):
            if near[key] is not None and base[key] is not None:
                near[key + "_drop"] = base[key] - near[key]
        return near

    def _maxima(
        self,
        traced: list[int],
        base: dict[str, Any],
        device: int | None,
        per_process: bool,
        sec: Callable[[int], float],
    ) -> dict[str, Any]:
        """The largest figure of each kind over the run, and when."""
        mx: dict[str, Any] = {
            "tree_device_bytes": None,
            "tree_device_time": None,
            "traced_bytes_then": None,
            "untraced_bytes": None,
            "untraced_max_bytes": None,
            "untraced_max_time": None,
            "device_used": None,
            "device_used_time": None,
            "tree_rss": None,
            "tree_rss_time": None,
            "mem_available_min": None,
            "mem_available_drop": None,
            "mem_available_time": None,
        }
        if per_process:
            self._tree_maxima(mx, traced, device, sec)
        reads = [(self.device_used(x, device), x["t"]) for x in self.samples]
        used = [(u[0], t) for u, t in reads if u]
        if used:
            v, t = max(used, key=lambda x: (x[0], -x[1]))
            mx.update(device_used=v, device_used_time=sec(t))
        for key in ("tree_rss", "tree_pss"):
            vals = [(x[key], x["t"]) for x in self.samples if x.get(key) is not None]
            if vals:
                v, t = max(vals, key=lambda x: (x[0], -x[1]))
                mx.update({key: v, key + "_time": sec(t)})
        avail = [
            (x["mem_available"], x["t"]) for x in self.samples if x.get("mem_available") is not None
        ]
        if avail:
            v, t = min(avail, key=lambda x: (x[0], x[1]))
            mx.update(mem_available_min=v, mem_available_time=sec(t))
            if base["mem_available"] is not None:
                mx["mem_available_drop"] = base["mem_available"] - v
        return mx

    def _tree_maxima(
        self, mx: dict[str, Any], traced: list[int], device: int | None, sec: Callable[[int], float]
    ) -> None:
        """The process tree's largest device use (per-process NVML) and its largest excess
        over the trace."""
        vals = [(v, j) for j in range(len(self.samples)) if (v := self._tree[j]) is not None]
        if not vals:
            return
        v, j = max(vals, key=lambda x: (x[0], -x[1]))
        mx.update(
            tree_device_bytes=v,
            tree_device_time=sec(self.ts[j]),
            traced_bytes_then=traced[j],
            untraced_bytes=v - traced[j],
        )
        u, j = max(((v - traced[j], j) for v, j in vals), key=lambda x: (x[0], -x[1]))
        mx.update(untraced_max_bytes=u, untraced_max_time=sec(self.ts[j]))

    # ---- series for pictures ----
    def series(self, device: int | None = None) -> dict[str, list[tuple[int, int]]]:
        """(ts, bytes) series: tree_device (NVML, process tree; only where NVML gave per-process
        figures), device_used (NVML, everyone), tree_rss, mem_available."""
        out: dict[str, list[Any]] = {
            "tree_device": [],
            "device_used": [],
            "tree_rss": [],
            "mem_available": [],
        }
        pp = self.per_process_for(device)
        for s in self.samples:
            t = s["t"]
            if pp:
                v = self.tree_device_bytes(s, device)
                if v is not None:
                    out["tree_device"].append((t, v))
            du = self.device_used(s, device)
            if du:
                out["device_used"].append((t, du[0]))
            if s.get("tree_rss") is not None:
                out["tree_rss"].append((t, s["tree_rss"]))
            if s.get("mem_available") is not None:
                out["mem_available"].append((t, s["mem_available"]))
        return out
