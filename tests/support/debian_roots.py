"""Root file systems of other Debian releases, for the preload library's glibc floor: made with
mmdebstrap from Debian's archive (deb.debian.org) once per session (shared_build), and the
test programs and simulated driver built for an old glibc with zig.

    bullseye(tmp_path_factory)   Debian 11, glibc 2.31 (as Ubuntu 20.04 and the CUDA base
                                 images built on them): {"root": folder, "tar": tarball,
                                 "seconds": how long mmdebstrap took}. libc6 and libgcc-s1 of
                                 amd64 and arm64, coreutils of amd64: the amd64 half is the
                                 image Podman imports, the arm64 half the folder qemu-aarch64 -L
                                 runs the aarch64 build in.
    trixie(tmp_path_factory)     Debian 13, glibc 2.41: libc6-dev, a sysroot (sysroot_cc) to
                                 build the library on a glibc newer than this machine's.
    old_sim(tmp_path_factory, arch)
                                 the simulated driver and PROGRAMS built for glibc 2.17 (zig),
                                 as simbuild.build_all returns them.

--variant=extract only unpacks the packages (no maintainer script, no chroot, no emulation of
arm64): no ld.so.cache either, which the loader does without (Debian's paths are built in).
needs_mmdebstrap() fails the test (never a skip) where mmdebstrap is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import cross
from .shared_build import shared_build

MIRROR = "http://deb.debian.org/debian"
APT = ['--aptopt=Acquire::Languages "none"', '--aptopt=Acquire::Retries "3"']
OLD_TARGET = "2.17"  # the programs and the simulated driver of the old roots: the floor's glibc
PROGRAMS = ("hold", "route_dlsym", "preload_probe")


def needs_mmdebstrap() -> None:
    if os.geteuid() != 0:
        pytest.fail("mmdebstrap --mode=root needs root (run the tests as root, as .ci/run does)")
    if not shutil.which("mmdebstrap"):
        pytest.fail("no mmdebstrap (apt-get install mmdebstrap: tools/install-test-deps.sh)")


def mmdebstrap(suite: str, dest: Path, include: list[str], archs: str = "amd64") -> float:
    """Unpack include (and what it depends on) of suite into dest (a folder, or a tarball when
    dest ends in .tar); returns the seconds it took."""
    t0 = time.monotonic()
    r = subprocess.run(
        ["mmdebstrap", "--variant=extract", "--mode=root", f"--architectures={archs}",
         f"--include={','.join(include)}", *APT, suite, str(dest), MIRROR],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if r.returncode != 0:
        raise AssertionError(f"mmdebstrap {suite} failed:\n{r.stderr[-3000:]}")
    return time.monotonic() - t0


def _bullseye(work: Path) -> dict[str, object]:
    tar = work / "bullseye.tar"
    seconds = mmdebstrap(
        "bullseye",
        tar,
        ["libc6", "libgcc-s1", "coreutils", "libc6:arm64", "libgcc-s1:arm64"],
        "amd64,arm64",
    )
    root = work / "root"
    root.mkdir()
    subprocess.run(["tar", "-xf", str(tar), "-C", str(root)], check=True)
    return {"root": str(root), "tar": str(tar), "seconds": round(seconds, 1)}


def bullseye(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    needs_mmdebstrap()
    return shared_build(tmp_path_factory, "bullseye", _bullseye)


def _trixie(work: Path) -> dict[str, object]:
    root = work / "root"
    seconds = mmdebstrap("trixie", root, ["libc6-dev"])
    for link in ("lib", "lib64"):  # merged /usr: base-files makes these, extract does not
        if not (root / link).exists():
            (root / link).symlink_to(f"usr/{link}")
    return {"root": str(root), "seconds": round(seconds, 1)}


def sysroot_cc(root: Path, cc: str = "gcc") -> str:
    """cc building against root's glibc: headers (--sysroot), start files (-B) and libraries
    (-L; libc.so's absolute paths are read inside the sysroot). Debian's gcc otherwise takes
    the start files and libraries beside itself, the host's."""
    lib = root / "usr/lib/x86_64-linux-gnu"
    return f"{cc} --sysroot={root} -B{lib}/ -L{lib}"


def trixie(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    needs_mmdebstrap()
    return shared_build(tmp_path_factory, "trixie", _trixie)


def zig_cc(target: str) -> str:
    return f"{sys.executable} -m ziglang cc -target {target}"


def old_sim(tmp_path_factory: pytest.TempPathFactory, arch: str) -> dict[str, Path | None]:
    """The simulated driver and PROGRAMS built for glibc OLD_TARGET on arch (x86_64, aarch64)."""

    def build(work: Path) -> dict[str, str | None]:
        paths = cross.build_sim(work, zig_cc(f"{arch}-linux-gnu.{OLD_TARGET}"), PROGRAMS)
        return {k: str(v) if v else None for k, v in paths.items()}

    built = shared_build(tmp_path_factory, f"oldsim-{arch}", build)
    return {k: Path(v) if v else None for k, v in built.items()}
