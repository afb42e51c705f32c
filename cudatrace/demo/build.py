"""Building what `cudatrace demo` runs: the example program (examples/kv-pool/kvpool.c, or the
copy a wheel ships in cudatrace/_native/demo) against the simulated driver or the system's,
with the C compiler ($CC, else cc)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from .. import simdriver
from ..errors import CudatraceError

PKG = Path(__file__).resolve().parent.parent  # the package
REPO = PKG.parent  # the source checkout, when running from one
NATIVE = PKG / "_native"


class DemoError(CudatraceError):
    """The demo could not be built or run."""


def _first(*candidates: Path) -> Path | None:
    for c in candidates:
        if c.is_file():
            return c
    return None


def kvpool_source() -> Path:
    src = _first(REPO / "examples" / "kv-pool" / "kvpool.c", NATIVE / "demo" / "kvpool.c")
    if src is None:
        raise DemoError(
            "cannot find kvpool.c (looked in {} and {})".format(
                REPO / "examples" / "kv-pool", NATIVE / "demo"
            )
        )
    return src


def _cc() -> list[str]:
    cc = shlex.split(os.environ.get("CC", "cc"))
    if not shutil.which(cc[0]):
        raise DemoError(
            "no C compiler: the demo compiles its example program (set CC or install cc/gcc)"
        )
    return cc


def _compile(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise DemoError(f"building {what} failed:\n$ {shlex.join(cmd)}\n{r.stdout}{r.stderr}")


def build_sim(outdir: Path) -> Path:
    """The simulated driver and NVML (cudatrace.simdriver); returns the folder to put in
    LD_LIBRARY_PATH."""
    try:
        return simdriver.build(outdir / "lib")["libdir"]
    except simdriver.BuildError as e:
        raise DemoError(f"building the simulated driver failed: {e}") from None


def find_libcuda() -> Path | None:
    """The real driver library, for linking on a GPU machine without the libcuda.so dev link."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.match(r"\s*libcuda\.so\.1 \(([^)]*)\) => (\S+)", line)
            if m and ("x86-64" in m.group(1) or "AArch64" in m.group(1) or "64" in m.group(1)):
                return Path(m.group(2))
    except OSError:
        pass
    for d in (
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu/nvidia",
        "/usr/lib/aarch64-linux-gnu/tegra",
        "/usr/local/cuda/compat",
        "/usr/lib/wsl/lib",
    ):
        p = Path(d) / "libcuda.so.1"
        if p.exists():
            return p
    return None


def build_kvpool(outdir: Path, libdir: Path | None) -> Path:
    """kvpool, as examples/kv-pool/Makefile builds it; against libdir's libcuda.so (the
    simulator) or the system's driver."""
    outdir.mkdir(parents=True, exist_ok=True)
    exe = outdir / "kvpool"
    base = _cc() + [
        "-O1",
        "-g",
        "-fno-omit-frame-pointer",
        "-rdynamic",
        "-o",
        str(exe),
        str(kvpool_source()),
    ]
    if libdir is not None:
        _compile(base + [f"-L{libdir}", "-ldl", "-lcuda"], "kvpool")
        return exe
    r = subprocess.run(base + ["-ldl", "-lcuda"], capture_output=True, text=True)
    if r.returncode == 0:
        return exe
    lib = find_libcuda()  # driver-only installs have no libcuda.so link
    if lib is None:
        raise DemoError(f"building kvpool failed: no libcuda to link against\n{r.stderr}")
    _compile(base + ["-ldl", str(lib)], "kvpool")
    return exe
