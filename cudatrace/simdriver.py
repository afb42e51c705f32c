"""The simulated CUDA driver and NVML (sim/): the one rule that builds them.

    build(libdir) -> {"libdir": Path, "libcuda": Path, "libnvml": Path}

libdir receives libcuda.so.1 and libnvidia-ml.so.1 (with their libcuda.so / libnvidia-ml.so
links); put it in LD_LIBRARY_PATH and a program, traced or not, runs on the simulator. Used by
`cudatrace run --simulated` (simulate(): a fresh device for one run, the libraries built once
into the cache), `cudatrace demo` on a machine without a GPU, the test suite
(tests/support/simbuild.py) and tools/check_aarch64.py. The sources are sim/ beside the package in a checkout, or the copy a
wheel ships in cudatrace/_native/sim; the simulator includes native/include (cuda_abi.h,
hooks.def) so it exports exactly what the shim hooks.

A library is rebuilt only when it is missing, older than a source, or was built by another
command line; builds into one libdir are serialized with a lock file.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import native, settings
from .errors import CudatraceError

CFLAGS = [
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-D_GNU_SOURCE",
    "-pthread",
    "-O1",
    "-g",
    "-fPIC",
    "-shared",
    "-fno-omit-frame-pointer",
]
# name -> (sources in sim/, soname, development link)
LIBS = {
    "libcuda": (
        ("libcuda_sim.c", "cuda_api_context.c", "cuda_api_memory.c"),
        "libcuda.so.1",
        "libcuda.so",
    ),
    "libnvml": (("libnvml_sim.c",), "libnvidia-ml.so.1", "libnvidia-ml.so"),
}


class BuildError(CudatraceError, RuntimeError):
    """The simulated driver could not be built."""


def cc() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def sources() -> tuple[Path, Path]:
    """(sim/, native/include/): the simulator's sources and the headers it shares with the shim."""
    sim, nat = native.sim_source_dir(), native.source_dir()
    if sim is None or nat is None:
        raise BuildError(
            "cannot find the simulated driver's sources (sim/ and native/include/ "
            "beside the package, or cudatrace/_native/sim and _native/native)"
        )
    return sim, nat / "include"


def _up_to_date(out: Path, deps: list[Path], key: str) -> bool:
    stamp = out.parent / f".{out.name}.cmd"
    try:
        mtime = out.stat().st_mtime
        if stamp.read_text() != key:
            return False
    except OSError:
        return False
    return all(d.stat().st_mtime <= mtime for d in deps if d.exists())


def compile_if_stale(
    out: Path,
    cmd_tail: list[str],
    deps: list[Path],
    *,
    allow_fail: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Path | None:
    """Run `cc -o <out> <cmd_tail>` unless out is current; out is replaced atomically.
    A failure raises BuildError (None with allow_fail); compiler warnings go to warn."""
    key = shlex.join([*cc(), "-o", str(out), *cmd_tail])
    if _up_to_date(out, deps, key):
        return out
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    cmd = [*cc(), "-o", str(tmp), *cmd_tail]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"cannot run the C compiler {cmd[0]!r} (set CC): {e}") from None
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        if allow_fail:
            return None
        raise BuildError(
            f"build of {out.name} failed:\n$ {shlex.join(cmd)}\n{res.stdout}{res.stderr}"
        )
    if res.stderr.strip() and warn is not None and not allow_fail:
        warn(f"warnings building {out.name}:\n{res.stderr}")
    os.replace(tmp, out)
    (out.parent / f".{out.name}.cmd").write_text(key)
    return out


def _symlink(link: Path, target: str) -> None:
    try:
        if os.readlink(link) == target:
            return
    except OSError:
        pass
    tmp = link.with_name(f".{link.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def build(libdir: Path, *, warn: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Build the simulated libcuda and libnvml into libdir; returns their paths and libdir."""
    libdir = Path(libdir).resolve()
    libdir.mkdir(parents=True, exist_ok=True)
    sim, include = sources()
    deps = [*sorted(sim.glob("*.h")), include / "cuda_abi.h", include / "hooks.def"]
    result = {"libdir": libdir}
    with open(libdir / ".simdriver.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name, (srcs, soname, devlink) in LIBS.items():
            out = libdir / soname
            compile_if_stale(
                out,
                [
                    *CFLAGS,
                    f"-I{include}",
                    f"-I{sim}",
                    f"-Wl,-soname,{soname}",
                    "-Wl,-Bsymbolic",
                    "-Wl,--no-undefined",
                    *(str(sim / s) for s in srcs),
                    "-ldl",
                ],
                [*(sim / s for s in srcs), *deps],
                warn=warn,
            )
            _symlink(libdir / devlink, soname)
            result[name] = out
    return result


# ---- a simulated device for one run (`cudatrace run --simulated`) -------------------------------

DEFAULT_MEMORY = 16 << 30  # the simulated device's memory unless --sim-memory says otherwise


def cache_libdir() -> Path:
    """Where `run --simulated` builds the simulator once: $CUDATRACE_CACHE (else
    ~/.cache/cudatrace), a folder per source tree (two checkouts do not rebuild each other's)."""
    base = settings.value("CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cudatrace"
    )
    sim, _ = sources()
    tag = hashlib.sha256(str(sim).encode()).hexdigest()[:10]
    return Path(base) / f"simdriver-{tag}" / "lib"


@dataclass
class Simulated:
    """A simulated device of `total_bytes` for one run: `env` holds what CMD needs (the
    libraries first in LD_LIBRARY_PATH, the device's size and its state file); close() removes
    the state file."""

    libdir: Path
    state: Path
    total_bytes: int
    env: dict[str, str]
    saved: dict[str, str | None]  # this process's environment before simulate()

    def close(self) -> None:
        """Remove the device's state file; this process's environment as it was."""
        self.state.unlink(missing_ok=True)
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def simulate(total_bytes: int = DEFAULT_MEMORY) -> Simulated:
    """Build (or reuse) the simulator in the cache and make a fresh device of total_bytes that
    every process of the run shares. This process's own environment is set too, and the two
    libraries are loaded into it, so that what the launcher asks NVML and the driver (a budget's
    share of the device, the observed samples) is asked of the simulator, as CMD's calls are."""
    libdir = build(cache_libdir())["libdir"]
    fd, name = tempfile.mkstemp(prefix=".device-", suffix=".state", dir=libdir.parent)
    os.close(fd)
    rest = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join([str(libdir), *(d for d in rest if d != str(libdir))]),
        "CUDASIM_TOTAL_BYTES": str(total_bytes),
        "CUDASIM_STATE": name,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    for _name, (_srcs, soname, _link) in LIBS.items():
        # loaded by path now, found by soname later (ctypes.CDLL("libnvidia-ml.so.1"))
        ctypes.CDLL(str(libdir / soname), mode=ctypes.RTLD_GLOBAL)
    return Simulated(libdir, Path(name), total_bytes, env, saved)
