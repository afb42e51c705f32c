"""What the launcher reads of the binaries before exec, for the shim's denial line.

The preload library names the code a denial belongs to at the moment it happens
(native/shim/deny.c). It reads the functions the compiler inlined from the module's DWARF at the
denial (native/shim/dwarf.c), which costs time at that moment and cannot read compressed or
separate debug files, and it cannot open the libraries to see which of them a framework
installed with itself. The launcher can, before exec: it writes them to a small text file in
the trace directory (named by CUDATRACE_HINTS; the format is native/shim/frameworks.c's):

    cudatrace-hints 1
    join BASENAME FRAMEWORK        a library a framework links from its own directory
    module BASENAME BUILDID|-      the inline frames of one module follow (even none)
    inline LO HI DEPTH NAME        [LO, HI) of the file runs NAME, inlined DEPTH calls deep

for the executable and the libraries it links that are not the system's, read from their
RUNPATH/RPATH and LD_LIBRARY_PATH. A module whose DWARF is too large to read at start-up gets
no `module` line: the shim then says that code inlined there is not known to it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..symbols import Symbolizer

MAX_MODULES = 64
MAX_DEBUG_BYTES = 256 << 20  # a module's file (or debug file) larger than this: not read
MAX_RANGES = 200_000
TIME_BUDGET = 5.0  # seconds for the whole file; modules past it get no `module` line
SYSTEM_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/cuda")
TRANSPARENT = ("std::", "__gnu_cxx::", "__cxxabiv1::")


def _dynamic(path: str) -> tuple[list[str], list[str]]:
    """(DT_NEEDED, search directories of DT_RUNPATH or DT_RPATH) of an ELF file."""
    try:
        from elftools.elf.dynamic import DynamicSection
        from elftools.elf.elffile import ELFFile

        with open(path, "rb") as f:
            for sec in ELFFile(f).iter_sections():
                if isinstance(sec, DynamicSection):
                    needed, dirs = [], []
                    for t in sec.iter_tags():
                        if t.entry.d_tag == "DT_NEEDED":
                            needed.append(t.needed)  # type: ignore[attr-defined]
                        elif t.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                            p = getattr(t, "runpath" if t.entry.d_tag == "DT_RUNPATH" else "rpath")
                            dirs += p.split(":")
                    origin = os.path.dirname(os.path.realpath(path))
                    dirs = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in dirs]
                    return needed, dirs
    except Exception:
        pass
    return [], []


def linked_modules(exe: str, env: Mapping[str, str]) -> list[str]:
    """The executable and the libraries it links (breadth first) that lie outside the
    system's directories: the program's own code and its frameworks."""
    extra = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    seen, out, todo = set(), [exe], [exe]
    while todo and len(out) < MAX_MODULES:
        needed, dirs = _dynamic(todo.pop(0))
        for name in needed:
            if name in seen:
                continue
            seen.add(name)
            for d in dirs + extra:
                p = os.path.join(d, name)
                if os.path.isfile(p):
                    real = os.path.realpath(p)
                    if not real.startswith(SYSTEM_DIRS) and real not in out:
                        out.append(real)
                        todo.append(real)
                    break
    return out


def _inline_lines(sym: Symbolizer, path: str) -> list[str] | None:
    from ..symbols import ModuleRef

    try:
        if os.path.getsize(path) > MAX_DEBUG_BYTES:
            return None
    except OSError:
        return None
    ranges = sym.inline_ranges(ModuleRef(path, None, 0), MAX_RANGES)
    if ranges is None:
        return []  # no DWARF: nothing was inlined that anyone could name
    return [
        "inline %x %x %d %s" % (lo, hi, depth, name.replace("\n", " "))
        for lo, hi, depth, name in ranges
        if not name.startswith(TRANSPARENT)
    ]


def _build_id(path: str) -> str:
    from ..symbols.elf import Elf

    try:
        e = Elf(path)
        e.close()
        return e.build_id.hex() if e.build_id else "-"
    except Exception:
        return "-"


def write_hints(out_dir: Path, exe: str, env: Mapping[str, str]) -> Path | None:
    """Write the hints file into out_dir for the program exe; its path, or None when nothing
    could be written (the shim then goes without: its line says what it cannot know)."""
    from .. import frameworks, settings, tracedir
    from ..symbols import Symbolizer

    start = time.monotonic()
    mods = linked_modules(os.path.realpath(exe), env)
    lines = ["cudatrace-hints 1"]
    try:
        table = frameworks.table(settings.value("FRAMEWORKS", env))
    except frameworks.FrameworkError:
        table = list(frameworks.shipped())
    for base, fw in sorted(frameworks.joined_modules(mods[1:], table).items()):
        lines.append(f"join {base} {fw}")
    sym = Symbolizer(cache_dir=None)
    for path in mods:
        if time.monotonic() - start > TIME_BUDGET:
            break
        got = _inline_lines(sym, path)
        if got is None:
            continue
        lines.append(f"module {os.path.basename(path)} {_build_id(path)}")
        lines += got
    target = out_dir / tracedir.HINTS
    try:
        from .files import replace_lines

        replace_lines(target, lines).close()
    except (OSError, UnicodeError):
        return None
    return target


class HintsFile:
    """The hints of one run: in the trace directory, or (out None: --no-trace) in a private
    temporary directory removed by stop(), or when the launcher lets go of the object if the
    command never started. path is None when nothing could be written: the shim goes without
    (its line then says what it cannot know)."""

    def __init__(self, out: Path | None, exe: str, env: Mapping[str, str]):
        import shutil
        import tempfile
        import weakref

        where = out if out is not None else Path(tempfile.mkdtemp(prefix="cudatrace-hints-"))
        self._remove = weakref.finalize(self, shutil.rmtree, where, True) if out is None else None
        try:
            self.path = write_hints(where, exe, env)
        except Exception:  # never a reason not to run the program
            self.path = None

    def stop(self) -> None:
        if self._remove is not None:
            self._remove()
