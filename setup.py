"""Builds the native libraries with the system C compiler (native/Makefile) into the package.

No CUDA toolkit or headers are needed: the shim declares the few driver types it uses.
The wheel also carries, under cudatrace/_native/:
    native/   the C sources (include/ is what the cffi reader parses; the rest rebuilds the libraries)
    sim/      the simulated driver's sources (cudatrace.simdriver builds it for `cudatrace demo`)
    demo/     the demo's example program (examples/kv-pool)
    ffi_view_<hash>.py  the cffi view of native/include, parsed at build (native.py: build_view)
Nothing of tests/ is shipped.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
SOURCE_SUFFIXES = (".h", ".c", ".def")
DEMO_FILES = ["examples/kv-pool/kvpool.c", "examples/kv-pool/Makefile"]


def _copy_tree(src: Path, dst: Path) -> None:
    for p in sorted(src.rglob("*")):
        if p.is_file() and (p.suffix in SOURCE_SUFFIXES or p.name == "Makefile"):
            target = dst / p.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)


class BuildShim(build_py):
    def run(self):
        super().run()
        out = Path(self.build_lib) / "cudatrace" / "_native"
        out.mkdir(parents=True, exist_ok=True)
        subprocess.check_call(["make", "-s", "-C", str(ROOT / "native"), "OUT=%s" % out.resolve()])
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


setup(cmdclass={"build_py": BuildShim}, distclass=BinaryDistribution)
