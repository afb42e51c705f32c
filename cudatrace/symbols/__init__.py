"""Offline symbolization of native return addresses recorded by cudatrace (see docs/symbols.md)."""
from .dwarf import Frame, ModuleRef, Symbolizer, demangle  # noqa: F401
from .dwarf import _Dwarf, _Elf, _FileTable, _Progress, _SymTab  # noqa: F401
