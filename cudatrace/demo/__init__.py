"""The engine of `cudatrace demo`: replay the KV-pool sizing defect that cudatrace was born from.

The example program (examples/kv-pool/kvpool.c) starts like the LLM server of the original
report: weights, a grow-only workspace, a KV cache of one pool per attention layer, a pinned
staging buffer. Its --kv-cache-memory sizing counts one layer per block while it allocates one
pool per layer, so a 1 GiB budget becomes 28 x 1 GiB. The demo builds it, traces it under the
three sizing settings (--kv-cache-memory 1GiB, --num-blocks 64, the 256-block fallback),
reports and diffs the traces, stops the oversized pool with --budget 12GiB, and ends with a
`cudatrace sweep` of --kv-cache-memory that gives the per-layer law (28 bytes per byte, flagged
by --expect 1).

Where it runs: on the GPU when there is one (NVML lists a device: cudatrace/nvml.py), else on cudatrace's simulated CUDA driver (sim/), as a
Jetson-like integrated device of 122 GiB; then every line it prints starts with [simulated].

What it needs, found in the source checkout or, for an installed package, in the package:
    kvpool.c             examples/kv-pool/          or cudatrace/_native/demo/
    the simulated driver cudatrace.simdriver.build, from sim/ and native/include/ (or
                         cudatrace/_native/sim and cudatrace/_native/native)
and a C compiler ($CC, else cc).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from .. import settings
from ..errors import CudatraceError, OptionError
from ..nvml import MemoryRow, Nvml
from .build import PKG, DemoError, build_kvpool, build_sim
from .walkthrough import Demo, Plan, human

__all__ = ["DemoError", "gpu_free_bytes", "gpu_present", "run_demo"]

GiB = 1 << 30
# The simulated device: a Jetson AGX Thor-like integrated GPU (122 GiB visible to CUDA).
SIM_TOTAL_BYTES = 122 * GiB


# ---- where it runs --------------------------------------------------------------------------


def _nvml_memory() -> list[MemoryRow] | None:
    """NVML's devices' memory (None: NVML lists no device here)."""
    nv = Nvml()
    if not nv.available or not nv.handles:
        return None
    try:
        return nv.memory()
    finally:
        nv.shutdown()


def gpu_present() -> bool:
    """Whether NVML lists a GPU on this machine."""
    return _nvml_memory() is not None


def gpu_free_bytes() -> int | None:
    """Device 0's free memory as NVML says it (None: unknown, e.g. an integrated device)."""
    mem = _nvml_memory() or []
    free = mem[0].get("free") if mem else None
    return free if isinstance(free, int) else None


# ---- the run ---------------------------------------------------------------------------------


def _workspace(out_dir: Path | None) -> Path:
    """The demo's folder: out_dir (kept), else a temporary one."""
    try:
        work = (
            out_dir.resolve()
            if out_dir is not None
            else Path(tempfile.mkdtemp(prefix="cudatrace-demo-"))
        )
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CudatraceError(
            f"demo: cannot use {e.filename or out_dir} as the demo's folder: {e.strerror or e}"
        ) from None
    return work


def _environment(work: Path) -> dict[str, str]:
    """The commands' environment: this package first on PYTHONPATH, a symbol cache in the
    folder, no simulated driver's settings or preload inherited."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CUDASIM_") and k != "LD_PRELOAD"
    }
    pkgroot = str(PKG.parent)
    env["PYTHONPATH"] = pkgroot + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault(settings.name("CACHE"), str(work / "symcache"))
    return env


def _prepare(mode: str, work: Path, env: MutableMapping[str, str]) -> tuple[Path, Plan]:
    """Build kvpool (and on the simulated driver, the driver itself, set in env); the
    walkthrough's sizes. Raises DemoError."""
    if mode != "simulated":
        return build_kvpool(work / "build", None), Plan.for_free_bytes(gpu_free_bytes())
    libdir = build_sim(work / "build" / "sim")
    env["LD_LIBRARY_PATH"] = str(libdir) + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""
    )
    env["CUDASIM_TOTAL_BYTES"] = str(SIM_TOTAL_BYTES)
    env["CUDASIM_INTEGRATED"] = "1"
    env["CUDASIM_STATE"] = str(work / "build" / "sim-device.state")
    Path(env["CUDASIM_STATE"]).unlink(missing_ok=True)
    return build_kvpool(work / "build", libdir), Plan()


def _walk(mode: str, label: str, work: Path, temporary: bool) -> int:
    """Build, then the walkthrough in work (removed afterwards when temporary); its exit
    status."""
    env = _environment(work)
    try:
        kvpool, plan = _prepare(mode, work, env)
    except DemoError as e:
        for line in str(e).splitlines():
            sys.stderr.write(f"{label} cudatrace demo: {line}\n")
        return 1
    demo = Demo(work, label, env, kvpool, plan)
    if mode == "simulated":
        demo.say(
            "No GPU in use: this runs on cudatrace's simulated CUDA driver, a Jetson-like "
            f"integrated device of {human(SIM_TOTAL_BYTES)}."
        )
    else:
        demo.say("Running on the GPU (device 0).")
    demo.say(f"Working folder: {work}")
    demo.say()
    status = demo.run()
    if temporary:
        demo.say(f"(removing {work}; pass --keep or -o DIR to keep the traces)")
    else:
        demo.say(f"Traces kept in {work}")
    return status


def run_demo(mode: str | None = None, out_dir: Path | None = None, keep: bool = False) -> int:
    """The body of `cudatrace demo`: mode "gpu", "simulated" or None (the GPU when there is
    one); out_dir keeps the build and traces (else a temporary folder, removed unless keep).
    Returns the exit status; raises CudatraceError on bad input."""
    if mode is None:
        mode = "gpu" if gpu_present() else "simulated"
    elif mode == "gpu" and not gpu_present():
        raise OptionError(
            "--gpu: no NVIDIA GPU here (NVML lists none); run without --gpu to use the "
            "simulated driver"
        )
    label = "[simulated]" if mode == "simulated" else "[gpu]"
    temporary = out_dir is None and not keep
    work = _workspace(out_dir)
    try:
        return _walk(mode, label, work, temporary)
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
