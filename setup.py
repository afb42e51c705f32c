"""Builds the native libraries with the system C compiler (native/Makefile) into the package.

No CUDA toolkit or headers are needed: the shim declares the few driver types it uses.
The wheel also carries, under cudatrace/_native/:
    native/   the C sources (include/ is what the cffi reader parses; the rest rebuilds the libraries)
    sim/      the simulated driver's sources (cudatrace.simdriver builds it for `cudatrace demo`)
    demo/     the demo's example program (examples/kv-pool)
    ffi_view_<hash>.py  the cffi view of native/include, parsed at build (native.py: build_view)
Nothing of tests/ is shipped.
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
SOURCE_SUFFIXES = (".h", ".c", ".def", ".py")  # .py: native/floor/glibc_floor.py
DEMO_FILES = ["examples/kv-pool/kvpool.c", "examples/kv-pool/Makefile"]


def _copy_tree(src: Path, dst: Path) -> None:
    for p in sorted(src.rglob("*")):
        if p.is_file() and (p.suffix in SOURCE_SUFFIXES or p.name == "Makefile"):
            target = dst / p.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)


# the commands that build the native libraries (pip's wheel builds, editable installs)
BUILDING = {"build", "build_py", "bdist_wheel", "editable_wheel", "develop", "install"}


def missing_tools() -> list[str]:
    """What the native build needs and this machine lacks: the C compiler ($CC, else cc), make
    and readelf (binutils: the glibc floor's check, native/Makefile)."""
    cc = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    out = []
    if shutil.which(cc[0]) is None:
        out.append(f"a C compiler ({'CC=' + cc[0] if 'CC' in os.environ else 'cc'} not found)")
    if shutil.which("make") is None:
        out.append("make")
    readelf = os.environ.get("READELF", "readelf")
    if shutil.which(readelf) is None:  # native/floor/glibc_floor.py reads the C library with it
        out.append(f"readelf ({readelf} not found; binutils)")
    return out


def check_tools() -> None:
    """Say first, in one paragraph, what the build lacks (before setuptools' own output, which
    would bury it under a hundred lines)."""
    lack = missing_tools()
    if lack:
        sys.exit(
            "cudatrace: cannot build: missing {}.\n"
            "cudatrace builds its preload library (plain C; no CUDA toolkit needed) with a C "
            "compiler, make and readelf. On Debian or Ubuntu: apt-get install gcc make binutils; "
            "elsewhere install gcc (or clang), make and binutils, or set CC to your "
            "compiler.".format(" and ".join(lack))
        )


class BuildShim(build_py):
    def run(self):
        check_tools()
        super().run()
        out = Path(self.build_lib) / "cudatrace" / "_native"
        out.mkdir(parents=True, exist_ok=True)
        subprocess.check_call(
            [
                "make",
                "-s",
                "-C",
                str(ROOT / "native"),
                "OUT=%s" % out.resolve(),
                "PYTHON=%s" % sys.executable,
            ]
        )
        _copy_tree(ROOT / "native", out / "native")
        _copy_tree(ROOT / "sim", out / "sim")
        demo = out / "demo"
        demo.mkdir(exist_ok=True)
        for rel in DEMO_FILES:
            shutil.copy2(ROOT / rel, demo / Path(rel).name)
        _write_view(out)


def _write_view(out: Path) -> None:
    """The cffi view, parsed once now (cudatrace/native.py: build_view) so that a command does
    not parse the headers each time it starts."""
    sys.path.insert(0, str(ROOT))
    try:
        from cudatrace import native

        native.build_view(out)
    finally:
        sys.path.remove(str(ROOT))


class BinaryDistribution(Distribution):
    """The wheel carries a native library: mark it platform-specific."""

    def has_ext_modules(self):
        return True


if BUILDING.intersection(sys.argv[1:]):
    check_tools()
setup(cmdclass={"build_py": BuildShim}, distclass=BinaryDistribution)
