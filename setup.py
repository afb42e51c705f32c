"""Builds the preload library with the system C compiler (shim/Makefile) into the package.

No CUDA toolkit or headers are needed: the shim declares the few driver types it uses.
The shim sources are shipped too (cudatrace/_native/src) so the layout header travels with
the package for the cffi reader.
"""
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.dist import Distribution
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DEMO_FILES = ["examples/kv-pool/kvpool.c", "examples/kv-pool/Makefile", "tests/sim/libcuda_sim.c",
              "tests/sim/libnvml_sim.c", "tests/sim/sim_state.h"]


class BuildShim(build_py):
    def run(self):
        super().run()
        out = Path(self.build_lib) / "cudatrace" / "_native"
        out.mkdir(parents=True, exist_ok=True)
        subprocess.check_call(["make", "-s", "-C", str(ROOT / "shim"), "OUT=%s" % out.resolve()])
        src = out / "src"
        src.mkdir(exist_ok=True)
        for p in (ROOT / "shim").iterdir():
            if p.suffix in (".h", ".c", ".def") or p.name == "Makefile":
                shutil.copy2(p, src / p.name)
        # `cudatrace demo` on a machine without a GPU: the example and the simulated driver
        demo = out / "demo"
        demo.mkdir(exist_ok=True)
        for rel in DEMO_FILES:
            shutil.copy2(ROOT / rel, demo / Path(rel).name)


class BinaryDistribution(Distribution):
    """The wheel carries a native library: mark it platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildShim}, distclass=BinaryDistribution)
