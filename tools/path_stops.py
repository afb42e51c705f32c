"""How far a reader travels through the package to follow one path: the `p` of
`metrics --traces` (analyze's live top_sites: a run's top sites per device, symbolized).

Runs the path once on a run written by tests/support/tracegen.py (the two-process scenario of
the goldens, with a byte-written ELF for symbols) under a profiler, and lists the package's
functions in the order they are first entered. A *stop* is a run of consecutive functions of
one module in that list (a reader opens the module once for them); a *return* is a stop in a
module already left before. One function is read once: calling it again later costs a reader
nothing, so only first entries count. The same list by analyze/'s stages (read, replay, sites,
documents; the old flat modules counted in the stage each went to), and the calls met that go
against the stages' order (a function of an earlier stage calling one of a later stage).

    python3 tools/path_stops.py            # stops, modules, returns, and the modules' order
    python3 tools/path_stops.py --list     # every stop, with the functions read there
    python3 tools/path_stops.py --within analyze/   # analyze/'s modules only
    python3 tools/path_stops.py --cold     # the first call: the symbols read from the ELF too
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import cudatrace  # noqa: E402
from support import tracegen as tg  # noqa: E402

PKG = Path(cudatrace.__file__).resolve().parent
# where the path's function and the symbolizer's maker live (before and after the stages)
LIVE = ("cudatrace.analyze.documents.live", "cudatrace.analyze.live")
SYMBOLIZER = ("cudatrace.analyze.sites.stacks", "cudatrace.analyze.sites")


def _module(names: tuple[str, ...]):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(" or ".join(names))


# analyze/'s stages in order; before they were packages, the module each flat module became
STAGES = ("read", "replay", "sites", "documents")
FLAT = {"trace.py": "read", "unseal.py": "read", "aggregate.py": "read", "runfacts.py": "read"}
FLAT.update({"model.py": "replay", "observed.py": "replay"})
FLAT.update({"sites.py": "sites", "layers.py": "sites", "names.py": "sites"})


def stage_of(mod: str) -> str | None:
    """The stage of a module of analyze/ (a flat module of the old layout: the stage it went
    to, documents for the rest: analysis, ranks, live ...); None outside analyze/."""
    parts = mod.split("/")
    if parts[0] != "analyze" or len(parts) < 2:
        return None
    if parts[1] in STAGES:
        return parts[1]
    return FLAT.get(parts[1], "documents")


def _where(code) -> tuple[str, str] | None:
    """(module path under cudatrace/, qualified name) of a function of the package."""
    try:
        rel = Path(code.co_filename).resolve().relative_to(PKG).as_posix()
    except ValueError:
        return None
    # a function's body only: a module's or a class's runs once, at import
    if not code.co_flags & inspect.CO_OPTIMIZED or code.co_name.startswith("<"):
        return None
    return rel, getattr(code, "co_qualname", code.co_name)


def first_entries(fn) -> tuple[list[tuple[str, str]], set[tuple[tuple[str, str], ...]]]:
    """(module path under cudatrace/, function) of each function of the package, in the order
    of its first call while fn() runs; and every (caller, callee) pair of the package's
    functions met."""
    seen: set[object] = set()
    order: list[tuple[str, str]] = []
    calls: set[tuple[tuple[str, str], ...]] = set()

    def prof(frame, event, _arg):
        if event != "call":
            return
        code = frame.f_code
        here = _where(code)
        if here is None:
            return
        back = frame.f_back
        caller = _where(back.f_code) if back is not None else None
        if caller is not None:
            calls.add((caller, here))
        if code not in seen:
            seen.add(code)
            order.append(here)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return order, calls


def stops(entries: list[tuple[str, str]], within: str = "") -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for mod, name in entries:
        if not mod.startswith(within):
            continue
        if out and out[-1][0] == mod:
            out[-1][1].append(name)
        else:
            out.append((mod, [name]))
    return out


def write_running(d: Path, elf: Path) -> None:
    """A run still going (no exit record): its program's frames in a byte-written ELF, under
    the CUDA libraries' own, three sites live on device 0."""
    d.mkdir(parents=True)
    fr = tg.Frames(elf)
    w = tg.TraceWriter(d / "1000.0.ctrace", pid=1000, exe="/usr/bin/python3", argv=["train"])
    fr.write_modules(w)
    stacks = [
        w.stack(fr.stack("load_weights", "setup", "main")),
        w.stack(fr.stack("alloc_activations", "forward", "train_step", "main")),
        w.stack(fr.stack("grow_cache", "setup", "main")),
    ]
    for i in range(12):
        w.alloc(tg.BASE_TS + (i + 1) * tg.MS, tg.MiB << (i % 3), (i + 1) << 32, stack=stacks[i % 3])
    w.close(clean=False)
    tg.write_run(d, argv=["python3", "train.py"], samples=[], start_ns=tg.BASE_TS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="every stop and its functions")
    ap.add_argument("--within", default="", help="count only modules under this folder")
    ap.add_argument("--cold", action="store_true", help="the first call (symbols read anew)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "run"
        write_running(d, tg.build_fixture_elf(Path(tmp)))
        os.environ["CUDATRACE_CACHE"] = str(Path(tmp) / "cache")
        live = _module(LIVE)
        sym = _module(SYMBOLIZER).make_symbolizer(progress=False)
        if not args.cold:  # the symbol cache written, the libraries loaded: a scrape again
            live.top_sites(d, 5, sym)
        entries, calls = first_entries(lambda: live.top_sites(d, 5, sym))
        run = stops(entries, args.within)
    mods: list[str] = []
    for mod, _ in run:
        if mod not in mods:
            mods.append(mod)
    if args.list:
        for i, (mod, names) in enumerate(run, 1):
            print(f"{i:3d} {mod}: {', '.join(names)}")
    print(f"{len(run)} stops in {len(mods)} modules, {len(run) - len(mods)} of them returns")
    print("modules in order of first stop: " + " -> ".join(mods))
    # the same path by analyze/'s stages: a stop is a run of one stage's functions
    st: list[str] = []
    for mod, _ in entries:
        s_ = stage_of(mod)
        if s_ is not None and (not st or st[-1] != s_):
            st.append(s_)
    print(
        f"analyze/ by stage: {len(st)} stops, {len(st) - len(set(st))} of them returns: "
        + " > ".join(st)
    )
    against = sorted(
        (a, b)
        for a, b in calls
        if stage_of(a[0])
        and stage_of(b[0])
        and STAGES.index(stage_of(b[0])) > STAGES.index(stage_of(a[0]))
    )
    print(f"calls against the stages' order: {len(against)}")
    for a, b in against:
        print(f"  {a[0]}:{a[1]} -> {b[0]}:{b[1]}")


if __name__ == "__main__":
    main()
