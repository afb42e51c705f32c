"""Offline symbolization of native return addresses recorded by cudatrace.

A trace holds, for every loaded ELF object, its path, load bias and GNU build-id, and for every
call stack the raw return addresses. This package turns those into frames (function, file,
line, inlined-ness) using the ELF symbol tables and DWARF: pyelftools for the ELF container,
small hand-written decoders for the hot paths (symbol tables, .debug_aranges, line programs,
DIE walks), so that a binary with hundreds of MB of DWARF is handled in seconds.
See docs/symbols.md.

    Symbolizer(cache_dir=None, debug_dirs=("/usr/lib/debug",), progress=False, sysroot=None)
    Symbolizer.symbolize(ModuleRef(path, build_id, bias), addresses) -> {address: [Frame, ...]}
    Symbolizer.warnings() -> [str, ...]
    demangle(name) -> str

Nothing here raises on a missing, foreign or corrupt file: such modules get frames with
function=None and a line in warnings(). The package imports nothing else from cudatrace.
"""

from __future__ import annotations

from .cache import CACHE_FORMAT
from .demangle import demangle
from .symbolizer import Frame, ModuleRef, Symbolizer

__all__ = ["CACHE_FORMAT", "Frame", "ModuleRef", "Symbolizer", "demangle"]
