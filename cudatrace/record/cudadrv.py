"""The CUDA driver as the launcher sees it (ctypes, no toolkit): its version and each device's
name, total memory and whether it is integrated (unified memory: Jetson, GB10).

Used where NVML cannot tell (its memory queries answer NOT_SUPPORTED on integrated devices) and
by `cudatrace doctor`. cuInit creates no context, so this costs the device no memory.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_int, c_size_t

CU_DEVICE_ATTRIBUTE_INTEGRATED = 18
DRIVER_LIBRARY = "libcuda.so.1"


class Driver:
    """`available` False (with `why`) where there is no usable driver."""

    def __init__(self) -> None:
        self.available = False
        self.why = ""
        self.version: int | None = None
        self.devices: list[dict] = []
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
            row: dict[str, int | str | bool] = {"ordinal": ordinal}
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
