"""The aarch64 builds the tests run under qemu-user, built once per session (shared_build):
the preload library (tools/cross-build-shim) and the simulated driver with the test programs
(simbuild.build_all), cross-compiled with aarch64-linux-gnu-gcc."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from . import simbuild
from .paths import REPO
from .shared_build import shared_build

CC = "aarch64-linux-gnu-gcc"


def build_sim(
    outdir: Path, cc: str = CC, programs: Iterable[str] | None = None
) -> dict[str, Path | None]:
    """simbuild.build_all with the cross compiler ($CC for the build, restored after)."""
    old = os.environ.get("CC")
    os.environ["CC"] = cc
    try:
        return simbuild.build_all(outdir, programs)
    finally:
        if old is None:
            del os.environ["CC"]
        else:
            os.environ["CC"] = old


def _build(work: Path) -> dict[str, object]:
    r = subprocess.run(
        [str(REPO / "tools" / "cross-build-shim"), CC, str(work / "shim")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    paths = build_sim(work / "sim")
    return {
        "shim": r.stdout.strip(),
        "paths": {k: str(v) if v else None for k, v in paths.items()},
    }


def aarch64(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path | None]]:
    """(the aarch64 libcudatrace.so, the aarch64 simulator's paths as simbuild.build_all)."""
    built = shared_build(tmp_path_factory, "aarch64", _build)
    return Path(built["shim"]), {k: Path(v) if v else None for k, v in built["paths"].items()}
