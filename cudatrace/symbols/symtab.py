"""Function symbols of ELF symbol tables as sorted parallel arrays, searched with bisect; names
are decoded and demangled on lookup."""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable

from .demangle import demangle
from .elf import Elf

STT_NOTYPE, STT_FUNC, STT_GNU_IFUNC = 0, 2, 10
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2


class SymTab:
    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []  # start + size (== start for size 0)
        self.name_offs: list[int] = []
        self.tab_ids: list[int] = []
        self.tabs: list[bytes] = []
        self.max_size = 0
        self._names: dict[int, str] = {}

    @staticmethod
    def build(tables: Iterable[tuple[Elf, str]]) -> SymTab:
        """tables: list of (Elf, symtab section name); entries merged into one index."""
        st = SymTab()
        cand: list[tuple[int, int, int, int, int]] = []  # value, rank, size, name, table
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
                rank = (
                    (size > 0) * 8
                    + (typ != STT_NOTYPE) * 4
                    + (bind == STB_GLOBAL) * 2
                    + (bind == STB_WEAK)
                )
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
        st.starts, st.ends, st.name_offs, st.tab_ids, st.max_size = (
            starts,
            ends,
            offs,
            ids,
            max_size,
        )
        return st

    def __len__(self) -> int:
        return len(self.starts)

    def name(self, i: int) -> str:
        s = self._names.get(i)
        if s is None:
            tab = self.tabs[self.tab_ids[i]]
            off = self.name_offs[i]
            end = tab.find(b"\0", off)
            s = tab[off : end if end >= 0 else len(tab)].decode("utf-8", "replace")
            at = s.find("@@")  # default symbol version ("localeconv@@GLIBC_2.2.5")
            if at > 0:
                s = s[:at]
            s = demangle(s)
            self._names[i] = s
        return s

    def lookup(self, off: int) -> str | None:
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
