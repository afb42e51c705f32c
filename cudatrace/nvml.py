"""A minimal NVML binding through cffi (no new dependency): device memory and the memory each
process holds. Used by the sampler and to resolve budget shares (60%) on this machine.

A leaf: imports nothing from cudatrace.
"""
from __future__ import annotations

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
            self.why = f"NVML library not found ({e})"
            return
        try:
            rc = self.lib.nvmlInit_v2()
        except AttributeError as e:
            self.why = f"NVML lacks nvmlInit_v2 ({e})"
            return
        if rc != 0:
            self.why = f"nvmlInit failed (NVML error {rc})"
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
