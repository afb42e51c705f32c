"""Root file systems of other Debian releases, for the preload library's glibc floor: made with
mmdebstrap from Debian's archive (deb.debian.org) once per session (shared_build), and the
test programs and simulated driver built against them.

    bullseye(tmp_path_factory)   Debian 11, glibc 2.31 (as Ubuntu 20.04 and the CUDA base
                                 images built on them): {"root": folder, "tar": tarball,
                                 "seconds": how long mmdebstrap took}. libc6, libgcc-s1 and
                                 libc6-dev of amd64 and arm64, coreutils of amd64: the tarball
                                 is the image Podman imports, the folder what qemu-aarch64 -L
                                 runs the aarch64 build in and the programs are built against.
    trixie(tmp_path_factory)     Debian 13, glibc 2.41: libc6-dev, to build the library on a
                                 glibc newer than this machine's.
    sysroot_cc(root, arch)       a compiler command (gcc, aarch64-linux-gnu-gcc) that builds
                                 against root's glibc: its start files and libraries.
    old_sim(tmp_path_factory, arch)
                                 the simulated driver and PROGRAMS built against Debian 11's
                                 glibc, as simbuild.build_all returns them.

--variant=extract only unpacks the packages (no maintainer script, no chroot, no emulation of
arm64): no ld.so.cache either, which the loader does without (Debian's paths are built in); the
folder's absolute links are made relative (so the linker and qemu find their targets inside it).
needs_mmdebstrap() fails the test (never a skip) where mmdebstrap is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from . import cross
from .shared_build import shared_build

MIRROR = "http://deb.debian.org/debian"
APT = ['--aptopt=Acquire::Languages "none"', '--aptopt=Acquire::Retries "3"']
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


def _relative_links(root: Path) -> None:
    """Each absolute link under root (/lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/...)
    made relative, so that it resolves inside root from outside it."""
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(d) / name
            if p.is_symlink() and os.readlink(p).startswith("/"):
                target = os.path.relpath(str(root) + os.readlink(p), d)
                p.unlink()
                p.symlink_to(target)


def _bullseye(work: Path) -> dict[str, object]:
    tar = work / "bullseye.tar"
    seconds = mmdebstrap(
        "bullseye",
        tar,
        ["libc6", "libgcc-s1", "libc6-dev", "coreutils"]
        + ["libc6:arm64", "libgcc-s1:arm64", "libc6-dev:arm64"],
        "amd64,arm64",
    )
    root = work / "root"
    root.mkdir()
    subprocess.run(["tar", "-xf", str(tar), "-C", str(root)], check=True)
    _relative_links(root)
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


CROSS_CC = {"x86_64": "gcc", "aarch64": cross.CC}


def sysroot_cc(root: Path, arch: str = "x86_64") -> str:
    """A compiler building against root's glibc for arch: its start files (-B) and libraries
    (-L; the absolute paths of libc.so, a linker script, are read inside the sysroot). Debian's
    gcc given --sysroot alone takes the start files and libraries beside itself, this
    machine's."""
    usr, lib = root / "usr/lib" / f"{arch}-linux-gnu", root / "lib" / f"{arch}-linux-gnu"
    return f"{CROSS_CC[arch]} --sysroot={root} -B{usr}/ -L{usr} -L{lib}"


def trixie(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    needs_mmdebstrap()
    return shared_build(tmp_path_factory, "trixie", _trixie)


def old_sim(tmp_path_factory: pytest.TempPathFactory, arch: str) -> dict[str, Path | None]:
    """The simulated driver and PROGRAMS built against Debian 11's glibc for arch (x86_64,
    aarch64)."""
    root = Path(str(bullseye(tmp_path_factory)["root"]))

    def build(work: Path) -> dict[str, str | None]:
        paths = cross.build_sim(work, sysroot_cc(root, arch), PROGRAMS)
        return {k: str(v) if v else None for k, v in paths.items()}

    built = shared_build(tmp_path_factory, f"oldsim-{arch}", build)
    return {k: Path(v) if v else None for k, v in built.items()}
