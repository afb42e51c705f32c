"""Observing device memory from outside the target while `cudatrace run` waits on it.

Every ~100 ms: NVML (through cffi, no new dependency) for each device's used/total and the
memory each process of the traced tree holds, plus /proc/meminfo MemAvailable and the tree's
RSS — which is all a unified-memory device (Jetson) offers, where NVML answers N/A. Samples go to
samples.jsonl, one JSON object a line, so a crash loses at most the line being written.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from ..nvml import Nvml
from ..procfs import meminfo, pss_of, rss_of, tree_pids
from .files import create


class Sampler(threading.Thread):
    def __init__(self, root_pid: int, path: Path, interval: float = 0.1):
        super().__init__(daemon=True, name="cudatrace-sampler")
        self.root = root_pid
        self.path = path
        self.interval = interval
        self._halt = threading.Event()
        self.nvml = None
        self.count = 0
        self.error = None

    def run(self):
        self.nvml = Nvml()
        try:
            self._loop()
        except OSError as e:  # a full disk, a planted link: stop sampling, never a traceback
            self.error = f"{self.path}: {e.strerror or e}"

    def _loop(self):
        with create(self.path) as f:
            while True:
                t0 = time.monotonic()
                pids = tree_pids(self.root)
                mi = meminfo()
                s = {
                    "t": time.monotonic_ns(),
                    "pids": pids,
                    "mem_available": mi.get("MemAvailable"),
                    "mem_free": mi.get("MemFree"),
                    "tree_rss": rss_of(pids),
                }
                devs = self.nvml.memory() if self.nvml.available else []
                if not any("used" in d for d in devs):
                    # no device figures (integrated devices: NVML says NOT_SUPPORTED): device
                    # memory is host RAM there, and PSS is the tree's fair share of it
                    s["tree_pss"] = pss_of(pids)
                if self.nvml.available:
                    s["devices"] = devs
                    procs = self.nvml.processes()
                    tree = set(pids)
                    s["tree_device_bytes"] = {
                        str(d): sum(b for p, b in m.items() if p in tree) for d, m in procs.items()
                    }
                f.write(json.dumps(s) + "\n")
                f.flush()
                self.count += 1
                if self._halt.wait(max(0.0, self.interval - (time.monotonic() - t0))):
                    break

    def stop(self):
        self._halt.set()
        self.join(timeout=2)

    def describe(self) -> dict:
        n = self.nvml
        return {
            "samples": self.count,
            "nvml": bool(n and n.available),
            "nvml_why": (n.why if n else "sampler did not start"),
            "driver": n.driver if n else None,
            "error": self.error,
        }
