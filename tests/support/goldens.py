"""Golden outputs: runs written by tracegen that read the same on every machine, the CLI run on
them, and the comparison with the files of tests/golden/.

Machine independence: the program's functions lie in an ELF written byte by byte (synthelf), the
CUDA libraries' frames in modules that exist nowhere (so no local libcuda is read), times, pids
and hosts are fixed by tracegen, and the temporary directory is written `<DIR>` in the goldens.
The commands run as `python -m cudatrace ...` in a fresh interpreter, so the goldens pin what a
user sees whatever the commands' code looks like inside.

Update after an intended change of an output (then read the diff of tests/golden/ before
committing it):

    pytest tests/unit/test_golden.py --update-goldens
    CUDATRACE_UPDATE_GOLDENS=1 pytest tests/unit/test_golden.py
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from cudatrace import __version__

from . import tracegen as tg
from .cli import checkout_env, cudatrace
from .paths import REPO, TESTS
from .synthelf import write_elf

GOLDEN = TESTS / "golden"
UPDATE_ENV = "CUDATRACE_UPDATE_GOLDENS"
PLACEHOLDER = "<DIR>"
VERSION = "<VERSION>"  # cudatrace.__version__, written once (cudatrace/__init__.py)

MS, MiB = tg.MS, tg.MiB
FUNCTIONS = [
    "main",
    "setup",
    "train_step",
    "forward",
    "load_weights",
    "alloc_activations",
    "make_workspace",
    "grow_cache",
    "query_memory",
    "allocate_kv",
]


class GoldenFrames(tg.Frames):
    """The stacks of tracegen.Frames with the CUDA libraries under base/, where no file is."""

    def __init__(self, elf: Path, symbols: dict[str, int], base: Path, load_base: int = 0):
        super().__init__(elf, symbols, base=load_base)
        cuda = base / "no-cuda-here"
        self.CUDA = str(cuda / "libcuda.so.1")
        self.CUDART = str(cuda / "libcudart.so.12")
        self.SHIM = str(cuda / "libcudatrace.so")


def _program(base: Path) -> tuple[Path, dict[str, int]]:
    elf = base / "bin" / "trainer"
    elf.parent.mkdir(parents=True, exist_ok=True)
    return elf, write_elf(elf, FUNCTIONS)


def _plan_run(
    d: Path,
    fr: tg.Frames,
    plan: list[tuple[str, int, int, bool]],
    argv: Sequence[str] = ("trainer",),
) -> None:
    """plan: [(function, size, count, freed)]: all allocated 1 ms apart from 0.1 s, the freed
    ones freed after the last allocation (so the peak holds everything)."""
    d.mkdir(parents=True, exist_ok=True)
    w = tg.TraceWriter(d / "1000.0.ctrace", pid=1000, exe=fr.elf, argv=list(argv))
    fr.write_modules(w)
    t = tg.BASE_TS + 100 * MS
    addr = 0x7E0000000000
    frees = []
    for fn, size, count, freed in plan:
        leaf = w.stack(fr.stack(fn, "setup" if fn == "load_weights" else "train_step", "main"))
        for _ in range(count):
            t += MS
            w.alloc(t, size, addr, stack=leaf)
            if freed:
                frees.append(addr)
            addr += 1 << 32
    for a in frees:
        t += MS
        w.free(t, a)
    w.close(end_ts=t + 10 * MS)
    tg.write_run(d, argv=list(argv), samples=[])


def write_runs(base: Path) -> dict[str, Path]:
    """Every input of the goldens under base: `run` (tracegen's two-process scenario), `a` and
    `b` (one program before and after a change, loaded at other addresses), `sweep` (a recorded
    sweep of three values of --num-blocks)."""
    base = Path(base)
    elf, syms = _program(base)
    out = {}
    out["run"] = base / "run"
    tg.write_scenario(out["run"], frames=GoldenFrames(elf, syms, base))
    out["a"], out["b"] = base / "a", base / "b"
    _plan_run(
        out["a"],
        GoldenFrames(elf, syms, base),
        [
            ("alloc_activations", 100 * MiB, 4, True),
            ("load_weights", 500 * MiB, 2, False),
            ("make_workspace", 300 * MiB, 1, True),
            ("query_memory", 10 * MiB, 1, False),
        ],
    )
    _plan_run(
        out["b"],
        GoldenFrames(elf, syms, base, load_base=0x100000),
        [
            ("alloc_activations", 100 * MiB, 6, True),
            ("load_weights", 500 * MiB, 1, False),
            ("grow_cache", 64 * MiB, 2, False),
            ("query_memory", 10 * MiB, 1, False),
        ],
    )
    out["sweep"] = _write_sweep(base / "sweep", GoldenFrames(elf, syms, base))
    return out


def _write_sweep(d: Path, fr: tg.Frames) -> Path:
    """A sweep directory as `cudatrace sweep -o d --values 64,128,256 -- trainer --num-blocks {}`
    leaves it: a run directory per value and sweep.json (the fields --from reads)."""
    values = [64, 128, 256]
    runs = []
    for v in values:
        rd = d / f"num_blocks={v}"
        argv = ["trainer", "--num-blocks", str(v)]
        _plan_run(
            rd,
            fr,
            [
                ("load_weights", 256 * MiB, 1, False),
                ("allocate_kv", 2 * MiB * v, 4, False),  # 4 layers, 2 MiB a block
                ("make_workspace", 64 * MiB, 1, True),
            ],
            argv=argv,
        )
        runs.append(
            {
                "value": v,
                "text": str(v),
                "command": argv,
                "directory": str(rd),
                "output": str(rd / "output.log"),
                "ended": {"how": "exited", "text": "exited 0", "status": 0},
                "included": True,
                "seconds": 1.0,
                "peak_bytes": 1,  # re-measured from the traces by --from
            }
        )
        (rd / "output.log").write_text("")
    doc = {
        "schema": "cudatrace.sweep/1",
        "cudatrace_version": __version__,
        "command": ["trainer", "--num-blocks", "{}"],
        "directory": str(d),
        "knobs": [
            {
                "name": "num_blocks",
                "placeholder": "{}",
                "flag": "--num-blocks",
                "unit": None,
                "noun": "block",
                "values": [str(v) for v in values],
                "numbers": values,
            }
        ],
        "values": values,
        "runs": runs,
        "stop": {"after": None, "url": None, "settle": 2.0, "grace": 10.0},
    }
    (d / "sweep.json").write_text(json.dumps(doc, indent=2) + "\n")
    return d


def cli(base: Path, *args: object) -> subprocess.CompletedProcess[str]:
    """`python -m cudatrace ARGS` from a fresh interpreter, with a settled environment."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("CUDATRACE_", "LC_", "COLUMNS"))
    }
    env = checkout_env(env)
    env.update(
        CUDATRACE_CACHE=str(base / "symcache"),
        COLUMNS="100",
        TZ="UTC",
        LANG="C.UTF-8",
        NO_COLOR="1",
    )
    return cudatrace(env, *args, timeout=120, cwd=base)


def normalize(text: str, base: Path) -> str:
    """The output with the temporary directory written <DIR> (its real path and the resolved
    one) and the package's version <VERSION> (where a version is printed: after "shim " and as
    a JSON string)."""
    for p in sorted({str(base.resolve()), str(base)}, key=len, reverse=True):
        text = text.replace(p, PLACEHOLDER)
    v = re.escape(__version__)
    return re.sub(rf'(?<=shim ){v}\b|(?<="){v}(?=")', VERSION, text)


def updating(config: pytest.Config) -> bool:
    return bool(config.getoption("--update-goldens", default=False)) or os.environ.get(
        UPDATE_ENV, ""
    ) not in ("", "0")


def compare(name: str, got: str, update: bool, test: str = "tests/unit/test_golden.py") -> None:
    """Assert got equals tests/golden/NAME (NAME may be in a folder of it); with update, write
    it there instead. test: the file whose run with --update-goldens writes it."""
    path = GOLDEN / name
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        return
    assert path.is_file(), (
        f"no golden file {path.relative_to(REPO)}: create it with "
        f"`pytest {test} --update-goldens` (or {UPDATE_ENV}=1) and review it"
    )
    want = path.read_text()
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(True),
                got.splitlines(True),
                f"tests/golden/{name} (golden)",
                f"{name} (now)",
            )
        )
        raise AssertionError(
            f"the output differs from tests/golden/{name}:\n{diff}\n"
            f"If the change is intended: pytest {test} --update-goldens "
            f"(or {UPDATE_ENV}=1), then review and commit the golden files."
        )
