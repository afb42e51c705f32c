"""The KV-pool example (examples/kv-pool) on the simulated driver: its figures, its build, the
Jetson Thor-like device it runs on, and a traced run. Shared by the walkthrough, the sweep, the
HTML and the export tests (import the `kvpool` fixture where a test names it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .cli import checkout_env, cudatrace
from .paths import EXAMPLES

if TYPE_CHECKING:
    from .sim_fixtures import Sim

EXAMPLE = EXAMPLES / "kv-pool"

GiB = 1 << 30
MiB = 1 << 20
LAYERS = 28
PAGE = 2 * 16 * 8 * 128 * 2  # one block of one layer: K+V, 16 tokens, 8 kv heads, head 128, 2 B
WEIGHTS = 1_400_000_000
WORKSPACE = 256 * MiB
THOR = 122 * GiB


def build(sim: Sim, out: Path) -> Path:
    """kvpool built by its Makefile against the simulated libcuda (cc directly without make)."""
    if shutil.which("make"):
        cmd = ["make", "-s", "-C", str(EXAMPLE), f"LIBCUDA_DIR={sim.lib}", f"OUT={out}"]
    else:
        cmd = [
            os.environ.get("CC", "cc"),
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-rdynamic",
            "-o",
            str(out / "kvpool"),
            str(EXAMPLE / "kvpool.c"),
            f"-L{sim.lib}",
            "-ldl",
            "-lcuda",
        ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "kvpool").is_file()
    return out / "kvpool"


@pytest.fixture(scope="module")
def kvpool(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(sim, tmp_path_factory.mktemp("kvpool"))


def thor_env(sim: Sim, base: Path, **extra: object) -> dict[str, str]:
    """A Jetson Thor-like simulated device (122 GiB, integrated), shared by the processes of one
    test, for `python -m cudatrace` of this checkout."""
    env = sim.env(state=sim.new_state(), total_bytes=THOR, integrated=1, **extra)
    return checkout_env(env, cache=base / "symcache")


def trace(
    env: dict[str, str], out: Path, kvpool: Path, *flags: object, opts: Sequence[object] = ()
) -> subprocess.CompletedProcess[str]:
    """`cudatrace run -o OUT [opts] -- kvpool FLAGS`; the result's .out is OUT."""
    r = cudatrace(env, "run", "-o", out, *opts, "--", kvpool, *flags)
    r.out = out  # type: ignore[attr-defined]  # the tests read it beside the result
    return r
