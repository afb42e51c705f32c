"""Observing device memory from outside the target while `cudatrace run` waits on it.

Every ~100 ms: NVML (through cffi, no new dependency) for each device's used/total and the
memory each process of the traced tree holds, plus /proc/meminfo MemAvailable and the tree's
RSS — which is all a unified-memory device (Jetson) offers, where NVML answers N/A. Samples go to
samples.jsonl, one JSON object a line, so a crash loses at most the line being written; under
`--aggregate` the files stay bounded whatever the run's length (BoundedLog).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TypedDict

from .. import tracedir as td
from ..nvml import MemoryRow, Nvml
from ..procfs import meminfo, pss_of, rss_of, tree_pids
from .files import create, replace_lines


class _SampleRequired(TypedDict):
    t: int  # time.monotonic_ns()
    pids: list[int]  # the traced tree
    mem_available: int | None  # /proc/meminfo, bytes
    mem_free: int | None
    tree_rss: int


class Sample(_SampleRequired, total=False):
    """One line of samples.jsonl: the host's and the tree's figures; with NVML, each device's
    and the tree's per device (device index as text) and per process (pid as text)."""

    tree_pss: int | None  # without device figures (an integrated device)
    devices: list[MemoryRow]
    tree_device_bytes: dict[str, int]
    tree_device_pids: dict[str, dict[str, int]]
    nvml_t: list[int]  # when NVML was read: [before, after]


class SamplerInfo(TypedDict):
    """What the sampler did (run.json "sampler")."""

    samples: int
    interval_ms: float
    nvml: bool
    nvml_why: str
    driver: str | None
    error: str | None


class FullLog:
    """Every sample, appended to samples.jsonl."""

    def __init__(self, out: Path):
        self.f = create(out / td.SAMPLES)

    def add(self, s: Sample) -> None:
        self.f.write(json.dumps(s) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def _figures(s: Sample) -> dict[str, int]:
    """The figures whose extremes the report compares with, each as a value to maximize."""
    out: dict[str, int] = {}
    for k, v in (("tree_rss", s.get("tree_rss")), ("tree_pss", s.get("tree_pss"))):
        if v is not None:
            out[k] = v
    for k, v in (("mem_available", s.get("mem_available")), ("mem_free", s.get("mem_free"))):
        if v is not None:  # their lowest
            out[k] = -v
    for d, b in (s.get("tree_device_bytes") or {}).items():
        out["tree_device:" + d] = b
    for row in s.get("devices") or ():
        if isinstance(row, dict) and row.get("used") is not None:
            out["device_used:%s" % row.get("index")] = row["used"]
    return out


class BoundedLog:
    """--aggregate: disk use bounded whatever the run's length (under 1 MB), and what the
    report compares with kept exactly:

    samples.jsonl           the recent samples at full rate; after RECENT lines it is renamed
    samples.prev.jsonl      over the previous one: the last RECENT to 2*RECENT samples are whole
    samples.history.jsonl   the whole run, thinned: every stride-th sample, the stride doubling
                            (the file rewritten with every other line) when it passes HISTORY
                            lines; its first line is the run's first sample (the baseline)
    samples.extremes.jsonl  the sample at each figure's extreme (highest device bytes of the
                            tree, device used, RSS, PSS; lowest MemAvailable, MemFree), rewritten
                            at most once a second when one changes, and at the end

    Appends lose at most the line being written; rewrites replace a file atomically."""

    RECENT = 900
    HISTORY = 1200

    def __init__(self, out: Path, recent: int | None = None, history: int | None = None):
        self.out = out
        self.recent_max = recent or self.RECENT
        self.history_max = history or self.HISTORY
        self.recent = create(out / td.SAMPLES)
        self.recent_n = 0
        self.history = create(out / td.SAMPLES_HISTORY)
        self.history_lines: list[str] = []
        self.stride = 1
        self.n = 0
        self.best: dict[str, tuple[int, str]] = {}  # figure -> (value, sample line)
        self.extremes_dirty = False
        self.extremes_written = 0.0

    def add(self, s: Sample) -> None:
        line = json.dumps(s)
        if self.recent_n >= self.recent_max:
            self.recent.close()
            os.replace(self.out / td.SAMPLES, self.out / td.SAMPLES_PREV)
            self.recent = create(self.out / td.SAMPLES)
            self.recent_n = 0
        self.recent.write(line + "\n")
        self.recent.flush()
        self.recent_n += 1
        if self.n % self.stride == 0:
            if len(self.history_lines) >= self.history_max:
                self.history_lines = self.history_lines[::2]
                self.stride *= 2
                self.history.close()
                self.history = replace_lines(self.out / td.SAMPLES_HISTORY, self.history_lines)
            if self.n % self.stride == 0:
                self.history_lines.append(line)
                self.history.write(line + "\n")
                self.history.flush()
        self.n += 1
        for k, v in _figures(s).items():
            old = self.best.get(k)
            if old is None or v > old[0]:
                self.best[k] = (v, line)
                self.extremes_dirty = True
        if self.extremes_dirty and time.monotonic() - self.extremes_written >= 1.0:
            self._write_extremes()

    def _write_extremes(self) -> None:
        lines = sorted({line for _, line in self.best.values()})
        replace_lines(self.out / td.SAMPLES_EXTREMES, lines).close()
        self.extremes_dirty = False
        self.extremes_written = time.monotonic()

    def close(self) -> None:
        if self.extremes_dirty:
            self._write_extremes()
        self.recent.close()
        self.history.close()


class Sampler(threading.Thread):
    def __init__(self, root_pid: int, out: Path, interval: float = 0.1, bounded: bool = False):
        super().__init__(daemon=True, name="cudatrace-sampler")
        self.root = root_pid
        self.out = out
        self.bounded = bounded
        self.interval = interval
        self._halt = threading.Event()
        self.nvml: Nvml | None = None  # loaded by the thread
        self.count = 0
        self.error: str | None = None

    def run(self) -> None:
        nvml = self.nvml = Nvml()
        try:
            self._loop(nvml)
        except OSError as e:  # a full disk, a planted link: stop sampling, never a traceback
            self.error = f"{e.filename or self.out}: {e.strerror or e}"

    def _loop(self, nvml: Nvml) -> None:
        log = BoundedLog(self.out) if self.bounded else FullLog(self.out)
        try:
            while True:
                t0 = time.monotonic()
                pids = tree_pids(self.root)
                mi = meminfo()
                s: Sample = {
                    "t": time.monotonic_ns(),
                    "pids": pids,
                    "mem_available": mi.get("MemAvailable"),
                    "mem_free": mi.get("MemFree"),
                    "tree_rss": rss_of(pids),
                }
                t_read = time.monotonic_ns()  # NVML is read after the rest of the sample
                devs = nvml.memory() if nvml.available else []
                if not any("used" in d for d in devs):
                    # no device figures (integrated devices: NVML says NOT_SUPPORTED): device
                    # memory is host RAM there, and PSS is the tree's fair share of it
                    s["tree_pss"] = pss_of(pids)
                if nvml.available:
                    s["devices"] = devs
                    procs = nvml.processes()
                    tree = set(pids)
                    s["tree_device_bytes"] = {
                        str(d): sum(b for p, b in m.items() if p in tree) for d, m in procs.items()
                    }
                    # per process too: a report leaves out a process NVML still lists after
                    # its trace ended (the driver gives its memory back after the exit record)
                    s["tree_device_pids"] = {
                        str(d): {str(p): b for p, b in m.items() if p in tree}
                        for d, m in procs.items()
                    }
                    # when NVML was read: what it saw is set beside the trace over this window
                    s["nvml_t"] = [t_read, time.monotonic_ns()]
                log.add(s)
                self.count += 1
                if self._halt.wait(max(0.0, self.interval - (time.monotonic() - t0))):
                    break
        finally:
            log.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)

    def describe(self) -> SamplerInfo:
        n = self.nvml
        return {
            "samples": self.count,
            "interval_ms": round(self.interval * 1000, 3),
            "nvml": bool(n and n.available),
            "nvml_why": (n.why if n else "sampler did not start"),
            "driver": n.driver if n else None,
            "error": self.error,
        }
