"""The CUDA driver as the launcher sees it (ctypes, no toolkit): its version and each device's
name, total memory and whether it is integrated (unified memory: Jetson, GB10).

Used where NVML cannot tell (its memory queries answer NOT_SUPPORTED on integrated devices) and
by `cudatrace doctor`. cuInit creates no context, so this costs the device no memory.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from ctypes import byref, c_int, c_size_t

from ..record_types import DriverDevice

CU_DEVICE_ATTRIBUTE_INTEGRATED = 18
DRIVER_LIBRARY = "libcuda.so.1"


class Driver:
    """`available` False (with `why`) where there is no usable driver."""

    def __init__(self) -> None:
        self.available = False
        self.why = ""
        self.version: int | None = None
        self.devices: list[DriverDevice] = []
        try:
            lib = ctypes.CDLL(DRIVER_LIBRARY)
        except OSError as e:
            self.why = (
                f"{DRIVER_LIBRARY} not found (no NVIDIA driver installed)"
                if "No such file" in str(e)
                else f"{DRIVER_LIBRARY} does not load: {e}"
            )
            return
        v = c_int(0)
        try:
            if lib.cuDriverGetVersion(byref(v)) == 0:
                self.version = v.value
            rc = lib.cuInit(0)
        except AttributeError as e:
            self.why = f"{DRIVER_LIBRARY} is not a CUDA driver ({e})"
            return
        if rc != 0:
            self.why = f"cuInit failed (CUresult {rc})"
            return
        n = c_int(0)
        if lib.cuDeviceGetCount(byref(n)) != 0:
            self.why = "cuDeviceGetCount failed"
            return
        for ordinal in range(n.value):
            dev = c_int(0)
            if lib.cuDeviceGet(byref(dev), ordinal) != 0:
                continue
            name = ctypes.create_string_buffer(256)
            total = c_size_t(0)
            integ = c_int(0)
            row: DriverDevice = {"ordinal": ordinal}
            if lib.cuDeviceGetName(name, 256, dev) == 0:
                row["name"] = name.value.decode(errors="replace")
            if lib.cuDeviceTotalMem_v2(byref(total), dev) == 0:
                row["total"] = total.value
            if lib.cuDeviceGetAttribute(byref(integ), CU_DEVICE_ATTRIBUTE_INTEGRATED, dev) == 0:
                row["integrated"] = bool(integ.value)
            self.devices.append(row)
        self.available = True


def version_text(v: int | None) -> str:
    """13000 -> '13.0'"""
    return "none" if not v else "%d.%d" % (v // 1000, (v % 1000) // 10)


# the directories the dynamic loader searches after LD_LIBRARY_PATH and its cache (ld.so(8))
LOADER_DIRS = (
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
)


def driver_library(env: Mapping[str, str] | None = None) -> str | None:
    """Where the dynamic loader would find libcuda.so.1 for a program started with env
    (default: this process's environment): in LD_LIBRARY_PATH, its cache (ldconfig -p) or its
    default directories; None when nowhere (no NVIDIA driver here). Nothing is loaded."""
    import os

    env = os.environ if env is None else env
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    for d in dirs:
        if os.path.exists(os.path.join(d, DRIVER_LIBRARY)):
            return os.path.join(d, DRIVER_LIBRARY)
    cached = _loader_cache(DRIVER_LIBRARY)
    if cached:
        return cached
    return next(
        (
            os.path.join(d, DRIVER_LIBRARY)
            for d in LOADER_DIRS
            if os.path.exists(os.path.join(d, DRIVER_LIBRARY))
        ),
        None,
    )


def _loader_cache(name: str) -> str | None:
    """name's path in the dynamic loader's cache, as `ldconfig -p` lists it."""
    import shutil
    import subprocess

    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")
    if not ldconfig:
        return None
    try:
        out = subprocess.run(
            [ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        lib, _, path = line.strip().partition(" => ")
        if lib.split(" (", 1)[0] == name and path:
            return path.strip()
    return None
