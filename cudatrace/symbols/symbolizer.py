"""The public entry: Symbolizer turns (module, runtime addresses) into frames, per module
finding its files, loading symbol tables and DWARF on demand, and caching results."""

from __future__ import annotations

import functools
import lzma
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cache, lines
from .debugfiles import DebugFiles
from .dwarf import Dwarf
from .elf import Elf
from .inlines import inline_info, inline_ranges
from .progress import Progress, ProgressLike
from .symtab import SymTab


@dataclass(frozen=True)
class Frame:
    module: str  # path of the module as recorded
    function: str | None  # demangled name, None if unknown
    file: str | None
    line: int | None
    address: int  # the runtime address asked for
    offset: int  # address relative to the module's file vaddr space (address - bias)
    inlined: bool = False  # True for frames that DWARF says were inlined into the next one


@dataclass(frozen=True)
class ModuleRef:
    path: str
    build_id: bytes | None
    bias: int  # load bias: runtime address = file vaddr + bias


class _Module:
    def __init__(self, label: str):
        self.label = label
        self.main: Elf | None = None  # the module file, when usable (found and build-id ok)
        self.debug: Elf | None = None  # file holding DWARF (may be main)
        self.sym_sources: list[tuple[Elf, str]] = []
        self.sym_kind: str | None = None
        self.failed = False
        self.cache_path: Path | None = None
        self.sig: list[Any] | None = None
        self.results: dict[int, list[cache.CachedFrame]] = {}
        self.dirty = False
        self.symtab: SymTab | None = None
        self.dwarf: Dwarf | None = None
        self.extra_files: list[Elf] = []  # other opened files (alt files, minidebuginfo)

    def unload(self) -> None:
        """Drop the heavy data and the file descriptors (reopened on demand)."""
        self.symtab = None
        self.dwarf = None
        for e in [self.main, self.debug] + self.extra_files:
            if e is not None:
                e.close()


def _symbol_sources(main: Elf | None, debug: Elf | None, mod: _Module) -> list[tuple[Elf, str]]:
    """.symtab of the debug file or of the module, else MiniDebugInfo + .dynsym."""
    for elf in (debug, main):
        if elf is not None and elf.has(".symtab"):
            mod.sym_kind = "symtab"
            return [(elf, ".symtab")]
    srcs = []
    if main is not None:
        if main.has(".gnu_debugdata"):
            try:
                mini = Elf(
                    main.path + "[.gnu_debugdata]",
                    data=lzma.decompress(main.section_data(".gnu_debugdata") or b""),
                )
                mod.extra_files.append(mini)
                if mini.has(".symtab"):
                    srcs.append((mini, ".symtab"))
            except Exception:
                pass
        if main.has(".dynsym"):
            srcs.append((main, ".dynsym"))
        mod.sym_kind = "+".join(s[1] for s in srcs) or None
    return srcs


ProgressFactory = Callable[[str, int], ProgressLike]


class Symbolizer:
    """Turns (module, runtime addresses) into frames. See docs/symbols.md.

    progress: False, True (a bar on stderr once a module's work runs for more than a second),
    or a factory (label, total) -> object with a `total` attribute and step()/close()."""

    _MAX_LOADED = 3  # modules whose symbol tables / DWARF stay in memory

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        debug_dirs: str | Path | Iterable[str | Path] = ("/usr/lib/debug",),
        progress: bool | ProgressFactory = False,
        sysroot: str | None = None,
    ):
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if isinstance(debug_dirs, (str, Path)):
            debug_dirs = (debug_dirs,)
        self.sysroot = str(sysroot) if sysroot else None
        self._warnings: list[str] = []
        self._warned: set[str] = set()
        self._files = DebugFiles(debug_dirs or (), self.sysroot, self._warn)
        self.debug_dirs = self._files.debug_dirs
        self._progress: ProgressFactory
        if callable(progress):
            self._progress = progress
        else:
            self._progress = functools.partial(Progress, enabled=bool(progress))
        self._modules: dict[tuple[Any, ...], _Module] = {}
        self._loaded: list[_Module] = []

    def warnings(self) -> list[str]:
        return list(self._warnings)

    def symbolize(self, module: ModuleRef, addresses: Iterable[int]) -> dict[int, list[Frame]]:
        """Runtime addresses -> frames, innermost (inlined) first, the outermost real function
        last. Callers pass return addresses minus 1 already adjusted if they want call sites;
        this takes the address as given."""
        addrs = sorted({int(a) for a in addresses})
        out: dict[int, list[Frame]] = {}
        if not addrs:
            return out
        path = module.path
        bias = int(module.bias or 0)
        try:
            mod = self._module(module)
        except Exception as e:  # never raise on bad input files
            self._warn(f"{path}: cannot read ({type(e).__name__}: {e})")
            mod = None
        if mod is None or mod.failed:
            for a in addrs:
                out[a] = [Frame(path, None, None, None, a, a - bias)]
            return out
        offsets = sorted({a - bias for a in addrs})
        todo = [o for o in offsets if o not in mod.results]
        if todo:
            try:
                self._compute(mod, module, todo)
            except Exception as e:
                self._warn(f"{path}: symbolization failed ({type(e).__name__}: {e})")
                for o in todo:
                    mod.results.setdefault(o, [(None, None, None, False)])
            self._save_cache(mod)
        for a in addrs:
            o = a - bias
            out[a] = [Frame(path, fn, fl, ln, a, o, inl) for fn, fl, ln, inl in mod.results[o]]
        return out

    def inline_ranges(
        self, module: ModuleRef, limit: int = 200_000
    ) -> list[tuple[int, int, int, str]] | None:
        """Every inlined call in the module's code as (low, high, depth, name), offsets of the
        file (inlines.inline_ranges); None when the module has no DWARF or cannot be read."""
        try:
            mod = self._module(module)
            if mod.failed or mod.debug is None:
                return None
            self._ensure_loaded(mod)
            dw = self._dwarf(mod, module.path)
            return None if dw is None else inline_ranges(dw, limit)
        except Exception as e:  # never raise on bad input files
            self._warn(f"{module.path}: cannot read inline frames ({type(e).__name__}: {e})")
            return None

    def _warn(self, msg: str) -> None:
        if msg not in self._warned:
            self._warned.add(msg)
            self._warnings.append(msg)

    def _module(self, ref: ModuleRef) -> _Module:
        build_id = ref.build_id
        if isinstance(build_id, str):
            build_id = bytes.fromhex(build_id) if build_id else None
        elif build_id is not None:
            build_id = bytes(build_id) or None
        key = (ref.path, build_id)
        mod = self._modules.get(key)
        if mod is not None:
            return mod
        mod = _Module(os.path.basename(ref.path) or ref.path)
        self._modules[key] = mod
        try:
            self._resolve(mod, ref, build_id)
        except Exception:
            mod.failed = True
            mod.unload()
            raise
        return mod

    def _resolve(self, mod: _Module, ref: ModuleRef, build_id: bytes | None) -> None:
        """Find the module's file and debug file, check build-ids, pick symbol tables, load the
        disk cache."""
        path = ref.path
        main = mod.main = self._files.module_file(path, build_id)
        bid = build_id or (main.build_id if main is not None else None)
        debug: Elf | None
        if main is not None and main.has_dwarf():
            debug = main
        else:
            debug = self._files.debug_file(path, main, bid)
            if debug is not None and main is None:
                self._warn(f"{path}: using separate debug file {debug.path} (matching build-id)")
        mod.debug = debug
        if main is None and debug is None:
            mod.failed = True
            return
        if debug is None:
            self._warn(
                f"{path}: no debug info (no DWARF in the file and no separate debug file "
                "found); function names only"
            )
        mod.sym_sources = _symbol_sources(main, debug, mod)
        if not mod.sym_sources:
            self._warn(f"{path}: no symbol table")
        kind = None if debug is None else ("self" if debug is main else "sep")
        mod.sig = [cache.CACHE_FORMAT, mod.sym_kind, kind]
        if self.cache_dir is not None:
            mod.cache_path = cache.cache_path(self.cache_dir, bid, main.path if main else path)
            mod.results.update(cache.load(mod.cache_path, mod.sig))
        mod.unload()  # file descriptors are reopened when something must be computed

    def _ensure_loaded(self, mod: _Module) -> None:
        if mod in self._loaded:
            self._loaded.remove(mod)
            self._loaded.append(mod)
            return
        self._loaded.append(mod)
        while len(self._loaded) > self._MAX_LOADED:
            self._loaded.pop(0).unload()

    def _dwarf(self, mod: _Module, path: str) -> Dwarf | None:
        if mod.debug is not None and mod.dwarf is None:
            try:
                alt_elf = self._files.alt_file(mod.debug)
                alt = None
                if alt_elf is not None:
                    mod.extra_files.append(alt_elf)
                    alt = Dwarf(alt_elf)
                mod.dwarf = Dwarf(mod.debug, alt)
            except Exception as e:
                self._warn(f"{path}: cannot read DWARF from {mod.debug.path} ({e})")
        return mod.dwarf

    def _compute(self, mod: _Module, ref: ModuleRef, offsets: list[int]) -> None:
        self._ensure_loaded(mod)
        path = ref.path
        prog = self._progress("symbolizing " + mod.label, 1)
        try:
            if mod.symtab is None:
                try:
                    mod.symtab = SymTab.build(mod.sym_sources)
                except Exception as e:
                    self._warn(f"{path}: cannot read symbol table ({e})")
                    mod.symtab = SymTab()
            symtab = mod.symtab
            names = {o: symtab.lookup(o) for o in offsets}
            prog.step()
            found_lines: dict[int, tuple[Any, ...]] = {}
            inl: dict[int, tuple[Any, ...]] = {}
            dw = self._dwarf(mod, path)
            if dw is not None:
                self._read_dwarf(dw, path, offsets, found_lines, inl, prog)
            for o in offsets:
                mod.results[o] = _frames(
                    dw, names.get(o), found_lines.get(o, (None, None)), inl.get(o)
                )
                mod.dirty = True
        finally:
            prog.close()

    def _read_dwarf(
        self,
        dw: Dwarf,
        path: str,
        offsets: list[int],
        found_lines: dict[Any, Any],
        inl: dict[Any, Any],
        prog: ProgressLike,
    ) -> None:
        """Line-table locations and inline chains of the offsets, CU by CU."""
        try:
            groups = dw.group_by_cu(offsets)
        except Exception as e:
            self._warn(f"{path}: cannot index DWARF ({type(e).__name__}: {e})")
            groups = {}
        prog.total += len(groups)
        for cu_off in sorted(groups):
            ts = groups[cu_off]
            try:
                cu = dw.cu_at(cu_off)
            except Exception as e:
                self._warn(f"{path}: bad compilation unit at 0x{cu_off:x} ({e})")
                prog.step()
                continue
            try:
                res = lines.lines_for(dw, cu, ts)
                for t, (fi, ln) in res.items():
                    found_lines[t] = (cu.files.path(fi), ln or None)
            except Exception as e:
                self._warn(
                    f"{path}: cannot decode line table of CU 0x{cu_off:x} ({type(e).__name__}: {e})"
                )
            try:
                files = cu.files
                for t, (die, chain) in inline_info(dw, cu, ts).items():
                    inl[t] = (die, chain, files)
            except Exception as e:
                self._warn(f"{path}: cannot read DIEs of CU 0x{cu_off:x} ({type(e).__name__}: {e})")
            prog.step()

    def _save_cache(self, mod: _Module) -> None:
        if mod.cache_path is None or mod.sig is None or not mod.dirty:
            return
        try:
            cache.save(mod.cache_path, mod.sig, mod.results)
            mod.dirty = False
        except Exception as e:
            self._warn(f"cannot write symbol cache {mod.cache_path} ({e})")


def _frames(
    dw: Dwarf | None, func: str | None, loc: tuple[Any, ...], entry: tuple[Any, ...] | None
) -> list[Any]:
    """Cached frames of one offset: the inlined calls innermost first, each at its line-table
    location or at its callee's call site, the real function last."""
    fname, ln = loc
    frames = []
    if entry is not None and dw is not None:
        die, chain, files = entry
        if func is None and die is not None:
            func = dw.die_name(die)
        if chain:
            for i in range(len(chain) - 1, -1, -1):
                origin, oform, cfile, cline = chain[i]
                iname = dw.die_name(origin, oform) if origin is not None else None
                frames.append((iname, loc[0], loc[1], True))
                cf = files.path(cfile) if files is not None else None
                loc = (cf, cline or None)
            frames.append((func, loc[0], loc[1], False))
    if not frames:
        frames = [(func, fname, ln, False)]
    return frames
