"""Observing device memory from outside the target while `cudatrace run` waits on it.

Every ~100 ms: NVML (through cffi, no new dependency) for each device's used/total and the
memory each process of the traced tree holds, plus /proc/meminfo MemAvailable and the tree's
RSS — which is all a unified-memory device (Jetson) offers, where NVML answers N/A. Samples go to
samples.jsonl, one JSON object a line, so a crash loses at most the line being written.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import cffi

_NVML_CDEF = """
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned long long total; unsigned long long free; unsigned long long used; } nvmlMemory_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId;
                 unsigned int computeInstanceId; } nvmlProcessInfo_t;
int nvmlInit_v2(void);
int nvmlShutdown(void);
int nvmlDeviceGetCount_v2(unsigned int *count);
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos);
int nvmlSystemGetDriverVersion(char *version, unsigned int length);
"""


class Nvml:
    """A minimal NVML binding; `available` False (with `why`) where there is none."""

    def __init__(self):
        self.available = False
        self.why = ""
        self.handles = []
        self.driver = None
        try:
            self.ffi = cffi.FFI()
            self.ffi.cdef(_NVML_CDEF)
            self.lib = self.ffi.dlopen("libnvidia-ml.so.1")
        except (OSError, AttributeError) as e:
            self.why = "NVML library not found (%s)" % e
            return
        try:
            rc = self.lib.nvmlInit_v2()
        except AttributeError as e:
            self.why = "NVML lacks nvmlInit_v2 (%s)" % e
            return
        if rc != 0:
            self.why = "nvmlInit failed (NVML error %d)" % rc
            return
        n = self.ffi.new("unsigned int *")
        if self.lib.nvmlDeviceGetCount_v2(n) != 0:
            self.why = "NVML could not count devices"
            return
        for i in range(n[0]):
            h = self.ffi.new("nvmlDevice_t *")
            if self.lib.nvmlDeviceGetHandleByIndex_v2(i, h) == 0:
                self.handles.append((i, h[0]))
        buf = self.ffi.new("char[96]")
        try:
            if self.lib.nvmlSystemGetDriverVersion(buf, 96) == 0:
                self.driver = self.ffi.string(buf).decode()
        except AttributeError:
            pass
        self.available = True

    def memory(self) -> list[dict]:
        out = []
        m = self.ffi.new("nvmlMemory_t *")
        for i, h in self.handles:
            rc = self.lib.nvmlDeviceGetMemoryInfo(h, m)
            if rc == 0:
                out.append({"index": i, "total": m.total, "free": m.free, "used": m.used})
            else:
                out.append({"index": i, "error": rc})
        return out

    def processes(self) -> dict[int, dict[int, int]]:
        """device index -> {pid: bytes}; devices whose query fails are left out."""
        out: dict[int, dict[int, int]] = {}
        cap = 256
        infos = self.ffi.new("nvmlProcessInfo_t[]", cap)
        count = self.ffi.new("unsigned int *")
        for i, h in self.handles:
            count[0] = cap
            try:
                rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, count, infos)
            except AttributeError:
                return out
            if rc != 0:
                continue
            d = out.setdefault(i, {})
            for k in range(min(count[0], cap)):
                used = infos[k].usedGpuMemory
                if used < (1 << 63):            # NVML_VALUE_NOT_AVAILABLE is all ones
                    d[infos[k].pid] = d.get(infos[k].pid, 0) + used
        return out


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_of(pids) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for p in pids:
        try:
            with open("/proc/%d/statm" % p) as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            pass
    return total


class Sampler(threading.Thread):
    def __init__(self, root_pid: int, path: Path, interval: float = 0.1):
        super().__init__(daemon=True, name="cudatrace-sampler")
        self.root = root_pid
        self.path = path
        self.interval = interval
        self._halt = threading.Event()
        self.nvml = None
        self.count = 0

    def run(self):
        from .launcher import tree_pids
        self.nvml = Nvml()
        with open(self.path, "a") as f:
            while True:
                t0 = time.monotonic()
                pids = tree_pids(self.root)
                s = {"t": time.monotonic_ns(), "pids": pids, "mem_available": mem_available(),
                     "tree_rss": rss_of(pids)}
                if self.nvml.available:
                    s["devices"] = self.nvml.memory()
                    procs = self.nvml.processes()
                    tree = set(pids)
                    s["tree_device_bytes"] = {str(d): sum(b for p, b in m.items() if p in tree)
                                              for d, m in procs.items()}
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
        return {"samples": self.count, "nvml": bool(n and n.available),
                "nvml_why": (n.why if n else "sampler did not start"),
                "driver": n.driver if n else None}
