"""A minimal NVML binding: device memory and the memory each process holds. Used by the
sampler while `cudatrace run` waits, and to resolve budget shares (60%) on this machine.

Written with ctypes, not cffi: NVML's few calls need no layout of ours (those live in the shim's
headers and go through cffi), and ctypes costs `cudatrace run` no C-declaration parsing and no
library search when NVML is absent (cffi's dlopen then runs ctypes.util.find_library, which
starts ldconfig and a compiler: 50 ms before the first sample on a machine without a GPU).

A leaf: imports nothing from cudatrace.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char_p, c_int, c_uint, c_ulonglong, c_void_p
from dataclasses import dataclass, field
from typing import Any, TypedDict

NVML_LIBRARY = "libnvidia-ml.so.1"
_NOT_AVAILABLE = 1 << 63  # NVML_VALUE_NOT_AVAILABLE is all ones
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of a process on a GPU without MIG
_INSUFFICIENT_SIZE = 7
_ERRORS = {1: "uninitialized", 2: "invalid argument", 3: "not supported", 4: "no permission",
           6: "not found", 13: "function not found", 15: "GPU is lost", 999: "unknown error"}  # fmt: skip

# why NVML gives no figure of a process's memory on a device (DeviceReading.procs_reason)
PROCS_NA = "na"  # listed, memory N/A: an integrated GPU (Jetson Thor)
PROCS_MIG = "mig"  # listed with MIG instance ids, memory N/A: a MIG instance seen from its GPU
PROCS_UNSUPPORTED = "unsupported"  # the query answers NOT_SUPPORTED
PROCS_MISSING = "missing"  # this NVML has no nvmlDeviceGetComputeRunningProcesses_v3
PROCS_ERROR = "error"  # the query failed otherwise


class _MemoryRowRequired(TypedDict):
    index: int


class MemoryRow(_MemoryRowRequired, total=False):
    """A device's memory as Nvml.memory() reads it: bytes, or the NVML error of its query."""

    total: int
    free: int
    used: int
    error: int


class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2, as _v3 of the call fills it)
    _fields_ = [
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


_SIGNATURES = {
    "nvmlInit_v2": [],
    "nvmlShutdown": [],
    "nvmlDeviceGetCount_v2": [POINTER(c_uint)],
    "nvmlDeviceGetHandleByIndex_v2": [c_uint, POINTER(c_void_p)],
    "nvmlDeviceGetMemoryInfo": [c_void_p, POINTER(_Memory)],
    "nvmlDeviceGetComputeRunningProcesses_v3": [c_void_p, POINTER(c_uint), POINTER(_ProcessInfo)],
    "nvmlSystemGetDriverVersion": [c_char_p, c_uint],
    "nvmlDeviceGetUUID": [c_void_p, c_char_p, c_uint],
    "nvmlDeviceGetName": [c_void_p, c_char_p, c_uint],
}


class _Lib:
    """The NVML functions, typed on first use; a missing one raises AttributeError."""

    def __init__(self, dll: ctypes.CDLL):
        self._dll = dll

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._dll, name)
        fn.restype = c_int
        fn.argtypes = _SIGNATURES[name]
        setattr(self, name, fn)
        return fn


def error_text(rc: int) -> str:
    return f"NVML error {rc} ({_ERRORS.get(rc, 'unknown')})"


@dataclass
class DeviceReading:
    """One GPU as NVML shows it at one moment (Nvml.read): its memory (None where NVML gives no
    figure, `memory_why` says why) and the processes holding memory on it, pid (host pid) ->
    bytes, None for a process listed without a figure; `procs` None where NVML cannot list
    them. `procs_reason` (PROCS_*) and `procs_why` say why some figure is missing."""

    index: int
    uuid: str = ""
    name: str = ""
    total: int | None = None
    used: int | None = None
    free: int | None = None
    memory_why: str | None = None
    memory_rc: int = 0  # NVML's answer to the memory query (3: NOT_SUPPORTED, integrated GPUs)
    procs: dict[int, int | None] | None = field(default_factory=dict)
    procs_reason: str | None = None
    procs_why: str | None = None

    @property
    def per_process(self) -> bool:
        """NVML gives every listed process's memory here."""
        return self.procs is not None and self.procs_reason is None


class Nvml:
    """A minimal NVML binding; `available` False (with `why`) where there is none."""

    def __init__(self) -> None:
        self.available = False
        self.why = ""
        self.handles: list[tuple[int, int]] = []
        self.driver = None
        try:
            self.lib = _Lib(ctypes.CDLL(NVML_LIBRARY))
        except OSError:
            self.why = f"no NVIDIA driver here ({NVML_LIBRARY} not found)"
            return
        try:
            rc = self.lib.nvmlInit_v2()
        except AttributeError as e:
            self.why = f"NVML lacks nvmlInit_v2 ({e})"
            return
        if rc != 0:
            self.why = f"nvmlInit failed (NVML error {rc})"
            return
        n = c_uint(0)
        if self.lib.nvmlDeviceGetCount_v2(byref(n)) != 0:
            self.why = "NVML could not count devices"
            return
        for i in range(n.value):
            h = c_void_p()
            if self.lib.nvmlDeviceGetHandleByIndex_v2(i, byref(h)) == 0:
                self.handles.append((i, h.value or 0))
        buf = ctypes.create_string_buffer(96)
        try:
            if self.lib.nvmlSystemGetDriverVersion(buf, 96) == 0:
                self.driver = buf.value.decode()
        except AttributeError:
            pass
        self.available = True

    def shutdown(self) -> None:
        """nvmlShutdown, where NVML was there; never raises."""
        try:
            self.lib.nvmlShutdown()
        except Exception:
            pass

    def memory(self) -> list[MemoryRow]:
        out: list[MemoryRow] = []
        m = _Memory()
        for i, h in self.handles:
            rc = self.lib.nvmlDeviceGetMemoryInfo(h, byref(m))
            if rc == 0:
                out.append({"index": i, "total": m.total, "free": m.free, "used": m.used})
            else:
                out.append({"index": i, "error": rc})
        return out

    def uuids(self) -> dict[int, str]:
        """device index -> its UUID ("GPU-..."); devices whose query fails are left out."""
        return self._strings("nvmlDeviceGetUUID")

    def names(self) -> dict[int, str]:
        """device index -> its product name ("NVIDIA H200"); devices whose query fails are
        left out."""
        return self._strings("nvmlDeviceGetName")

    def _strings(self, fn: str) -> dict[int, str]:
        out: dict[int, str] = {}
        buf = ctypes.create_string_buffer(96)
        for i, h in self.handles:
            try:
                if getattr(self.lib, fn)(h, buf, 96) == 0:
                    out[i] = buf.value.decode(errors="replace")
            except AttributeError:
                break
        return out

    def read(self) -> list[DeviceReading]:
        """Every GPU's UUID, name, memory and processes, as NVML says them now; [] without
        NVML."""
        if not self.available:
            return []
        uuids, names = self.uuids(), self.names()
        out = []
        for i, h in self.handles:
            r = DeviceReading(i, uuids.get(i, ""), names.get(i, ""))
            self._read_memory(h, r)
            self._read_procs(h, r)
            out.append(r)
        return out

    def _read_memory(self, h: int, r: DeviceReading) -> None:
        m = _Memory()
        try:
            rc = self.lib.nvmlDeviceGetMemoryInfo(h, byref(m))
        except AttributeError:
            rc = 13
        if rc != 0:
            r.memory_why, r.memory_rc = error_text(rc), rc
            return
        if m.total >= _NOT_AVAILABLE or m.used >= _NOT_AVAILABLE:
            r.memory_why = "NVML's figure is not available"
            return
        r.total, r.used, r.free = int(m.total), int(m.used), int(m.free)

    def _read_procs(self, h: int, r: DeviceReading) -> None:
        """r.procs (pid -> bytes or None) and, where a figure is missing, why."""
        cap = 64
        while True:
            infos = (_ProcessInfo * cap)()
            count = c_uint(cap)
            try:
                rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, byref(count), infos)
            except AttributeError:
                r.procs, r.procs_reason = None, PROCS_MISSING
                r.procs_why = "this driver's NVML has no nvmlDeviceGetComputeRunningProcesses_v3"
                return
            if rc == _INSUFFICIENT_SIZE and count.value > cap and cap < 65536:
                cap = count.value + 16  # processes came since the count
                continue
            break
        if rc != 0:
            r.procs = None
            r.procs_reason = PROCS_UNSUPPORTED if rc == 3 else PROCS_ERROR
            r.procs_why = f"NVML cannot list the processes ({error_text(rc)})"
            return
        procs: dict[int, int | None] = {}
        mig = False
        for k in range(min(count.value, cap)):
            pid, used = int(infos[k].pid), int(infos[k].usedGpuMemory)
            mig = mig or infos[k].gpuInstanceId != _NO_INSTANCE
            if used >= _NOT_AVAILABLE:
                procs[pid] = None
            elif procs.get(pid, 0) is not None:
                procs[pid] = (procs.get(pid) or 0) + used
        r.procs = procs
        if any(v is None for v in procs.values()):
            r.procs_reason = PROCS_MIG if mig else PROCS_NA
            r.procs_why = (
                "NVML lists the processes of this MIG instance without their memory"
                if mig
                else "NVML lists the processes without their memory (N/A: an integrated GPU "
                "shares the host's memory)"
            )

    def processes(self) -> dict[int, dict[int, int]]:
        """device index -> {pid: bytes}; devices whose query fails are left out."""
        out: dict[int, dict[int, int]] = {}
        cap = 256
        infos = (_ProcessInfo * cap)()
        count = c_uint(0)
        for i, h in self.handles:
            count.value = cap
            try:
                rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, byref(count), infos)
            except AttributeError:
                return out
            if rc != 0:
                continue
            d = out.setdefault(i, {})
            for k in range(min(count.value, cap)):
                used = infos[k].usedGpuMemory
                if used < _NOT_AVAILABLE:
                    d[infos[k].pid] = d.get(infos[k].pid, 0) + used
        return out
