"""The context hold's C harness (tests/ctxhold/ctxhold_test.c): built with the shim's own
ctxhold.c (or a changed copy of it), util.c and the ledger's C, and its cases run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from support.paths import CTXHOLD_C, CTXHOLD_SOURCES, REPO

# every case of the harness but shuffle (its random schedules: `shuffle [SEEDS]`); concurrent
# runs the threads freely, for TSan
CASES = [
    "order",
    "slow",
    "reread",
    "frees",
    "publish",
    "reclaim",
    "hang",
    "unlisted",
    "nonvml",
    "periodic",
    "concurrent",
]
# the flags of the plain build (native/Makefile's warnings, every one an error)
PLAIN = ["-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"]
# under ASan + UBSan, every report fatal; under TSan (as test_sanitizers.py builds its harnesses)
ASAN = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
        "-fno-omit-frame-pointer"]  # fmt: skip
TSAN = ["-O1", "-g", "-fsanitize=thread", "-fno-omit-frame-pointer"]


def _cc(flags: list[str]) -> list[str]:
    cc = os.environ.get("CC", "cc")
    assert shutil.which(cc), f"no C compiler ({cc}): the suite needs one"
    cmd = [cc, "-std=gnu11", *flags, "-D_GNU_SOURCE", "-pthread", '-DCT_SHIM_VERSION="harness"']
    return cmd + ["-I", str(REPO / "native/include"), "-I", str(REPO / "native/shim")]


def objects(out: Path, flags: list[str]) -> list[Path]:
    """The harness's sources but ctxhold.c compiled once into out (a build of several
    ctxhold.c's links them)."""
    objs = []
    for src in CTXHOLD_SOURCES:
        o = out / (src.stem + ".o")
        r = subprocess.run(
            [*_cc(flags), "-c", str(src), "-o", str(o)], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        objs.append(o)
    return objs


def build(
    exe: Path, flags: list[str], ctxhold_c: Path = CTXHOLD_C, objs: list[Path] | None = None
) -> Path:
    """The harness at exe, built with flags from ctxhold_c and the rest of its sources (or
    their objects)."""
    rest = objs if objs is not None else CTXHOLD_SOURCES
    cmd = [*_cc(flags), str(ctxhold_c), *map(str, rest), "-ldl", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def run(
    exe: Path, ledger_dir: Path, case: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One case (or "all", or "shuffle N") in a ledger directory of its own (mode 0700)."""
    d = ledger_dir / case
    d.mkdir(mode=0o700)
    return subprocess.run(
        [str(exe), str(d), case, *args], capture_output=True, text=True, timeout=300, env=env
    )
