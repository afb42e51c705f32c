"""Offline symbolization of native return addresses recorded by cudatrace.

A trace holds, for every loaded ELF object, its path, load bias and GNU build-id, and for every
call stack the raw return addresses. This module turns those into frames
(function, file, line, inlined-ness) using the ELF symbol tables and DWARF, with pyelftools for
the ELF container and the DWARF line-program headers, and small hand-written decoders for the
hot paths (symbol tables, .debug_aranges, line-program opcodes, DIE walks), so that a binary with
hundreds of MB of DWARF is handled in seconds. See docs/symbols.md.

Public API::

    Symbolizer(cache_dir=None, debug_dirs=("/usr/lib/debug",), progress=False, sysroot=None)
    Symbolizer.symbolize(ModuleRef(path, build_id, bias), addresses) -> {address: [Frame, ...]}
    Symbolizer.warnings() -> [str, ...]
    demangle(name) -> str

Nothing here raises on a missing, foreign or corrupt file: such modules get frames with
``function=None`` and a line in ``warnings()``.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import io
import json
import lzma
import os
import re
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from elftools.elf.elffile import ELFFile

__all__ = ["Frame", "ModuleRef", "Symbolizer", "demangle"]

# Bumped whenever the meaning of cached entries changes.
CACHE_FORMAT = 1


@dataclass(frozen=True)
class Frame:
    module: str  # path of the module as recorded
    function: Optional[str]  # demangled name, None if unknown
    file: Optional[str]
    line: Optional[int]
    address: int  # the runtime address asked for
    offset: int  # address relative to the module's file vaddr space (address - bias)
    inlined: bool = False  # True for frames that DWARF says were inlined into the next one


@dataclass(frozen=True)
class ModuleRef:
    path: str
    build_id: Optional[bytes]
    bias: int  # load bias: runtime address = file vaddr + bias


# ---------------------------------------------------------------------------------------------
# C++ demangling through libstdc++'s __cxa_demangle (cffi, ABI mode)
# ---------------------------------------------------------------------------------------------

_demangler = None  # None: not tried yet; False: unavailable; else (ffi, cxa_demangle, free)


def _load_demangler():
    global _demangler
    if _demangler is None:
        try:
            import cffi

            ffi = cffi.FFI()
            ffi.cdef(
                "char *__cxa_demangle(const char *mangled_name, char *output_buffer,"
                " size_t *length, int *status);\n"
                "void free(void *ptr);"
            )
            cxx = ffi.dlopen("libstdc++.so.6")
            try:
                libc = ffi.dlopen("libc.so.6")
            except OSError:
                libc = ffi.dlopen(None)
            _demangler = (ffi, cxx.__cxa_demangle, libc.free)
        except Exception:  # no cffi, no libstdc++: names stay mangled
            _demangler = False
    return _demangler


@functools.lru_cache(maxsize=1 << 16)
def demangle(name: str) -> str:
    """Demangle a C++ (Itanium ABI) symbol name; return it unchanged when it is not one or when
    demangling is unavailable or fails."""
    if not name or not name.startswith("_Z"):
        return name
    d = _load_demangler()
    if not d:
        return name
    ffi, cxa_demangle, free = d
    try:
        status = ffi.new("int *")
        res = cxa_demangle(name.encode("utf-8", "surrogateescape"), ffi.NULL, ffi.NULL, status)
    except Exception:
        return name
    if res == ffi.NULL:
        return name
    try:
        if status[0] != 0:
            return name
        return ffi.string(res).decode("utf-8", "replace")
    finally:
        free(res)


# ---------------------------------------------------------------------------------------------
# DWARF constants (only those used here)
# ---------------------------------------------------------------------------------------------

TAG_COMPILE_UNIT = 0x11
TAG_PARTIAL_UNIT = 0x3C
TAG_SKELETON_UNIT = 0x4A
TAG_SUBPROGRAM = 0x2E
TAG_INLINED_SUBROUTINE = 0x1D
TAG_LEXICAL_BLOCK = 0x0B
TAG_TRY_BLOCK = 0x32
TAG_CATCH_BLOCK = 0x25
TAG_NAMESPACE = 0x39
TAG_MODULE = 0x1E
_SCOPE_TAGS = frozenset((TAG_INLINED_SUBROUTINE, TAG_LEXICAL_BLOCK, TAG_TRY_BLOCK, TAG_CATCH_BLOCK))
_DESCEND_TAGS = frozenset((TAG_NAMESPACE, TAG_MODULE))

AT_SIBLING = 0x01
AT_NAME = 0x03
AT_STMT_LIST = 0x10
AT_LOW_PC = 0x11
AT_HIGH_PC = 0x12
AT_COMP_DIR = 0x1B
AT_ABSTRACT_ORIGIN = 0x31
AT_SPECIFICATION = 0x47
AT_RANGES = 0x55
AT_CALL_FILE = 0x58
AT_CALL_LINE = 0x59
AT_LINKAGE_NAME = 0x6E
AT_STR_OFFSETS_BASE = 0x72
AT_ADDR_BASE = 0x73
AT_RNGLISTS_BASE = 0x74
AT_MIPS_LINKAGE_NAME = 0x2007
AT_GNU_ADDR_BASE = 0x2133
AT_GNU_RANGES_BASE = 0x2132

FORM_ADDR = 0x01
FORM_BLOCK2 = 0x03
FORM_BLOCK4 = 0x04
FORM_DATA2 = 0x05
FORM_DATA4 = 0x06
FORM_DATA8 = 0x07
FORM_STRING = 0x08
FORM_BLOCK = 0x09
FORM_BLOCK1 = 0x0A
FORM_DATA1 = 0x0B
FORM_FLAG = 0x0C
FORM_SDATA = 0x0D
FORM_STRP = 0x0E
FORM_UDATA = 0x0F
FORM_REF_ADDR = 0x10
FORM_REF1 = 0x11
FORM_REF2 = 0x12
FORM_REF4 = 0x13
FORM_REF8 = 0x14
FORM_REF_UDATA = 0x15
FORM_INDIRECT = 0x16
FORM_SEC_OFFSET = 0x17
FORM_EXPRLOC = 0x18
FORM_FLAG_PRESENT = 0x19
FORM_STRX = 0x1A
FORM_ADDRX = 0x1B
FORM_REF_SUP4 = 0x1C
FORM_STRP_SUP = 0x1D
FORM_DATA16 = 0x1E
FORM_LINE_STRP = 0x1F
FORM_REF_SIG8 = 0x20
FORM_IMPLICIT_CONST = 0x21
FORM_LOCLISTX = 0x22
FORM_RNGLISTX = 0x23
FORM_REF_SUP8 = 0x24
FORM_STRX1 = 0x25
FORM_STRX2 = 0x26
FORM_STRX3 = 0x27
FORM_STRX4 = 0x28
FORM_ADDRX1 = 0x29
FORM_ADDRX2 = 0x2A
FORM_ADDRX3 = 0x2B
FORM_ADDRX4 = 0x2C
FORM_GNU_ADDR_INDEX = 0x1F01
FORM_GNU_STR_INDEX = 0x1F02
FORM_GNU_REF_ALT = 0x1F20
FORM_GNU_STRP_ALT = 0x1F21

_REL_REF_FORMS = frozenset((FORM_REF1, FORM_REF2, FORM_REF4, FORM_REF8, FORM_REF_UDATA))
_ADDRX_FORMS = frozenset((FORM_ADDRX, FORM_ADDRX1, FORM_ADDRX2, FORM_ADDRX3, FORM_ADDRX4, FORM_GNU_ADDR_INDEX))
_STRX_FORMS = frozenset((FORM_STRX, FORM_STRX1, FORM_STRX2, FORM_STRX3, FORM_STRX4, FORM_GNU_STR_INDEX))
_CONST_FORMS = frozenset((FORM_DATA1, FORM_DATA2, FORM_DATA4, FORM_DATA8, FORM_UDATA, FORM_SDATA,
                          FORM_IMPLICIT_CONST))

_INF = float("inf")


class _DwarfError(Exception):
    pass


def _uleb(d, p):
    b = d[p]
    p += 1
    if b < 0x80:
        return b, p
    v = b & 0x7F
    s = 7
    while True:
        b = d[p]
        p += 1
        v |= (b & 0x7F) << s
        if b < 0x80:
            return v, p
        s += 7


def _sleb(d, p):
    v = 0
    s = 0
    while True:
        b = d[p]
        p += 1
        v |= (b & 0x7F) << s
        s += 7
        if b < 0x80:
            if b & 0x40:
                v -= 1 << s
            return v, p


def _cstr(d, p):
    e = d.index(0, p)
    return bytes(d[p:e]).decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# Progress bar (stderr, only when the work runs for more than a second)
# ---------------------------------------------------------------------------------------------


class _Progress:
    delay = 1.0

    def __init__(self, enabled: bool, label: str, total: int):
        self.enabled = enabled and total > 0
        self.label = label
        self.total = total
        self.done = 0
        self.t0 = time.monotonic()
        self.last = 0.0
        self.shown = False

    def step(self, n: int = 1):
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.t0 < self.delay or (now - self.last < 0.1 and self.done < self.total):
            return
        self.last = now
        self._draw()

    def _draw(self):
        width = 30
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        label = self.label if len(self.label) <= 40 else "..." + self.label[-37:]
        try:
            sys.stderr.write("\r%s [%s] %3d%% %d/%d" % (label, bar, frac * 100, self.done, self.total))
            sys.stderr.flush()
        except Exception:
            self.enabled = False
            return
        self.shown = True

    def close(self):
        if self.shown:
            self.done = self.total
            self._draw()
            try:
                sys.stderr.write("\n")
                sys.stderr.flush()
            except Exception:
                pass


# ---------------------------------------------------------------------------------------------
# ELF files
# ---------------------------------------------------------------------------------------------

SHF_EXECINSTR = 0x4
SHF_COMPRESSED = 0x800


class _Elf:
    """One ELF file opened with pyelftools: build-id, debuglink, section bytes. close() releases
    the file descriptor; the file is reopened on the next access."""

    def __init__(self, path: str, data: Optional[bytes] = None):
        self.path = path
        self._data = data
        self._f = None
        self._elf = None
        self._open()
        try:
            self.little = self._elf.little_endian
            self.endian = "<" if self.little else ">"
            self.elfclass = self._elf.elfclass
            self.machine = self._elf["e_machine"]
            self.build_id = self._read_build_id()
            self.debuglink = self._read_debuglink()
        except Exception:
            self.close()
            raise

    def _open(self):
        f = io.BytesIO(self._data) if self._data is not None else open(self.path, "rb")
        try:
            elf = ELFFile(f)
            sections = {}
            exec_sections = set()
            zero_is_code = False
            for i, sec in enumerate(elf.iter_sections()):
                sections.setdefault(sec.name, sec)
                if sec["sh_flags"] & SHF_EXECINSTR:
                    exec_sections.add(i)
                    if sec["sh_addr"] == 0 and sec["sh_size"] > 0:
                        zero_is_code = True
        except Exception:
            f.close()
            raise
        self._f, self._elf = f, elf
        self._sections, self.exec_sections, self.zero_is_code = sections, exec_sections, zero_is_code

    @property
    def elf(self) -> ELFFile:
        if self._elf is None:
            self._open()
        return self._elf

    @property
    def sections(self):
        if self._elf is None:
            self._open()
        return self._sections

    def close(self):
        f, self._f, self._elf, self._sections = self._f, None, None, None
        if f is not None:
            try:
                f.close()
            except Exception:
                pass

    def has(self, name: str) -> bool:
        sec = self.sections.get(name)
        return sec is not None and sec["sh_type"] != "SHT_NOBITS" and sec["sh_size"] > 0

    def has_dwarf(self) -> bool:
        return (self.has(".debug_info") or self.has(".zdebug_info")) and (
            self.has(".debug_line") or self.has(".zdebug_line"))

    def section_data(self, name: str) -> Optional[bytes]:
        sec = self.sections.get(name)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            if name.startswith(".debug_"):
                return self.section_data(".z" + name[1:])
            return None
        data = sec.data()  # pyelftools decompresses SHF_COMPRESSED (zlib)
        if name.startswith(".zdebug_") and data[:4] == b"ZLIB":
            data = zlib.decompress(data[12:])
        return bytes(data)

    def _read_build_id(self) -> Optional[bytes]:
        from elftools.elf.sections import NoteSection

        secs = [self.sections.get(".note.gnu.build-id")]
        secs += [s for s in self.elf.iter_sections() if isinstance(s, NoteSection)]
        for sec in secs:
            if sec is None or not isinstance(sec, NoteSection) or sec["sh_type"] == "SHT_NOBITS":
                continue
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                    desc = note["n_desc"]
                    return bytes.fromhex(desc) if isinstance(desc, str) else bytes(desc)
        if not self.sections or len(self.sections) <= 1:  # no section headers: look at PT_NOTE
            try:
                for seg in self.elf.iter_segments():
                    if seg["p_type"] == "PT_NOTE":
                        for note in seg.iter_notes():
                            if note["n_type"] == "NT_GNU_BUILD_ID":
                                desc = note["n_desc"]
                                return bytes.fromhex(desc) if isinstance(desc, str) else bytes(desc)
            except Exception:
                pass
        return None

    def _read_debuglink(self):
        sec = self.sections.get(".gnu_debuglink")
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return None
        data = sec.data()
        end = data.find(b"\0")
        if end <= 0:
            return None
        name = os.fsdecode(data[:end])
        crc_off = (end + 4) & ~3
        if crc_off + 4 > len(data):
            return None
        (crc,) = struct.unpack_from(self.endian + "I", data, crc_off)
        return name, crc

    def read_altlink(self):
        sec = self.sections.get(".gnu_debugaltlink")
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return None
        data = sec.data()
        end = data.find(b"\0")
        if end <= 0:
            return None
        return os.fsdecode(data[:end]), bytes(data[end + 1:])


def _file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                return crc & 0xFFFFFFFF
            crc = zlib.crc32(chunk, crc)


# ---------------------------------------------------------------------------------------------
# Symbol tables: sorted arrays + bisect
# ---------------------------------------------------------------------------------------------

STT_NOTYPE, STT_FUNC, STT_GNU_IFUNC = 0, 2, 10
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2


class _SymTab:
    """Function symbols as sorted parallel arrays; names decoded on lookup."""

    def __init__(self):
        self.starts: List[int] = []
        self.ends: List[int] = []  # start + size (== start for size 0)
        self.name_offs: List[int] = []
        self.tab_ids: List[int] = []
        self.tabs: List[bytes] = []
        self.max_size = 0
        self._names: Dict[int, str] = {}

    @staticmethod
    def build(tables) -> "_SymTab":
        """tables: list of (elf, symtab section name); entries merged into one index."""
        st = _SymTab()
        cand = []
        for elf, secname in tables:
            sec = elf.sections.get(secname)
            if sec is None or sec["sh_type"] == "SHT_NOBITS" or sec["sh_size"] == 0:
                continue
            data = sec.data()
            strtab = elf.elf.get_section(sec["sh_link"]).data()
            tab_id = len(st.tabs)
            st.tabs.append(strtab)
            is64 = elf.elfclass == 64
            thumb = elf.machine == "EM_ARM"
            ex = elf.exec_sections
            fmt = elf.endian + ("IBBHQQ" if is64 else "IIIBBH")
            entsize = struct.calcsize(fmt)
            usable = len(data) - len(data) % entsize
            append = cand.append
            for rec in struct.iter_unpack(fmt, data[:usable]):
                if is64:
                    name_off, info, _other, shndx, value, size = rec
                else:
                    name_off, value, size, info, _other, shndx = rec
                typ = info & 0xF
                if shndx == 0 or shndx >= 0xFF00 or name_off == 0:
                    continue
                if typ == STT_NOTYPE:
                    if size == 0 and shndx not in ex:
                        continue
                    c0 = strtab[name_off]
                    if c0 == 0x24 or (c0 == 0x2E and strtab[name_off + 1] == 0x4C):  # "$x", ".L"
                        continue
                elif typ != STT_FUNC and typ != STT_GNU_IFUNC:
                    continue
                if thumb:
                    value &= ~1
                bind = info >> 4
                # Best candidate per address sorts last: sized, FUNC, GLOBAL, WEAK.
                rank = (size > 0) * 8 + (typ != STT_NOTYPE) * 4 + (bind == STB_GLOBAL) * 2 + (bind == STB_WEAK)
                append((value, rank, size, name_off, tab_id))
        if not cand:
            return st
        cand.sort()
        starts, ends, offs, ids = [], [], [], []
        n = len(cand)
        max_size = 0
        for i in range(n):
            value, _rank, size, name_off, tab_id = cand[i]
            if i + 1 < n and cand[i + 1][0] == value:
                continue  # a better alias at the same address follows
            starts.append(value)
            ends.append(value + size)
            offs.append(name_off)
            ids.append(tab_id)
            if size > max_size:
                max_size = size
        st.starts, st.ends, st.name_offs, st.tab_ids, st.max_size = starts, ends, offs, ids, max_size
        return st

    def __len__(self):
        return len(self.starts)

    def name(self, i: int) -> str:
        s = self._names.get(i)
        if s is None:
            tab = self.tabs[self.tab_ids[i]]
            off = self.name_offs[i]
            end = tab.find(b"\0", off)
            s = tab[off:end if end >= 0 else len(tab)].decode("utf-8", "replace")
            at = s.find("@@")  # default symbol version ("localeconv@@GLIBC_2.2.5")
            if at > 0:
                s = s[:at]
            s = demangle(s)
            self._names[i] = s
        return s

    def lookup(self, off: int) -> Optional[str]:
        starts = self.starts
        i = bisect.bisect_right(starts, off) - 1
        if i < 0:
            return None
        ends = self.ends
        if off < ends[i]:
            return self.name(i)
        # An enclosing larger symbol (nested symbols are rare): look back a few entries.
        j = i - 1
        limit = off - self.max_size
        steps = 0
        while j >= 0 and starts[j] > limit and steps < 16:
            if off < ends[j]:
                return self.name(j)
            j -= 1
            steps += 1
        if ends[i] == starts[i]:  # size 0: nearest preceding symbol
            return self.name(i)
        return None


# ---------------------------------------------------------------------------------------------
# DIE decoding: per-abbreviation functions generated on first use
# ---------------------------------------------------------------------------------------------

# Result tuple of a generated DIE reader:
#   (next_pos, sibling, low_pc, high_pc, ranges, abstract_origin, call_file, call_line)
_SLOTS = {
    AT_SIBLING: 1,
    AT_LOW_PC: 2,
    AT_HIGH_PC: 3,
    AT_RANGES: 4,
    AT_ABSTRACT_ORIGIN: 5,
    AT_CALL_FILE: 6,
    AT_CALL_LINE: 7,
}
_NSLOTS = 8


def _fixed_form_size(form: int, ctx) -> Optional[int]:
    _E, asz, osz, version = ctx
    if form in (FORM_DATA1, FORM_REF1, FORM_FLAG, FORM_STRX1, FORM_ADDRX1):
        return 1
    if form in (FORM_DATA2, FORM_REF2, FORM_STRX2, FORM_ADDRX2):
        return 2
    if form in (FORM_STRX3, FORM_ADDRX3):
        return 3
    if form in (FORM_DATA4, FORM_REF4, FORM_STRX4, FORM_ADDRX4, FORM_REF_SUP4):
        return 4
    if form in (FORM_DATA8, FORM_REF8, FORM_REF_SIG8, FORM_REF_SUP8):
        return 8
    if form == FORM_DATA16:
        return 16
    if form in (FORM_STRP, FORM_SEC_OFFSET, FORM_LINE_STRP, FORM_STRP_SUP, FORM_GNU_REF_ALT, FORM_GNU_STRP_ALT):
        return osz
    if form == FORM_ADDR:
        return asz
    if form == FORM_REF_ADDR:
        return asz if version <= 2 else osz
    if form in (FORM_FLAG_PRESENT, FORM_IMPLICIT_CONST):
        return 0
    return None


class _Abbrev:
    __slots__ = ("code", "tag", "children", "specs", "forms", "fn", "high_const", "skip", "skip_walk")

    def __init__(self, code, tag, children, specs, ctx):
        self.code = code
        self.tag = tag
        self.children = children
        self.specs = specs  # [(attr, form, implicit_const)]
        self.forms = {}
        for attr, form, _ic in specs:
            self.forms.setdefault(attr, form)
        self.fn = None
        hf = self.forms.get(AT_HIGH_PC)
        self.high_const = hf is not None and hf not in (FORM_ADDR,) and hf not in _ADDRX_FORMS
        # Size of a childless DIE whose attributes all have fixed sizes: walks step over it
        # without decoding (skip_walk: only for tags the walks never look into).
        self.skip = None
        if not children:
            size = 0
            for _attr, form, _ic in specs:
                fs = _fixed_form_size(form, ctx)
                if fs is None:
                    size = None
                    break
                size += fs
            self.skip = size
        self.skip_walk = self.skip if tag not in _SCOPE_TAGS and tag != TAG_SUBPROGRAM else None


def _gen_reader(ab: _Abbrev, ctx) -> "callable":
    """Generate straight-line Python that skips one DIE of this abbreviation and picks out the
    attributes in _SLOTS (refs made absolute for CU-relative forms)."""
    E, asz, osz, version = ctx
    u16 = "U16(d, p)[0]"
    u32 = "U32(d, p)[0]"
    u64 = "U64(d, p)[0]"
    ufmt = {1: "d[p]", 2: u16, 4: u32, 8: u64}
    code = ["def reader(d, p, cu):"]
    out = ["None"] * _NSLOTS
    n = 0

    def emit(s):
        code.append("    " + s)

    def uleb_into(var):
        emit("%s = d[p]; p += 1" % var)
        emit("if %s >= 0x80:" % var)
        emit("    %s &= 0x7f; s = 7" % var)
        emit("    while True:")
        emit("        b = d[p]; p += 1; %s |= (b & 0x7f) << s; s += 7" % var)
        emit("        if b < 0x80: break")

    def uleb_skip():
        emit("while d[p] >= 0x80: p += 1")
        emit("p += 1")

    for attr, form, ic in ab.specs:
        slot = _SLOTS.get(attr)
        var = None
        if slot is not None:
            var = "v%d" % n
            n += 1
        if form == FORM_INDIRECT:
            raise _DwarfError("DW_FORM_indirect not supported")
        size = None
        if form in (FORM_DATA1, FORM_REF1, FORM_FLAG, FORM_STRX1, FORM_ADDRX1):
            size = 1
        elif form in (FORM_DATA2, FORM_REF2, FORM_STRX2, FORM_ADDRX2):
            size = 2
        elif form in (FORM_STRX3, FORM_ADDRX3):
            size = 3
        elif form in (FORM_DATA4, FORM_REF4, FORM_STRX4, FORM_ADDRX4, FORM_REF_SUP4):
            size = 4
        elif form in (FORM_DATA8, FORM_REF8, FORM_REF_SIG8, FORM_REF_SUP8):
            size = 8
        elif form == FORM_DATA16:
            size = 16
        elif form in (FORM_STRP, FORM_SEC_OFFSET, FORM_LINE_STRP, FORM_STRP_SUP, FORM_GNU_REF_ALT,
                      FORM_GNU_STRP_ALT):
            size = osz
        elif form == FORM_ADDR:
            size = asz
        elif form == FORM_REF_ADDR:
            size = asz if version <= 2 else osz
        elif form in (FORM_FLAG_PRESENT, FORM_IMPLICIT_CONST):
            size = 0
        if size is not None:
            if var is not None:
                if form == FORM_IMPLICIT_CONST:
                    emit("%s = %d" % (var, ic))
                elif form == FORM_FLAG_PRESENT:
                    emit("%s = 1" % var)
                elif size == 3:
                    if E == "<":
                        emit("%s = d[p] | d[p+1] << 8 | d[p+2] << 16" % var)
                    else:
                        emit("%s = d[p] << 16 | d[p+1] << 8 | d[p+2]" % var)
                elif size in ufmt:
                    emit("%s = %s" % (var, ufmt[size]))
                else:
                    emit("%s = None" % var)
            if size:
                emit("p += %d" % size)
        elif form in (FORM_UDATA, FORM_REF_UDATA, FORM_STRX, FORM_ADDRX, FORM_LOCLISTX, FORM_RNGLISTX,
                      FORM_GNU_ADDR_INDEX, FORM_GNU_STR_INDEX):
            if var is not None:
                uleb_into(var)
            else:
                uleb_skip()
        elif form == FORM_SDATA:
            if var is not None:
                emit("%s, p = SLEB(d, p)" % var)
            else:
                uleb_skip()
        elif form == FORM_STRING:
            if var is not None:
                emit("%s = p" % var)
            emit("p = d.index(0, p) + 1")
        elif form == FORM_BLOCK1:
            emit("p += 1 + d[p]")
        elif form == FORM_BLOCK2:
            emit("p += 2 + %s" % u16)
        elif form == FORM_BLOCK4:
            emit("p += 4 + %s" % u32)
        elif form in (FORM_BLOCK, FORM_EXPRLOC):
            uleb_into("ln")
            emit("p += ln")
        else:
            raise _DwarfError("unknown DW_FORM 0x%x" % form)
        if var is not None:
            if form in _REL_REF_FORMS:
                emit("%s += cu" % var)
            if out[slot] == "None":
                out[slot] = var
    out[0] = "p"
    emit("return (%s)" % ", ".join(out))
    ns = {
        "U16": struct.Struct(E + "H").unpack_from,
        "U32": struct.Struct(E + "I").unpack_from,
        "U64": struct.Struct(E + "Q").unpack_from,
        "SLEB": _sleb,
    }
    exec(compile("\n".join(code), "<dwarf-abbrev-%d>" % ab.code, "exec"), ns)
    return ns["reader"]


_READER_CACHE: Dict[tuple, object] = {}


class _CU:
    __slots__ = ("off", "end", "die_off", "version", "unit_type", "asz", "osz", "abbrev_off", "abbrevs",
                 "ctx", "low", "comp_dir", "name", "stmt_list", "str_off_base", "addr_base",
                 "rnglists_base", "files", "subprogs", "top_ranges", "tag")


# ---------------------------------------------------------------------------------------------
# DWARF reader for one file
# ---------------------------------------------------------------------------------------------


class _Dwarf:
    def __init__(self, elf: _Elf, alt: "Optional[_Dwarf]" = None):
        self.elf = elf
        self.E = elf.endian
        self.alt = alt
        self.zero_invalid = not elf.zero_is_code
        self.info = elf.section_data(".debug_info") or b""
        self.abbrev = elf.section_data(".debug_abbrev") or b""
        self.line = elf.section_data(".debug_line") or b""
        self._lazy = {}
        self.cus: Dict[int, _CU] = {}
        self._cu_offsets: Optional[List[int]] = None
        self._abbrev_cache = {}
        self._abbrev_objs = {}  # (declaration bytes, ctx) -> _Abbrev, shared by all CUs
        self._name_cache = {}
        self._aranges = None
        self._cu_range_index = None
        self.U16 = struct.Struct(self.E + "H").unpack_from
        self.U32 = struct.Struct(self.E + "I").unpack_from
        self.U64 = struct.Struct(self.E + "Q").unpack_from

    def sec(self, name: str) -> bytes:
        d = self._lazy.get(name)
        if d is None:
            d = self.elf.section_data(name) or b""
            self._lazy[name] = d
        return d

    def uint(self, d, p, size):
        if size == 8:
            return self.U64(d, p)[0]
        if size == 4:
            return self.U32(d, p)[0]
        if size == 2:
            return self.U16(d, p)[0]
        if size == 1:
            return d[p]
        return int.from_bytes(d[p:p + size], "little" if self.E == "<" else "big")

    # ---- units -----------------------------------------------------------------------------

    def cu_offsets(self) -> List[int]:
        if self._cu_offsets is None:
            offs = []
            d = self.info
            p = 0
            n = len(d)
            while p + 11 <= n:
                length = self.U32(d, p)[0]
                hdr = 4
                if length == 0xFFFFFFFF:
                    length = self.U64(d, p + 4)[0]
                    hdr = 12
                if length == 0:
                    break
                offs.append(p)
                p += hdr + length
            self._cu_offsets = offs
        return self._cu_offsets

    def cu_at(self, off: int) -> _CU:
        cu = self.cus.get(off)
        if cu is not None:
            return cu
        d = self.info
        cu = _CU()
        cu.off = off
        length = self.U32(d, off)[0]
        p = off + 4
        osz = 4
        if length == 0xFFFFFFFF:
            length = self.U64(d, p)[0]
            p += 8
            osz = 8
        cu.end = p + length
        version = self.U16(d, p)[0]
        p += 2
        cu.unit_type = 1
        if version >= 5:
            cu.unit_type = d[p]
            cu.asz = d[p + 1]
            cu.abbrev_off = self.uint(d, p + 2, osz)
            p += 2 + osz
            if cu.unit_type in (4, 5):  # skeleton / split_compile: dwo_id
                p += 8
            elif cu.unit_type in (2, 6):  # type units
                p += 8 + osz
        elif 2 <= version <= 4:
            cu.abbrev_off = self.uint(d, p, osz)
            cu.asz = d[p + osz]
            p += osz + 1
        else:
            raise _DwarfError("unsupported DWARF version %d at 0x%x" % (version, off))
        cu.version = version
        cu.osz = osz
        cu.die_off = p
        cu.ctx = (self.E, cu.asz, osz, version)
        cu.abbrevs = self._abbrev_table(cu.abbrev_off, cu.ctx)
        cu.files = None
        cu.subprogs = None
        cu.top_ranges = None
        cu.low = 0
        cu.comp_dir = None
        cu.name = None
        cu.stmt_list = None
        cu.str_off_base = 8 if osz == 4 else 16
        cu.addr_base = 8 if osz == 4 else 16
        cu.rnglists_base = 0
        cu.tag = 0
        # Top DIE: read generically.
        try:
            code, q = _uleb(d, p)
            if code:
                ab = cu.abbrevs[code]
                cu.tag = ab.tag
                attrs, _ = self.read_attrs(cu, ab, q)
                for a in (AT_STR_OFFSETS_BASE, AT_ADDR_BASE, AT_GNU_ADDR_BASE, AT_RNGLISTS_BASE,
                          AT_GNU_RANGES_BASE):
                    if a in attrs:
                        v = attrs[a][1]
                        if a == AT_STR_OFFSETS_BASE:
                            cu.str_off_base = v
                        elif a in (AT_ADDR_BASE, AT_GNU_ADDR_BASE):
                            cu.addr_base = v
                        else:
                            cu.rnglists_base = v
                if AT_LOW_PC in attrs:
                    cu.low = self.attr_addr(cu, *attrs[AT_LOW_PC])
                if AT_COMP_DIR in attrs:
                    cu.comp_dir = self.attr_str(cu, *attrs[AT_COMP_DIR])
                if AT_NAME in attrs:
                    cu.name = self.attr_str(cu, *attrs[AT_NAME])
                if AT_STMT_LIST in attrs:
                    cu.stmt_list = attrs[AT_STMT_LIST][1]
                if AT_RANGES in attrs:
                    cu.top_ranges = ("ranges",) + attrs[AT_RANGES]
                elif AT_LOW_PC in attrs and AT_HIGH_PC in attrs:
                    hf, hv = attrs[AT_HIGH_PC]
                    hi = cu.low + hv if hf in _CONST_FORMS else self.attr_addr(cu, hf, hv)
                    cu.top_ranges = [(cu.low, hi)]
        except (IndexError, KeyError, struct.error, ValueError):
            pass
        self.cus[off] = cu
        return cu

    def top_ranges(self, cu: _CU) -> List[Tuple[int, int]]:
        r = cu.top_ranges
        if r is None:
            return []
        if isinstance(r, tuple):
            try:
                r = self.rangelist(cu, r[2], r[1])
            except (IndexError, struct.error, ValueError):
                r = []
            cu.top_ranges = r
        return r

    def cu_containing(self, die_off: int) -> _CU:
        offs = self.cu_offsets()
        i = bisect.bisect_right(offs, die_off) - 1
        if i < 0:
            raise _DwarfError("DIE offset 0x%x outside .debug_info" % die_off)
        return self.cu_at(offs[i])

    def _abbrev_table(self, off: int, ctx) -> "_AbbrevTable":
        key = (off, ctx)
        tab = self._abbrev_cache.get(key)
        if tab is not None:
            return tab
        d = self.abbrev
        pos = {}
        p = off
        match = _ABBREV_ENTRY_RX.match
        while True:
            m = match(d, p)
            if m is None:  # the table's terminating 0 (or damage)
                break
            code = d[p]
            if code >= 0x80:
                code = _uleb(d, p)[0]
            p = m.end()
            pos.setdefault(code, (m.end(1), p))
        tab = _AbbrevTable(d, ctx, pos, self._abbrev_objs)
        self._abbrev_cache[key] = tab
        return tab

    # ---- generic attribute reading (slow path: top DIEs, names) ------------------------------

    def read_form(self, cu: _CU, form: int, d, p, ic):
        """Returns (value, new_pos). Strings come back as ('pos', p) for DW_FORM_string."""
        asz, osz = cu.asz, cu.osz
        if form == FORM_INDIRECT:
            form, p = _uleb(d, p)
            v, p = self.read_form(cu, form, d, p, ic)
            return (form, v), p
        if form == FORM_ADDR:
            return self.uint(d, p, asz), p + asz
        if form in (FORM_DATA1, FORM_REF1, FORM_FLAG, FORM_STRX1, FORM_ADDRX1):
            return d[p], p + 1
        if form in (FORM_DATA2, FORM_REF2, FORM_STRX2, FORM_ADDRX2):
            return self.U16(d, p)[0], p + 2
        if form in (FORM_STRX3, FORM_ADDRX3):
            return self.uint(d, p, 3), p + 3
        if form in (FORM_DATA4, FORM_REF4, FORM_STRX4, FORM_ADDRX4, FORM_REF_SUP4):
            return self.U32(d, p)[0], p + 4
        if form in (FORM_DATA8, FORM_REF8, FORM_REF_SIG8, FORM_REF_SUP8):
            return self.U64(d, p)[0], p + 8
        if form == FORM_DATA16:
            return bytes(d[p:p + 16]), p + 16
        if form in (FORM_STRP, FORM_SEC_OFFSET, FORM_LINE_STRP, FORM_STRP_SUP, FORM_GNU_REF_ALT,
                    FORM_GNU_STRP_ALT):
            return self.uint(d, p, osz), p + osz
        if form == FORM_REF_ADDR:
            s = asz if cu.version <= 2 else osz
            return self.uint(d, p, s), p + s
        if form in (FORM_UDATA, FORM_REF_UDATA, FORM_STRX, FORM_ADDRX, FORM_LOCLISTX, FORM_RNGLISTX,
                    FORM_GNU_ADDR_INDEX, FORM_GNU_STR_INDEX):
            return _uleb(d, p)
        if form == FORM_SDATA:
            return _sleb(d, p)
        if form == FORM_STRING:
            return p, d.index(0, p) + 1
        if form == FORM_FLAG_PRESENT:
            return 1, p
        if form == FORM_IMPLICIT_CONST:
            return ic, p
        if form == FORM_BLOCK1:
            n = d[p]
            return None, p + 1 + n
        if form == FORM_BLOCK2:
            return None, p + 2 + self.U16(d, p)[0]
        if form == FORM_BLOCK4:
            return None, p + 4 + self.U32(d, p)[0]
        if form in (FORM_BLOCK, FORM_EXPRLOC):
            n, p = _uleb(d, p)
            return None, p + n
        raise _DwarfError("unknown DW_FORM 0x%x" % form)

    def read_attrs(self, cu: _CU, ab: _Abbrev, p: int):
        attrs = {}
        d = self.info
        for attr, form, ic in ab.specs:
            v, p = self.read_form(cu, form, d, p, ic)
            if form == FORM_INDIRECT:
                form, v = v
            if form in _REL_REF_FORMS:
                v += cu.off
            attrs.setdefault(attr, (form, v))
        return attrs, p

    def attr_str(self, cu: _CU, form: int, v) -> Optional[str]:
        try:
            if form == FORM_STRING:
                return _cstr(self.info, v)
            if form == FORM_STRP:
                return _cstr(self.sec(".debug_str"), v)
            if form == FORM_LINE_STRP:
                return _cstr(self.sec(".debug_line_str"), v)
            if form in _STRX_FORMS:
                so = self.sec(".debug_str_offsets")
                off = self.uint(so, cu.str_off_base + v * cu.osz, cu.osz)
                return _cstr(self.sec(".debug_str"), off)
            if form in (FORM_GNU_STRP_ALT, FORM_STRP_SUP):
                if self.alt is not None:
                    return _cstr(self.alt.sec(".debug_str"), v)
                return None
        except (ValueError, IndexError, struct.error):
            return None
        return None

    def attr_addr(self, cu: _CU, form: int, v: int) -> int:
        if form in _ADDRX_FORMS:
            return self.uint(self.sec(".debug_addr"), cu.addr_base + v * cu.asz, cu.asz)
        return v

    def rangelist(self, cu: _CU, v: int, form: int) -> List[Tuple[int, int]]:
        """Decode DW_AT_ranges (DWARF 2-4 .debug_ranges, DWARF 5 .debug_rnglists)."""
        out = []
        asz = cu.asz
        base = cu.low
        if cu.version < 5 and form != FORM_RNGLISTX:
            d = self.sec(".debug_ranges")
            p = v
            maxa = (1 << (8 * asz)) - 1
            while p + 2 * asz <= len(d):
                a = self.uint(d, p, asz)
                b = self.uint(d, p + asz, asz)
                p += 2 * asz
                if a == 0 and b == 0:
                    break
                if a == maxa:
                    base = b
                    continue
                if b > a:
                    out.append((base + a, base + b))
            return out
        d = self.sec(".debug_rnglists")
        if form == FORM_RNGLISTX:
            p = cu.rnglists_base + self.uint(d, cu.rnglists_base + v * cu.osz, cu.osz)
        else:
            p = v
        n = len(d)
        while p < n:
            kind = d[p]
            p += 1
            if kind == 0:
                break
            if kind == 1:
                i, p = _uleb(d, p)
                base = self.attr_addr(cu, FORM_ADDRX, i)
            elif kind == 2:
                i, p = _uleb(d, p)
                j, p = _uleb(d, p)
                a, b = self.attr_addr(cu, FORM_ADDRX, i), self.attr_addr(cu, FORM_ADDRX, j)
                out.append((a, b))
            elif kind == 3:
                i, p = _uleb(d, p)
                ln, p = _uleb(d, p)
                a = self.attr_addr(cu, FORM_ADDRX, i)
                out.append((a, a + ln))
            elif kind == 4:
                a, p = _uleb(d, p)
                b, p = _uleb(d, p)
                out.append((base + a, base + b))
            elif kind == 5:
                base = self.uint(d, p, asz)
                p += asz
            elif kind == 6:
                a = self.uint(d, p, asz)
                b = self.uint(d, p + asz, asz)
                p += 2 * asz
                out.append((a, b))
            elif kind == 7:
                a = self.uint(d, p, asz)
                p += asz
                ln, p = _uleb(d, p)
                out.append((a, a + ln))
            else:
                break
        return [(a, b) for a, b in out if b > a]

    def _valid_range(self, lo: int, hi: int) -> bool:
        if hi <= lo:
            return False
        if lo == 0 and self.zero_invalid:
            return False
        return True

    # ---- CU lookup by address ------------------------------------------------------------------

    def aranges(self):
        """Sorted (starts, ends, cu_offsets) from .debug_aranges, plus the set of covered CUs."""
        if self._aranges is None:
            d = self.sec(".debug_aranges")
            items = []
            covered = set()
            p = 0
            n = len(d)
            while p + 12 <= n:
                length = self.U32(d, p)[0]
                q = p + 4
                osz = 4
                if length == 0xFFFFFFFF:
                    length = self.U64(d, q)[0]
                    q += 8
                    osz = 8
                end = q + length
                if length == 0:
                    break
                try:
                    cu_off = self.uint(d, q + 2, osz)
                    q += 2 + osz
                    asz = d[q]
                    seg = d[q + 1]
                    q += 2
                    tuple_size = 2 * asz + seg
                    rem = (q - p) % tuple_size
                    if rem:
                        q += tuple_size - rem
                    covered.add(cu_off)
                    if asz == 8 and seg == 0:
                        fmt = struct.Struct(self.E + "QQ")
                        stop = end - (end - q) % 16
                        for a, ln in fmt.iter_unpack(d[q:stop]):
                            if a == 0 and ln == 0:
                                break
                            if self._valid_range(a, a + ln):
                                items.append((a, a + ln, cu_off))
                    else:
                        while q + tuple_size <= end:
                            q += seg
                            a = self.uint(d, q, asz)
                            ln = self.uint(d, q + asz, asz)
                            q += 2 * asz
                            if a == 0 and ln == 0:
                                break
                            if self._valid_range(a, a + ln):
                                items.append((a, a + ln, cu_off))
                except (IndexError, struct.error):
                    pass
                p = end
            items.sort()
            self._aranges = ([i[0] for i in items], [i[1] for i in items], [i[2] for i in items], covered)
        return self._aranges

    def cu_range_index(self, exclude):
        """Ranges of the CUs not covered by .debug_aranges, from their top DIEs."""
        if self._cu_range_index is None:
            items = []
            for off in self.cu_offsets():
                if off in exclude:
                    continue
                try:
                    cu = self.cu_at(off)
                except (_DwarfError, IndexError, KeyError, struct.error, ValueError):
                    continue
                if cu.unit_type not in (1, 4) or cu.tag == TAG_PARTIAL_UNIT:
                    continue
                for lo, hi in self.top_ranges(cu):
                    if self._valid_range(lo, hi):
                        items.append((lo, hi, off))
            items.sort()
            self._cu_range_index = ([i[0] for i in items], [i[1] for i in items], [i[2] for i in items])
        return self._cu_range_index

    @staticmethod
    def _find_range(index, t):
        starts, ends, vals = index[0], index[1], index[2]
        i = bisect.bisect_right(starts, t) - 1
        k = 0
        while i >= 0 and k < 8:
            if starts[i] <= t < ends[i]:
                return vals[i]
            i -= 1
            k += 1
        return None

    def group_by_cu(self, targets: Sequence[int]) -> Dict[int, List[int]]:
        ar = self.aranges()
        groups: Dict[int, List[int]] = {}
        missing = []
        for t in targets:
            c = self._find_range(ar, t) if ar[0] else None
            if c is None:
                missing.append(t)
            else:
                groups.setdefault(c, []).append(t)
        if missing and len(ar[3]) < len(self.cu_offsets()):
            idx = self.cu_range_index(ar[3])
            for t in missing:
                c = self._find_range(idx, t)
                if c is not None:
                    groups.setdefault(c, []).append(t)
        return groups

    # ---- line programs -----------------------------------------------------------------------

    def line_header(self, cu: _CU) -> "_LineHeader":
        """Parse the line-program header at the CU's DW_AT_stmt_list (DWARF 2-5)."""
        d = self.line
        off = cu.stmt_list
        h = _LineHeader()
        length = self.U32(d, off)[0]
        p = off + 4
        osz = 4
        if length == 0xFFFFFFFF:
            length = self.U64(d, p)[0]
            p += 8
            osz = 8
        h.end = min(p + length, len(d))
        version = h.version = self.U16(d, p)[0]
        p += 2
        if not 2 <= version <= 5:
            raise _DwarfError("unsupported line table version %d" % version)
        if version >= 5:
            p += 2  # address_size, segment_selector_size
        hlen = self.uint(d, p, osz)
        p += osz
        h.program = p + hlen
        h.min_inst = d[p] or 1
        p += 1
        if version >= 4:
            p += 1  # maximum_operations_per_instruction
        h.line_base = d[p + 1] - 256 if d[p + 1] >= 128 else d[p + 1]
        h.line_range = d[p + 2] or 1
        h.opcode_base = d[p + 3]
        p += 4
        h.std_lens = list(d[p:p + h.opcode_base - 1])
        p += max(0, h.opcode_base - 1)
        h.files_raw = []
        if version >= 5:
            h.dirs_raw, p = self._lnct_entries(cu, d, p)
            h.files_raw, p = self._lnct_entries(cu, d, p)
        else:
            dirs = []
            while d[p] != 0:
                e = d.index(0, p)
                dirs.append({1: (FORM_STRING, p)})
                p = e + 1
            p += 1
            h.dirs_raw = dirs
            while p < h.program and d[p] != 0:
                e = d.index(0, p)
                entry = {1: (FORM_STRING, p)}
                di, q = _uleb(d, e + 1)
                entry[2] = (FORM_UDATA, di)
                _mtime, q = _uleb(d, q)
                _size, p = _uleb(d, q)
                h.files_raw.append(entry)
        return h

    def _lnct_entries(self, cu: _CU, d, p):
        nfmt = d[p]
        p += 1
        fmt = []
        for _ in range(nfmt):
            ct, p = _uleb(d, p)
            form, p = _uleb(d, p)
            fmt.append((ct, form))
        count, p = _uleb(d, p)
        out = []
        for _ in range(count):
            entry = {}
            for ct, form in fmt:
                v, p = self.read_form(cu, form, d, p, 0)
                if form == FORM_INDIRECT:
                    form, v = v
                entry[ct] = (form, v)
            out.append(entry)
        return out, p

    def _lnct_str(self, cu: _CU, fv) -> Optional[str]:
        if fv is None:
            return None
        form, v = fv
        if form == FORM_STRING:
            try:
                return _cstr(self.line, v)
            except (ValueError, IndexError):
                return None
        return self.attr_str(cu, form, v)

    def lines_for(self, cu: _CU, targets: List[int]) -> Dict[int, Tuple[int, int]]:
        """For each target in this CU, the (file index, line) of the last line-table row at or
        below it within a sequence that extends past it.

        Two passes: _scan_sequences finds every sequence's byte range and start address at C
        speed; only sequences that can hold a target are then decoded, from their start to
        their last target. Sequences of one CU do not overlap, so a sequence starting at A
        ends at or before the next sequence start above A: that bound decides which targets a
        sequence can hold, without trusting .debug_aranges to match sequences."""
        if cu.stmt_list is None or not self.line:
            return {}
        d = self.line
        h = self.line_header(cu)
        res: Dict[int, Tuple[int, int]] = {}
        args = (h.min_inst, h.line_base, h.line_range, h.opcode_base, h.std_lens, targets, res,
                self.zero_invalid, self.E)
        scan = _scan_sequences(d, h.program, h.end, h.opcode_base, h.std_lens, self.E, cu.asz)
        if scan is None:
            _decode_rows(d, h.program, h.end, *args)
        else:
            seqs, new_files = scan
            for pos, di in new_files:  # DW_LNE_define_file (DWARF <= 4)
                h.files_raw.append({1: (FORM_STRING, pos), 2: (FORM_UDATA, di)})
            zero_invalid = self.zero_invalid
            starts = sorted({a for a, _, _ in seqs if not (zero_invalid and a == 0)})
            n = len(targets)
            bisect_left, bisect_right = bisect.bisect_left, bisect.bisect_right
            for a, bs, be in seqs:
                if zero_invalid and a == 0:
                    continue
                k = bisect_left(targets, a)
                if k == n:
                    continue
                i = bisect_right(starts, a)
                bound = starts[i] if i < len(starts) else _INF
                if targets[k] >= bound:
                    continue
                _decode_rows(d, bs, be, *args, bound)
        cu.files = _FileTable(self, cu, h)
        return res

    # ---- DIE walks: subprograms and inlined subroutines --------------------------------------

    def _reader(self, cu: _CU, code: int) -> _Abbrev:
        """Give the abbreviation a DIE reader: the generated one when it exists, else an
        interpreting one that generates code once the abbreviation proves frequently used
        (compiling costs about as much as interpreting 50 DIEs)."""
        ab = cu.abbrevs[code]
        if ab.fn is None:
            key = (ab.specs, cu.ctx)
            fn = _READER_CACHE.get(key)
            if fn is None:
                fn = self._interp_reader(ab, cu, key)
            ab.fn = fn
        return ab

    def _interp_reader(self, ab: _Abbrev, cu: _CU, key):
        read_form = self.read_form
        specs = ab.specs
        slots = [_SLOTS.get(attr) for attr, _f, _i in specs]
        calls = [0]

        def reader(d, p, cuoff):
            calls[0] += 1
            if calls[0] > 50:
                fn = _READER_CACHE.get(key)
                if fn is None:
                    fn = _READER_CACHE[key] = _gen_reader(ab, cu.ctx)
                ab.fn = fn
                return fn(d, p, cuoff)
            out = [None] * _NSLOTS
            for (_attr, form, ic), slot in zip(specs, slots):
                v, p = read_form(cu, form, d, p, ic)
                if slot is not None and out[slot] is None:
                    if form in _REL_REF_FORMS:
                        v += cuoff
                    out[slot] = v
            out[0] = p
            return tuple(out)

        return reader

    def _ranges_of(self, cu: _CU, ab: _Abbrev, r):
        if r[4] is not None:
            return self.rangelist(cu, r[4], ab.forms[AT_RANGES])
        low = r[2]
        if low is None:
            return None
        if ab.forms[AT_LOW_PC] in _ADDRX_FORMS:
            low = self.attr_addr(cu, ab.forms[AT_LOW_PC], low)
        high = r[3]
        if high is None:
            return [(low, low + 1)]
        if ab.high_const:
            return [(low, low + high)]
        return [(low, self.attr_addr(cu, ab.forms[AT_HIGH_PC], high))]

    def _skip_children(self, cu: _CU, p: int) -> int:
        d = self.info
        off = cu.off
        abbrevs = cu.abbrevs
        depth = 1
        while depth:
            code = d[p]
            p += 1
            if code >= 0x80:
                b = d[p]
                if b < 0x80:
                    code = (code & 0x7F) | (b << 7)
                    p += 1
                else:
                    code, p = _uleb(d, p - 1)
            if code == 0:
                depth -= 1
                continue
            ab = abbrevs[code]
            if ab.skip is not None:
                p += ab.skip
                continue
            fn = ab.fn or self._reader(cu, code).fn
            r = fn(d, p, off)
            if ab.children:
                if r[1] is not None and r[1] > p:
                    p = r[1]
                else:
                    p = r[0]
                    depth += 1
            else:
                p = r[0]
        return p

    def subprograms(self, cu: _CU):
        """(starts, ends, die_offsets) of the concrete subprograms of a CU (top level and inside
        namespaces), sorted by start."""
        if cu.subprogs is not None:
            return cu.subprogs
        d = self.info
        off = cu.off
        abbrevs = cu.abbrevs
        items = []
        p = cu.die_off
        code, p = _uleb(d, p)
        if code:
            ab = self._reader(cu, code)
            r = ab.fn(d, p, off)
            p = r[0]
            depth = 1 if ab.children else 0
            end = cu.end
            while depth and p < end:
                start = p
                code = d[p]
                p += 1
                if code >= 0x80:
                    b = d[p]
                    if b < 0x80:
                        code = (code & 0x7F) | (b << 7)
                        p += 1
                    else:
                        code, p = _uleb(d, p - 1)
                if code == 0:
                    depth -= 1
                    continue
                ab = abbrevs[code]
                if ab.skip_walk is not None:
                    p += ab.skip_walk
                    continue
                fn = ab.fn or self._reader(cu, code).fn
                r = fn(d, p, off)
                tag = ab.tag
                if tag == TAG_SUBPROGRAM and (r[2] is not None or r[4] is not None):
                    for lo, hi in self._ranges_of(cu, ab, r):
                        if self._valid_range(lo, hi):
                            items.append((lo, hi, start))
                if ab.children:
                    if tag in _DESCEND_TAGS:
                        p = r[0]
                        depth += 1
                    elif r[1] is not None and r[1] > p:
                        p = r[1]
                    else:
                        p = self._skip_children(cu, r[0])
                else:
                    p = r[0]
        items.sort()
        cu.subprogs = ([i[0] for i in items], [i[1] for i in items], [i[2] for i in items])
        return cu.subprogs

    def _walk_scope(self, cu: _CU, p: int, targets: List[int], chains: Dict[int, list]) -> int:
        """Walk the children of a scope starting at p; record inlined_subroutine DIEs containing
        each target (outermost first). Returns the position after the scope's terminator."""
        d = self.info
        off = cu.off
        abbrevs = cu.abbrevs
        while True:
            code = d[p]
            p += 1
            if code >= 0x80:
                b = d[p]
                if b < 0x80:
                    code = (code & 0x7F) | (b << 7)
                    p += 1
                else:
                    code, p = _uleb(d, p - 1)
            if code == 0:
                return p
            ab = abbrevs[code]
            if ab.skip_walk is not None:
                p += ab.skip_walk
                continue
            fn = ab.fn or self._reader(cu, code).fn
            r = fn(d, p, off)
            tag = ab.tag
            inside = None
            if tag in _SCOPE_TAGS:
                rngs = self._ranges_of(cu, ab, r)
                if rngs is None:
                    inside = targets if tag != TAG_INLINED_SUBROUTINE else None
                elif len(rngs) == 1:
                    lo, hi = rngs[0]
                    inside = [t for t in targets if lo <= t < hi]
                else:
                    inside = [t for t in targets if any(lo <= t < hi for lo, hi in rngs)]
                if inside and tag == TAG_INLINED_SUBROUTINE:
                    rec = (r[5], ab.forms.get(AT_ABSTRACT_ORIGIN), r[6], r[7])
                    for t in inside:
                        chains[t].append(rec)
            if ab.children:
                if inside:
                    p = self._walk_scope(cu, r[0], inside, chains)
                elif r[1] is not None and r[1] > p:
                    p = r[1]
                else:
                    p = self._skip_children(cu, r[0])
            else:
                p = r[0]

    def inline_info(self, cu: _CU, targets: List[int]):
        """For each target: (subprogram DIE offset or None, [inlined records outermost first])."""
        sp = self.subprograms(cu)
        by_sp: Dict[int, List[int]] = {}
        out = {}
        for t in targets:
            die = self._find_range(sp, t) if sp[0] else None
            if die is None:
                out[t] = (None, [])
            else:
                by_sp.setdefault(die, []).append(t)
        d = self.info
        for die, ts in by_sp.items():
            chains = {t: [] for t in ts}
            try:
                code, p = _uleb(d, die)
                ab = self._reader(cu, code)
                r = ab.fn(d, p, cu.off)
                if ab.children:
                    self._walk_scope(cu, r[0], ts, chains)
            except (IndexError, KeyError, struct.error, ValueError, _DwarfError):
                pass
            for t in ts:
                out[t] = (die, chains[t])
        return out

    # ---- names -----------------------------------------------------------------------------

    def die_name(self, ref: int, form: Optional[int] = None, depth: int = 0) -> Optional[str]:
        """Demangled linkage name (or plain name) of the DIE at .debug_info offset ref, following
        DW_AT_abstract_origin / DW_AT_specification."""
        if form == FORM_GNU_REF_ALT or form == FORM_REF_SUP4 or form == FORM_REF_SUP8:
            return self.alt.die_name(ref, None, depth) if self.alt is not None else None
        if form == FORM_REF_SIG8:
            return None
        key = ref
        if key in self._name_cache:
            return self._name_cache[key]
        name = None
        try:
            cu = self.cu_containing(ref)
            code, p = _uleb(self.info, ref)
            if code:
                ab = cu.abbrevs[code]
                attrs, _ = self.read_attrs(cu, ab, p)
                link = attrs.get(AT_LINKAGE_NAME) or attrs.get(AT_MIPS_LINKAGE_NAME)
                if link is not None:
                    s = self.attr_str(cu, *link)
                    if s:
                        name = demangle(s)
                if name is None and depth < 8:
                    for a in (AT_SPECIFICATION, AT_ABSTRACT_ORIGIN):
                        if a in attrs:
                            f, v = attrs[a]
                            name = self.die_name(v, f, depth + 1)
                            if name:
                                break
                if name is None and AT_NAME in attrs:
                    name = self.attr_str(cu, *attrs[AT_NAME])
        except (IndexError, KeyError, struct.error, ValueError, _DwarfError):
            name = None
        self._name_cache[key] = name
        return name


# One abbreviation declaration: code (not 0), tag, children flag, (attribute, form) pairs with an
# SLEB128 after DW_FORM_implicit_const (0x21), then 0, 0. Matching is deterministic on well-formed
# input; tables are located with it and each declaration is decoded on first use.
_ABBREV_ENTRY_RX = re.compile(
    rb"([\x80-\xff]*[\x01-\x7f]|[\x80-\xff]+\x00)"
    rb"[\x80-\xff]*[\x00-\x7f][\x00\x01]"
    rb"(?:(?!\x00\x00)[\x80-\xff]*[\x00-\x7f](?:\x21[\x80-\xff]*[\x00-\x7f]|[\x80-\xff]*[\x00-\x7f]))*"
    rb"\x00\x00", re.S)


class _LineHeader:
    __slots__ = ("version", "end", "program", "min_inst", "line_base", "line_range", "opcode_base",
                 "std_lens", "dirs_raw", "files_raw")


class _FileTable:
    """File index -> full path for one CU, resolved on first use, numbered per DWARF version
    (1-based up to DWARF 4, 0-based in DWARF 5)."""

    def __init__(self, dw: "_Dwarf", cu: _CU, h: _LineHeader):
        self.dw = dw
        self.cu = cu
        self.h = h
        self.cache: Dict[int, Optional[str]] = {}

    def path(self, index) -> Optional[str]:
        if index is None:
            return None
        try:
            return self.cache[index]
        except KeyError:
            pass
        try:
            p = self._resolve(index)
        except (ValueError, IndexError, KeyError, struct.error):
            p = None
        self.cache[index] = p
        return p

    def _resolve(self, index):
        h, dw, cu = self.h, self.dw, self.cu
        comp_dir = cu.comp_dir or ""
        v5 = h.version >= 5
        i = index if v5 else index - 1
        if not 0 <= i < len(h.files_raw):
            return None
        e = h.files_raw[i]
        name = dw._lnct_str(cu, e.get(1))
        if name is None:
            return None
        di = e.get(2, (FORM_UDATA, 0))[1] or 0
        if v5:
            dname = dw._lnct_str(cu, h.dirs_raw[di].get(1)) if di < len(h.dirs_raw) else None
        elif di == 0:
            dname = comp_dir
        else:
            dname = dw._lnct_str(cu, h.dirs_raw[di - 1].get(1)) if di - 1 < len(h.dirs_raw) else None
        path = os.path.join(dname or "", name)
        if not os.path.isabs(path) and comp_dir:
            path = os.path.join(comp_dir, path)
        return path


class _AbbrevTable(dict):
    """Abbreviation code -> _Abbrev, decoded lazily from the declaration positions."""

    def __init__(self, data, ctx, positions, shared):
        super().__init__()
        self.data = data
        self.ctx = ctx
        self.pos = positions
        self.shared = shared

    def __missing__(self, code):
        d = self.data
        start, end = self.pos[code]  # KeyError for an unknown code
        key = (d[start:end], self.ctx)
        ab = self.shared.get(key)
        if ab is not None:
            self[code] = ab
            return ab
        p = start
        tag, p = _uleb(d, p)
        children = d[p]
        p += 1
        specs = []
        while True:
            attr = d[p]
            if attr < 0x80:
                p += 1
            else:
                attr, p = _uleb(d, p)
            form = d[p]
            if form < 0x80:
                p += 1
            else:
                form, p = _uleb(d, p)
            ic = 0
            if form == FORM_IMPLICIT_CONST:
                ic, p = _sleb(d, p)
            if attr == 0 and form == 0:
                break
            specs.append((attr, form, ic))
        ab = _Abbrev(code, tag, bool(children), tuple(specs), self.ctx)
        self.shared[key] = ab
        self[code] = ab
        return ab


_SKIP_RX_CACHE: Dict[tuple, "re.Pattern"] = {}
_LINE_TABLES: Dict[tuple, tuple] = {}


def _skip_regex(ob: int, std_lens: Sequence[int], extended: bool = True):
    """A regular expression matching any run of line-program opcodes other than
    DW_LNE_end_sequence and the rarer extended opcodes, for this header's opcode_base and operand
    counts: skipping a sequence with it runs in C and is exact (a tokenizer, not a byte-pattern
    search)."""
    key = (ob, tuple(std_lens), extended)
    rx = _SKIP_RX_CACHE.get(key)
    if rx is None:
        uleb = rb"[\x80-\xff]*[\x00-\x7f]"
        single = [bytes([op]) for op in range(ob, 256)]
        by_nargs: Dict[int, list] = {}
        fixed = []
        for op in range(1, ob):
            nargs = std_lens[op - 1] if op - 1 < len(std_lens) else 0
            if op == 9:  # DW_LNS_fixed_advance_pc: one uhalf operand
                fixed.append(re.escape(bytes([op])) + rb"[\x00-\xff]{2}")
            elif nargs == 0:
                single.append(bytes([op]))
            else:
                by_nargs.setdefault(nargs, []).append(bytes([op]))
        # Opcodes with operands first: measured faster with Python's engine (gcc emits
        # DW_LNS_set_column before most rows).
        alts = [b"[" + b"".join(re.escape(c) for c in ops) + b"]" + uleb * n for n, ops in sorted(by_nargs.items())]
        alts.append(b"[" + b"".join(re.escape(c) for c in single) + b"]+")
        alts += fixed
        # DW_LNE_set_discriminator (extended opcode 4, ULEB operand of 1-3 bytes): gcc emits it
        # often; other extended opcodes stop the match and are handled by the caller.
        if extended:
            alts += [rb"\x00\x02\x04[\x00-\x7f]", rb"\x00\x03\x04[\x80-\xff][\x00-\x7f]",
                     rb"\x00\x04\x04[\x80-\xff]{2}[\x00-\x7f]"]
        rx = re.compile(b"(?:" + b"|".join(alts) + b")*", re.S)
        _SKIP_RX_CACHE[key] = rx
    return rx


_SEQ_RX_CACHE: Dict[tuple, "re.Pattern"] = {}
# The tokenization never needs backtracking; Python 3.11+ can be told so (twice as fast).
_POSSESSIVE_STAR = b"*+" if sys.version_info >= (3, 11) else b"*"


def _sequence_regex(ob: int, std_lens: Sequence[int], asz: int):
    """Matches one whole sequence made of ordinary opcodes, set_discriminator and set_address,
    ending with DW_LNE_end_sequence; group 1 is the operand of a leading set_address."""
    key = (ob, tuple(std_lens), asz)
    rx = _SEQ_RX_CACHE.get(key)
    if rx is None:
        body = _skip_regex(ob, std_lens).pattern[3:-2]  # the alternatives inside (?:...)*
        plain = _skip_regex(ob, std_lens, False).pattern  # without extended opcodes
        setaddr = re.escape(bytes([0, asz + 1, 2]))
        rx = re.compile(plain + rb"(?:" + setaddr + rb"([\x00-\xff]{%d}))?" % asz
                        + rb"(?:" + body + rb"|" + setaddr + rb"[\x00-\xff]{%d})" % asz
                        + _POSSESSIVE_STAR + rb"\x00\x01\x01", re.S)
        _SEQ_RX_CACHE[key] = rx
    return rx


def _scan_sequences(d, p, end, ob, std_lens, E, asz):
    """First pass over a line program, in C through regular expressions: the byte range and
    start address of every sequence, and the DW_LNE_define_file entries. Returns (sequences,
    define_files) with sequences as [(start address, byte start, byte end)], or None when the
    program does not tokenize (then the caller decodes it all)."""
    seq_match = _sequence_regex(ob, std_lens, asz).match
    match = _skip_regex(ob, std_lens).match
    order = "little" if E == "<" else "big"
    seqs = []
    files = []
    while p < end:
        m = seq_match(d, p, end)
        if m is not None and m.group(1) is not None:
            q = m.end()
            seqs.append((int.from_bytes(m.group(1), order), p, q))
            p = q
            continue
        # An unusual sequence (other extended opcodes, no leading set_address): step through
        # it, stopping at every extended opcode.
        seq_pos = p
        start = None
        while True:
            p = match(d, p, end).end()
            if p >= end:
                if start is not None:
                    seqs.append((start, seq_pos, end))
                return seqs, files
            if d[p] != 0:
                return None
            ln = d[p + 1]
            if ln < 0x80:
                q = p + 2
            else:
                ln, q = _uleb(d, p + 1)
            if ln == 0:
                p = q
                continue
            sub = d[q]
            p = q + ln
            if sub == 1:  # end_sequence
                seqs.append((start or 0, seq_pos, p))
                break
            if sub == 2:  # set_address
                if start is None:
                    start = int.from_bytes(d[q + 1:p], order)
            elif sub == 3:  # define_file
                try:
                    e = d.index(0, q + 1)
                    files.append((q + 1, _uleb(d, e + 1)[0]))
                except (ValueError, IndexError):
                    pass
    return seqs, files


def _decode_rows(d, p, end, min_inst, line_base, line_range, ob, std_lens, targets, res, zero_invalid, E,
                 bend=_INF):
    """Run line-program opcodes over [p, end) (one or more sequences), streaming: no row table
    is built. Rows are matched against the sorted targets as addresses increase: a target gets
    the (file, line) of the last row at or below it in a sequence that extends past it. Stops
    early once the next target is >= bend (the caller knows the sequence ends before bend)."""
    tkey = (ob, line_base, line_range, min_inst)
    tables = _LINE_TABLES.get(tkey)
    if tables is None:
        ADV = [0] * 256
        LADV = [0] * 256
        for op in range(ob, 256):
            adj = op - ob
            ADV[op] = (adj // line_range) * min_inst
            LADV[op] = line_base + adj % line_range
        tables = _LINE_TABLES[tkey] = (ADV, LADV)
    ADV, LADV = tables
    const_add = ADV[255]
    ntargets = len(targets)
    bisect_left = bisect.bisect_left
    u16 = struct.Struct(E + "H").unpack_from
    order = "little" if E == "<" else "big"
    INF = _INF
    address = 0
    file = 1
    line = 1
    pf = 1
    pl = 1
    k = 0
    nt = -1  # next target; -1: at the start of a sequence, before any row
    while p < end:
        op = d[p]
        p += 1
        if op >= ob:
            address += ADV[op]
            line += LADV[op]
        elif op == 0:
            ln = d[p]
            p += 1
            if ln >= 0x80:
                ln, p = _uleb(d, p - 1)
            if ln == 0:
                continue
            sub = d[p]
            q = p + 1
            p += ln
            if sub == 1:  # end_sequence
                if address > nt >= 0:
                    while nt < address:
                        if nt not in res:
                            res[nt] = (pf, pl)
                        k += 1
                        nt = targets[k] if k < ntargets else INF
                address = 0
                file = 1
                line = 1
                nt = -1
            elif sub == 2:  # set_address
                address = int.from_bytes(d[q:p], order)
            continue
        elif op == 5 or op == 12:  # set_column (before most rows), set_isa
            if d[p] < 0x80:
                p += 1
            else:
                while d[p] >= 0x80:
                    p += 1
                p += 1
            continue
        elif op == 1:  # copy
            pass
        elif op == 3:  # advance_line
            b = d[p]
            if b < 0x40:
                p += 1
                line += b
            elif b < 0x80:
                p += 1
                line += b - 0x80
            else:
                b2 = d[p + 1]
                if b2 < 0x80:
                    p += 2
                    v = (b & 0x7F) | (b2 << 7)
                    if b2 & 0x40:
                        v -= 1 << 14
                    line += v
                else:
                    v, p = _sleb(d, p)
                    line += v
            continue
        elif op == 2:  # advance_pc
            b = d[p]
            if b < 0x80:
                p += 1
                address += b * min_inst
            else:
                v, p = _uleb(d, p)
                address += v * min_inst
            continue
        elif op == 4:  # set_file
            b = d[p]
            if b < 0x80:
                p += 1
                file = b
            else:
                file, p = _uleb(d, p)
            continue
        elif op == 8:  # const_add_pc
            address += const_add
            continue
        elif op == 9:  # fixed_advance_pc
            address += u16(d, p)[0]
            p += 2
            continue
        elif op == 6 or op == 7 or op == 10 or op == 11:
            continue
        else:  # unknown standard opcode: skip its ULEB operands
            for _ in range(std_lens[op - 1] if op - 1 < len(std_lens) else 0):
                while d[p] >= 0x80:
                    p += 1
                p += 1
            continue
        # A row is appended (special opcode or DW_LNS_copy).
        if address > nt:
            if nt < 0:  # first row of a sequence
                if zero_invalid and address == 0:
                    nt = INF
                else:
                    k = bisect_left(targets, address)
                    nt = targets[k] if k < ntargets else INF
                    if nt >= bend:
                        return
            else:
                while nt < address:
                    if nt not in res:
                        res[nt] = (pf, pl)
                    k += 1
                    nt = targets[k] if k < ntargets else INF
                if nt >= bend:  # no more targets in this sequence
                    return
        pf = file
        pl = line


# ---------------------------------------------------------------------------------------------
# Per-module state
# ---------------------------------------------------------------------------------------------


class _Module:
    def __init__(self):
        self.main: Optional[_Elf] = None  # the module file, when usable (found and build-id ok)
        self.debug: Optional[_Elf] = None  # file holding DWARF (may be main)
        self.sym_sources: list = []  # [(elf, section name)]
        self.sym_kind = None
        self.failed = False
        self.cache_path: Optional[Path] = None
        self.sig = None
        self.results: Dict[int, list] = {}
        self.dirty = False
        self.symtab: Optional[_SymTab] = None
        self.dwarf: Optional[_Dwarf] = None
        self.extra_files: list = []  # other opened _Elf objects (alt files, minidebuginfo)
        self.label = ""

    def unload(self):
        """Drop the heavy data and the file descriptors (reopened on demand)."""
        self.symtab = None
        self.dwarf = None
        for e in [self.main, self.debug] + self.extra_files:
            if e is not None:
                e.close()



class Symbolizer:
    """Turns (module, runtime addresses) into frames. See the module docstring."""

    _MAX_LOADED = 3  # modules whose symbol tables / DWARF stay in memory

    def __init__(self, cache_dir: Union[str, Path, None] = None, debug_dirs=("/usr/lib/debug",),
                 progress: bool = False, sysroot: Optional[str] = None):
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if isinstance(debug_dirs, (str, Path)):
            debug_dirs = (debug_dirs,)
        self.sysroot = str(sysroot) if sysroot else None
        dirs = []
        for d in debug_dirs or ():
            d = str(d)
            if d not in dirs:
                dirs.append(d)
            if self.sysroot:
                sd = _under(self.sysroot, d)
                if sd not in dirs:
                    dirs.append(sd)
        self.debug_dirs = tuple(dirs)
        self.progress = progress
        self._warnings: List[str] = []
        self._warned = set()
        self._modules: Dict[tuple, _Module] = {}
        self._loaded: List[_Module] = []

    # ---- public ------------------------------------------------------------------------------

    def warnings(self) -> List[str]:
        return list(self._warnings)

    def symbolize(self, module: ModuleRef, addresses: Iterable[int]) -> Dict[int, List[Frame]]:
        """Runtime addresses -> frames, innermost (inlined) first, the outermost real function
        last. Callers pass return addresses minus 1 already adjusted if they want call sites;
        this takes the address as given."""
        addrs = sorted({int(a) for a in addresses})
        out: Dict[int, List[Frame]] = {}
        if not addrs:
            return out
        path = module.path
        bias = int(module.bias or 0)
        try:
            mod = self._module(module)
        except Exception as e:  # never raise on bad input files
            self._warn("%s: cannot read (%s: %s)" % (path, type(e).__name__, e))
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
                self._warn("%s: symbolization failed (%s: %s)" % (path, type(e).__name__, e))
                for o in todo:
                    mod.results.setdefault(o, [(None, None, None, False)])
            self._save_cache(mod)
        for a in addrs:
            o = a - bias
            out[a] = [Frame(path, fn, fl, ln, a, o, inl) for fn, fl, ln, inl in mod.results[o]]
        return out

    # ---- internals ---------------------------------------------------------------------------

    def _warn(self, msg: str):
        if msg not in self._warned:
            self._warned.add(msg)
            self._warnings.append(msg)

    def _candidates(self, path: str, build_id) -> List[str]:
        if self.sysroot:
            c = [_under(self.sysroot, path)]
            if build_id:  # the local file is safe to use only when its build-id can be checked
                c.append(path)
            return c
        return [path]

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
        mod = _Module()
        mod.label = os.path.basename(ref.path) or ref.path
        self._modules[key] = mod
        try:
            self._resolve(mod, ref, build_id)
        except Exception:
            mod.failed = True
            mod.unload()
            raise
        return mod

    def _resolve(self, mod: _Module, ref: ModuleRef, build_id: Optional[bytes]):
        """Find the module's file and debug file, check build-ids, pick symbol tables, load the
        disk cache."""
        path = ref.path
        main = None
        mismatch = None
        for cand in self._candidates(path, build_id):
            if not os.path.isfile(cand):
                continue
            try:
                elf = _Elf(cand)
            except Exception as e:
                self._warn("%s: not a readable ELF file (%s)" % (cand, e))
                continue
            if build_id is not None and elf.build_id != build_id:
                if mismatch is None:
                    mismatch = elf
                else:
                    elf.close()
                continue
            main = elf
            break
        if main is not None and mismatch is not None:
            mismatch.close()
        if main is None:
            if mismatch is not None:
                self._warn("build-id mismatch for %s: trace has %s, file has %s" % (
                    path, build_id.hex(), mismatch.build_id.hex() if mismatch.build_id else "none"))
                mismatch.close()
            else:
                where = " under sysroot %s" % self.sysroot if self.sysroot else ""
                self._warn("%s: file not found%s" % (path, where))
        bid = build_id or (main.build_id if main is not None else None)
        mod.main = main

        # Debug info: the file itself, else a separate debug file.
        debug = None
        if main is not None and main.has_dwarf():
            debug = main
        else:
            debug = self._find_debug_file(path, main, bid)
            if debug is not None and main is None:
                self._warn("%s: using separate debug file %s (matching build-id)" % (path, debug.path))
        mod.debug = debug
        if main is None and debug is None:
            mod.failed = True
            return
        if debug is None:
            self._warn("%s: no debug info (no DWARF in the file and no separate debug file found); "
                       "function names only" % path)

        # Symbol tables: .symtab of the debug file or of the module, else MiniDebugInfo + .dynsym.
        srcs = []
        for elf in (debug, main):
            if elf is not None and elf.has(".symtab"):
                srcs = [(elf, ".symtab")]
                mod.sym_kind = "symtab"
                break
        if not srcs and main is not None:
            if main.has(".gnu_debugdata"):
                try:
                    mini = _Elf(main.path + "[.gnu_debugdata]",
                                data=lzma.decompress(main.section_data(".gnu_debugdata")))
                    mod.extra_files.append(mini)
                    if mini.has(".symtab"):
                        srcs.append((mini, ".symtab"))
                except Exception:
                    pass
            if main.has(".dynsym"):
                srcs.append((main, ".dynsym"))
            mod.sym_kind = "+".join(s[1] for s in srcs) or None
        if not srcs:
            self._warn("%s: no symbol table" % path)
        mod.sym_sources = srcs

        # Disk cache: keyed by build-id (else by the file's identity).
        mod.sig = [CACHE_FORMAT, mod.sym_kind, None if debug is None else ("self" if debug is main else "sep")]
        if self.cache_dir is not None:
            if bid:
                name = bid.hex()
            else:
                st = os.stat(main.path)
                name = "nobid-" + hashlib.sha1(("%s\0%d\0%d" % (
                    os.path.realpath(main.path), st.st_size, st.st_mtime_ns)).encode()).hexdigest()[:24]
            mod.cache_path = self.cache_dir / (name + ".json")
            self._load_cache(mod)
        mod.unload()  # file descriptors are reopened when something must be computed

    def _find_debug_file(self, path: str, main: Optional[_Elf], bid: Optional[bytes]) -> Optional[_Elf]:
        tried = []
        if bid and len(bid) >= 2:
            rel = os.path.join(".build-id", bid[:1].hex(), bid[1:].hex() + ".debug")
            for d in self.debug_dirs:
                cand = os.path.join(d, rel)
                tried.append(cand)
                if not os.path.isfile(cand):
                    continue
                try:
                    elf = _Elf(cand)
                except Exception as e:
                    self._warn("%s: unreadable debug file %s (%s)" % (path, cand, e))
                    continue
                if elf.build_id is not None and elf.build_id != bid:
                    self._warn("%s: debug file %s has build-id %s, expected %s; ignored" % (
                        path, cand, elf.build_id.hex(), bid.hex()))
                    elf.close()
                    continue
                if elf.has_dwarf():
                    return elf
                elf.close()
        if main is not None and main.debuglink is not None:
            name, crc = main.debuglink
            ddir = os.path.dirname(main.path)
            cands = [os.path.join(ddir, name), os.path.join(ddir, ".debug", name)]
            orig_dir = os.path.dirname(path)
            for d in self.debug_dirs:
                cands.append(os.path.join(d, orig_dir.lstrip("/"), name))
                if os.path.realpath(ddir) != os.path.realpath(orig_dir):
                    cands.append(os.path.join(d, ddir.lstrip("/"), name))
            seen = set()
            for cand in cands:
                if cand in seen:
                    continue
                seen.add(cand)
                if not os.path.isfile(cand) or os.path.realpath(cand) == os.path.realpath(main.path):
                    continue
                try:
                    got = _file_crc32(cand)
                except OSError:
                    continue
                if got != crc:
                    self._warn("%s: .gnu_debuglink file %s has CRC %08x, expected %08x; ignored" % (
                        path, cand, got, crc))
                    continue
                try:
                    elf = _Elf(cand)
                except Exception as e:
                    self._warn("%s: unreadable debug file %s (%s)" % (path, cand, e))
                    continue
                if bid and elf.build_id is not None and elf.build_id != bid:
                    self._warn("%s: debug file %s has build-id %s, expected %s; ignored" % (
                        path, cand, elf.build_id.hex(), bid.hex()))
                    elf.close()
                    continue
                if elf.has_dwarf():
                    return elf
                elf.close()
        return None

    def _load_alt(self, mod: _Module, debug: _Elf) -> Optional[_Dwarf]:
        link = debug.read_altlink()
        if link is None:
            return None
        name, alt_bid = link
        cands = []
        if alt_bid:
            rel = os.path.join(".build-id", alt_bid[:1].hex(), alt_bid[1:].hex() + ".debug")
            cands += [os.path.join(d, rel) for d in self.debug_dirs]
        cands.append(name if os.path.isabs(name) else os.path.join(os.path.dirname(debug.path), name))
        if self.sysroot and os.path.isabs(name):
            cands.append(_under(self.sysroot, name))
        for cand in cands:
            if os.path.isfile(cand):
                try:
                    elf = _Elf(cand)
                except Exception:
                    continue
                if alt_bid and elf.build_id is not None and elf.build_id != alt_bid:
                    elf.close()
                    continue
                mod.extra_files.append(elf)
                return _Dwarf(elf)
        self._warn("%s: supplementary debug file %s not found; some inlined names missing" % (
            debug.path, name))
        return None

    def _ensure_loaded(self, mod: _Module):
        if mod in self._loaded:
            self._loaded.remove(mod)
            self._loaded.append(mod)
            return
        self._loaded.append(mod)
        while len(self._loaded) > self._MAX_LOADED:
            self._loaded.pop(0).unload()

    def _compute(self, mod: _Module, ref: ModuleRef, offsets: List[int]):
        self._ensure_loaded(mod)
        path = ref.path
        prog = (self.progress("symbolizing " + mod.label, 1) if callable(self.progress)
                else _Progress(self.progress, "symbolizing " + mod.label, 1))
        try:
            if mod.symtab is None:
                try:
                    mod.symtab = _SymTab.build(mod.sym_sources)
                except Exception as e:
                    self._warn("%s: cannot read symbol table (%s)" % (path, e))
                    mod.symtab = _SymTab()
            symtab = mod.symtab
            names = {o: symtab.lookup(o) for o in offsets}
            prog.step()

            lines = {}
            inl = {}
            dw = None
            if mod.debug is not None:
                if mod.dwarf is None:
                    try:
                        alt = self._load_alt(mod, mod.debug)
                        mod.dwarf = _Dwarf(mod.debug, alt)
                    except Exception as e:
                        self._warn("%s: cannot read DWARF from %s (%s)" % (path, mod.debug.path, e))
                dw = mod.dwarf
            if dw is not None:
                try:
                    groups = dw.group_by_cu(offsets)
                except Exception as e:
                    self._warn("%s: cannot index DWARF (%s: %s)" % (path, type(e).__name__, e))
                    groups = {}
                prog.total += len(groups)
                for cu_off in sorted(groups):
                    ts = groups[cu_off]
                    try:
                        cu = dw.cu_at(cu_off)
                    except Exception as e:
                        self._warn("%s: bad compilation unit at 0x%x (%s)" % (path, cu_off, e))
                        prog.step()
                        continue
                    try:
                        res = dw.lines_for(cu, ts)
                        for t, (fi, ln) in res.items():
                            lines[t] = (cu.files.path(fi), ln or None)
                    except Exception as e:
                        self._warn("%s: cannot decode line table of CU 0x%x (%s: %s)" % (
                            path, cu_off, type(e).__name__, e))
                    try:
                        info = dw.inline_info(cu, ts)
                        files = cu.files
                        for t, (die, chain) in info.items():
                            inl[t] = (cu, die, chain, files)
                    except Exception as e:
                        self._warn("%s: cannot read DIEs of CU 0x%x (%s: %s)" % (
                            path, cu_off, type(e).__name__, e))
                    prog.step()

            for o in offsets:
                fname, ln = lines.get(o, (None, None))
                func = names.get(o)
                frames = []
                entry = inl.get(o)
                if entry is not None:
                    cu, die, chain, files = entry
                    if func is None and die is not None:
                        func = dw.die_name(die)
                    if chain:
                        loc = (fname, ln)
                        for i in range(len(chain) - 1, -1, -1):
                            origin, oform, cfile, cline = chain[i]
                            iname = dw.die_name(origin, oform) if origin is not None else None
                            frames.append((iname, loc[0], loc[1], True))
                            cf = files.path(cfile) if files is not None else None
                            loc = (cf, cline or None)
                        frames.append((func, loc[0], loc[1], False))
                if not frames:
                    frames = [(func, fname, ln, False)]
                mod.results[o] = frames
                mod.dirty = True
        finally:
            prog.close()

    # ---- disk cache --------------------------------------------------------------------------

    def _load_cache(self, mod: _Module):
        p = mod.cache_path
        if p is None or not p.is_file():
            return
        try:
            with open(p, "r", encoding="utf-8") as f:
                data = json.load(f)
            if data.get("sig") != mod.sig:
                return
            res = mod.results
            for k, frames in data.get("frames", {}).items():
                res[int(k)] = [(fn, fl, ln, bool(inl)) for fn, fl, ln, inl in frames]
        except Exception:
            mod.results.clear()

    def _save_cache(self, mod: _Module):
        p = mod.cache_path
        if p is None or not mod.dirty:
            return
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            data = {
                "sig": mod.sig,
                "frames": {str(o): [list(f) for f in frames] for o, frames in mod.results.items()},
            }
            tmp = p.with_name(p.name + ".%d.tmp" % os.getpid())
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, separators=(",", ":"))
            os.replace(tmp, p)
            mod.dirty = False
        except Exception as e:
            self._warn("cannot write symbol cache %s (%s)" % (p, e))


def _under(root: str, path: str) -> str:
    return os.path.join(root, str(path).lstrip("/"))
