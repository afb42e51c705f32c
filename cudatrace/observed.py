"""Traced versus observed: what the device showed for the process tree next to what the trace
holds live. The difference is memory no hook sees (CUDA contexts, module images, paths not
hooked) — the RSS-versus-free mismatch of the report cudatrace was born from, at a glance."""
from __future__ import annotations

import bisect

from .trace import TraceDir


class Observed:
    def __init__(self, td: TraceDir):
        self.samples = td.samples()
        self.samples.sort(key=lambda s: s.get("t", 0))
        self.ts = [s.get("t", 0) for s in self.samples]
        self.sampler = td.run.get("sampler", {})

    @property
    def nvml(self) -> bool:
        return any("devices" in s for s in self.samples)

    def why_no_nvml(self) -> str:
        return self.sampler.get("nvml_why") or "no NVML samples"

    def near(self, ts: int) -> dict | None:
        """The sample closest to monotonic time ts (None if there are none)."""
        if not self.samples:
            return None
        i = bisect.bisect_left(self.ts, ts)
        cands = [j for j in (i - 1, i) if 0 <= j < len(self.samples)]
        return self.samples[min(cands, key=lambda j: abs(self.ts[j] - ts))]

    def tree_device_bytes(self, s: dict) -> int | None:
        d = s.get("tree_device_bytes")
        if d is None:
            return None
        return sum(int(v) for v in d.values())

    def peak(self) -> dict:
        """Highest observed values over the run."""
        out = {"samples": len(self.samples)}
        tree = [self.tree_device_bytes(s) for s in self.samples]
        tree = [x for x in tree if x is not None]
        if tree:
            out["tree_device_bytes_max"] = max(tree)
        used = [sum(d.get("used", 0) for d in s.get("devices", [])) for s in self.samples
                if s.get("devices")]
        if used:
            out["device_used_max"] = max(used)
            out["device_used_min"] = min(used)
        avail = [s["mem_available"] for s in self.samples if s.get("mem_available") is not None]
        if avail:
            out["mem_available_min"] = min(avail)
            out["mem_available_max"] = max(avail)
        rss = [s.get("tree_rss", 0) for s in self.samples]
        if rss:
            out["tree_rss_max"] = max(rss)
        return out

    def at(self, ts: int, traced_bytes: int) -> dict:
        s = self.near(ts)
        if s is None:
            return {"available": False}
        out = {"available": True, "sample_t": s["t"], "sample_offset_ms": (s["t"] - ts) / 1e6,
               "traced_bytes": traced_bytes, "tree_rss": s.get("tree_rss"),
               "mem_available": s.get("mem_available")}
        tb = self.tree_device_bytes(s)
        if tb is not None:
            out["observed_tree_device_bytes"] = tb
            out["untraced_bytes"] = tb - traced_bytes
        if s.get("devices"):
            out["device_used"] = sum(d.get("used", 0) for d in s["devices"])
            out["device_total"] = sum(d.get("total", 0) for d in s["devices"])
        return out
