"""One file's DWARF: its sections, unit headers and top DIEs, attribute values (strings,
addresses, range lists), the compilation unit holding an address, and names of DIEs."""

from __future__ import annotations

import bisect
import struct
from collections.abc import Container, Sequence
from typing import Any

from .demangle import demangle
from .dies import (
    AT_ABSTRACT_ORIGIN,
    AT_ADDR_BASE,
    AT_COMP_DIR,
    AT_GNU_ADDR_BASE,
    AT_GNU_RANGES_BASE,
    AT_HIGH_PC,
    AT_LINKAGE_NAME,
    AT_LOW_PC,
    AT_MIPS_LINKAGE_NAME,
    AT_NAME,
    AT_RANGES,
    AT_RNGLISTS_BASE,
    AT_SPECIFICATION,
    AT_STMT_LIST,
    AT_STR_OFFSETS_BASE,
    TAG_CLASS_TYPE,
    TAG_NAMESPACE,
    TAG_PARTIAL_UNIT,
    TAG_STRUCTURE_TYPE,
    TAG_SUBPROGRAM,
    TAG_UNION_TYPE,
    Abbrev,
    AbbrevTable,
    reader,
    walk,
)
from .dwarf_forms import (
    ADDRX_FORMS,
    CONST_FORMS,
    FORM_ADDRX,
    FORM_GNU_REF_ALT,
    FORM_GNU_STRP_ALT,
    FORM_INDIRECT,
    FORM_LINE_STRP,
    FORM_REF_SIG8,
    FORM_REF_SUP4,
    FORM_REF_SUP8,
    FORM_RNGLISTX,
    FORM_STRING,
    FORM_STRP,
    FORM_STRP_SUP,
    REL_REF_FORMS,
    STRX_FORMS,
    Ctx,
    DwarfError,
    cstr,
    read_form,
    uint,
    uleb,
)
from .elf import Elf

# what a function's name is qualified by (Dwarf.scope_prefix), and the functions
_SCOPE_TAGS = frozenset(
    (TAG_NAMESPACE, TAG_CLASS_TYPE, TAG_STRUCTURE_TYPE, TAG_UNION_TYPE, TAG_SUBPROGRAM)
)

# What a damaged unit raises while being decoded.
DECODE_ERRORS = (IndexError, KeyError, struct.error, ValueError, DwarfError)

RangeIndex = tuple[list[int], list[int], list[int]]
# .debug_aranges: (starts, ends, cu_offsets) sorted, and the CUs they cover
Aranges = tuple[list[int], list[int], list[int], set[int]]


class CU:
    """One compilation unit: its header, its top DIE's attributes, and what is decoded lazily
    (files: lines.FileTable, subprogs: inlines' sorted arrays, top_ranges: pairs or a pending
    ("ranges", form, value) reference, scopes: Dwarf.scope_prefix's map)."""

    __slots__ = (
        "off",
        "end",
        "die_off",
        "version",
        "unit_type",
        "asz",
        "osz",
        "abbrev_off",
        "abbrevs",
        "ctx",
        "low",
        "comp_dir",
        "name",
        "stmt_list",
        "str_off_base",
        "addr_base",
        "rnglists_base",
        "files",
        "subprogs",
        "top_ranges",
        "scopes",
        "tag",
    )
    off: int
    end: int
    die_off: int
    version: int
    unit_type: int
    asz: int
    osz: int
    abbrev_off: int
    abbrevs: AbbrevTable
    ctx: Ctx
    low: int
    comp_dir: str | None
    name: str | None
    stmt_list: int | None
    str_off_base: int
    addr_base: int
    rnglists_base: int
    files: Any
    subprogs: tuple[list[int], list[int], list[int]] | None
    top_ranges: list[tuple[int, int]] | tuple[Any, ...] | None
    scopes: dict[int, str] | None
    tag: int


def find_range(index: tuple[Any, ...], t: int) -> int | None:
    """The value of a range holding t in (starts, ends, values, ...) sorted by start, looking back
    over at most 8 ranges starting at or below t."""
    starts, ends, vals = index[0], index[1], index[2]
    i = bisect.bisect_right(starts, t) - 1
    k = 0
    while i >= 0 and k < 8:
        if starts[i] <= t < ends[i]:
            result: int | None = vals[i]
            return result
        i -= 1
        k += 1
    return None


class Dwarf:
    def __init__(self, elf: Elf, alt: Dwarf | None = None):
        self.elf = elf
        self.E = elf.endian
        self.alt = alt
        self.zero_invalid = not elf.zero_is_code
        self.info = elf.section_data(".debug_info") or b""
        self.abbrev = elf.section_data(".debug_abbrev") or b""
        self.line = elf.section_data(".debug_line") or b""
        self._lazy: dict[str, bytes] = {}
        self.cus: dict[int, CU] = {}
        self._cu_offsets: list[int] | None = None
        self._abbrev_cache: dict[tuple[Any, ...], AbbrevTable] = {}
        self._abbrev_objs: dict[tuple[Any, ...], Abbrev] = {}  # (declaration bytes, ctx) -> Abbrev
        self._name_cache: dict[int, str | None] = {}
        self._aranges: Aranges | None = None
        self._cu_range_index: RangeIndex | None = None

    def sec(self, name: str) -> bytes:
        d = self._lazy.get(name)
        if d is None:
            d = self.elf.section_data(name) or b""
            self._lazy[name] = d
        return d

    def uint(self, d: bytes, p: int, size: int) -> int:
        return uint(d, p, size, self.E)

    def initial_length(self, d: bytes, p: int) -> tuple[int, int, int]:
        """(unit length, position after it, offset size) of a unit header at p."""
        length = uint(d, p, 4, self.E)
        if length == 0xFFFFFFFF:
            return uint(d, p + 4, 8, self.E), p + 12, 8
        return length, p + 4, 4

    def cu_offsets(self) -> list[int]:
        if self._cu_offsets is None:
            offs = []
            d = self.info
            p = 0
            n = len(d)
            while p + 11 <= n:
                length, q, _osz = self.initial_length(d, p)
                if length == 0:
                    break
                offs.append(p)
                p = q + length
            self._cu_offsets = offs
        return self._cu_offsets

    def cu_at(self, off: int) -> CU:
        cu = self.cus.get(off)
        if cu is not None:
            return cu
        d = self.info
        cu = CU()
        cu.off = off
        length, p, osz = self.initial_length(d, off)
        cu.end = p + length
        version = self.uint(d, p, 2)
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
            raise DwarfError(f"unsupported DWARF version {version} at 0x{off:x}")
        cu.version = version
        cu.osz = osz
        cu.die_off = p
        cu.ctx = (self.E, cu.asz, osz, version)
        cu.abbrevs = self._abbrev_table(cu.abbrev_off, cu.ctx)
        cu.files = None
        cu.subprogs = None
        cu.top_ranges = None
        cu.scopes = None
        cu.low = 0
        cu.comp_dir = None
        cu.name = None
        cu.stmt_list = None
        cu.str_off_base = 8 if osz == 4 else 16
        cu.addr_base = 8 if osz == 4 else 16
        cu.rnglists_base = 0
        cu.tag = 0
        try:
            self._read_top_die(cu, p)
        except (IndexError, KeyError, struct.error, ValueError):
            pass
        self.cus[off] = cu
        return cu

    def _read_top_die(self, cu: CU, p: int) -> None:
        code, q = uleb(self.info, p)
        if not code:
            return
        ab = cu.abbrevs[code]
        cu.tag = ab.tag
        attrs, _ = self.read_attrs(cu, ab, q)
        if AT_STR_OFFSETS_BASE in attrs:
            cu.str_off_base = attrs[AT_STR_OFFSETS_BASE][1]
        for a in (AT_ADDR_BASE, AT_GNU_ADDR_BASE):
            if a in attrs:
                cu.addr_base = attrs[a][1]
        for a in (AT_RNGLISTS_BASE, AT_GNU_RANGES_BASE):
            if a in attrs:
                cu.rnglists_base = attrs[a][1]
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
            hi = cu.low + hv if hf in CONST_FORMS else self.attr_addr(cu, hf, hv)
            cu.top_ranges = [(cu.low, hi)]

    def top_ranges(self, cu: CU) -> list[tuple[int, int]]:
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

    def cu_containing(self, die_off: int) -> CU:
        offs = self.cu_offsets()
        i = bisect.bisect_right(offs, die_off) - 1
        if i < 0:
            raise DwarfError(f"DIE offset 0x{die_off:x} outside .debug_info")
        return self.cu_at(offs[i])

    def _abbrev_table(self, off: int, ctx: Ctx) -> AbbrevTable:
        key = (off, ctx)
        tab = self._abbrev_cache.get(key)
        if tab is None:
            pos = AbbrevTable.locate(self.abbrev, off)
            tab = self._abbrev_cache[key] = AbbrevTable(self.abbrev, ctx, pos, self._abbrev_objs)
        return tab

    def read_attrs(self, cu: CU, ab: Abbrev, p: int) -> tuple[dict[int, tuple[int, Any]], int]:
        """All attributes of a DIE, decoded generically: {attr: (form, value)}, first wins."""
        attrs: dict[int, tuple[int, Any]] = {}
        d = self.info
        ctx = cu.ctx
        for attr, form, ic in ab.specs:
            v, p = read_form(form, d, p, ic, ctx)
            if form == FORM_INDIRECT:
                form, v = v
            if form in REL_REF_FORMS:
                v += cu.off
            attrs.setdefault(attr, (form, v))
        return attrs, p

    def attr_str(self, cu: CU, form: int, v: Any) -> str | None:
        try:
            if form == FORM_STRING:
                return cstr(self.info, v)
            if form == FORM_STRP:
                return cstr(self.sec(".debug_str"), v)
            if form == FORM_LINE_STRP:
                return cstr(self.sec(".debug_line_str"), v)
            if form in STRX_FORMS:
                so = self.sec(".debug_str_offsets")
                off = self.uint(so, cu.str_off_base + v * cu.osz, cu.osz)
                return cstr(self.sec(".debug_str"), off)
            if form in (FORM_GNU_STRP_ALT, FORM_STRP_SUP):
                if self.alt is not None:
                    return cstr(self.alt.sec(".debug_str"), v)
                return None
        except (ValueError, IndexError, struct.error):
            return None
        return None

    def attr_addr(self, cu: CU, form: int, v: int) -> int:
        if form in ADDRX_FORMS:
            return self.uint(self.sec(".debug_addr"), cu.addr_base + v * cu.asz, cu.asz)
        return v

    def rangelist(self, cu: CU, v: int, form: int) -> list[tuple[int, int]]:
        """Decode DW_AT_ranges (DWARF 2-4 .debug_ranges, DWARF 5 .debug_rnglists)."""
        if cu.version < 5 and form != FORM_RNGLISTX:
            return self._ranges_v4(cu, v)
        out = []
        asz = cu.asz
        base = cu.low
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
            if kind == 1:  # base_addressx
                i, p = uleb(d, p)
                base = self.attr_addr(cu, FORM_ADDRX, i)
            elif kind == 2:  # startx_endx
                i, p = uleb(d, p)
                j, p = uleb(d, p)
                out.append((self.attr_addr(cu, FORM_ADDRX, i), self.attr_addr(cu, FORM_ADDRX, j)))
            elif kind == 3:  # startx_length
                i, p = uleb(d, p)
                ln, p = uleb(d, p)
                a = self.attr_addr(cu, FORM_ADDRX, i)
                out.append((a, a + ln))
            elif kind == 4:  # offset_pair
                a, p = uleb(d, p)
                b, p = uleb(d, p)
                out.append((base + a, base + b))
            elif kind == 5:  # base_address
                base = self.uint(d, p, asz)
                p += asz
            elif kind == 6:  # start_end
                a = self.uint(d, p, asz)
                b = self.uint(d, p + asz, asz)
                p += 2 * asz
                out.append((a, b))
            elif kind == 7:  # start_length
                a = self.uint(d, p, asz)
                p += asz
                ln, p = uleb(d, p)
                out.append((a, a + ln))
            else:
                break
        return [(a, b) for a, b in out if b > a]

    def _ranges_v4(self, cu: CU, p: int) -> list[tuple[int, int]]:
        out = []
        asz = cu.asz
        base = cu.low
        d = self.sec(".debug_ranges")
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

    def die_ranges(self, cu: CU, ab: Abbrev, r: tuple[Any, ...]) -> list[tuple[int, int]] | None:
        """Address ranges of a DIE from its reader record; None when it has no low_pc/ranges."""
        if r[4] is not None:
            return self.rangelist(cu, r[4], ab.forms[AT_RANGES])
        low = r[2]
        if low is None:
            return None
        if ab.forms[AT_LOW_PC] in ADDRX_FORMS:
            low = self.attr_addr(cu, ab.forms[AT_LOW_PC], low)
        high = r[3]
        if high is None:
            return [(low, low + 1)]
        if ab.high_const:
            return [(low, low + high)]
        return [(low, self.attr_addr(cu, ab.forms[AT_HIGH_PC], high))]

    def valid_range(self, lo: int, hi: int) -> bool:
        """False for empty ranges and for ranges at 0 (discarded COMDAT copies) unless the file
        has code at 0."""
        return hi > lo and not (lo == 0 and self.zero_invalid)

    def aranges(self) -> Aranges:
        """Sorted (starts, ends, cu_offsets) from .debug_aranges, plus the set of covered CUs."""
        if self._aranges is None:
            d = self.sec(".debug_aranges")
            items: list[tuple[int, int, int]] = []
            covered: set[int] = set()
            p = 0
            n = len(d)
            while p + 12 <= n:
                length, q, osz = self.initial_length(d, p)
                end = q + length
                if length == 0:
                    break
                try:
                    cu_off = self.uint(d, q + 2, osz)
                    covered.add(cu_off)
                    self._arange_set(d, p, q + 2 + osz, end, cu_off, items)
                except (IndexError, struct.error):
                    pass
                p = end
            items.sort()
            self._aranges = (
                [i[0] for i in items],
                [i[1] for i in items],
                [i[2] for i in items],
                covered,
            )
        return self._aranges

    def _arange_set(
        self, d: bytes, unit: int, q: int, end: int, cu_off: int, items: list[Any]
    ) -> None:
        asz = d[q]
        seg = d[q + 1]
        q += 2
        tuple_size = 2 * asz + seg
        rem = (q - unit) % tuple_size
        if rem:
            q += tuple_size - rem
        if asz == 8 and seg == 0:
            stop = end - (end - q) % 16
            for a, ln in struct.iter_unpack(self.E + "QQ", d[q:stop]):
                if a == 0 and ln == 0:
                    break
                if self.valid_range(a, a + ln):
                    items.append((a, a + ln, cu_off))
            return
        while q + tuple_size <= end:
            q += seg
            a = self.uint(d, q, asz)
            ln = self.uint(d, q + asz, asz)
            q += 2 * asz
            if a == 0 and ln == 0:
                break
            if self.valid_range(a, a + ln):
                items.append((a, a + ln, cu_off))

    def cu_range_index(self, exclude: Container[int]) -> RangeIndex:
        """Ranges of the CUs not covered by .debug_aranges, from their top DIEs."""
        if self._cu_range_index is None:
            items = []
            for off in self.cu_offsets():
                if off in exclude:
                    continue
                try:
                    cu = self.cu_at(off)
                except DECODE_ERRORS:
                    continue
                if cu.unit_type not in (1, 4) or cu.tag == TAG_PARTIAL_UNIT:
                    continue
                for lo, hi in self.top_ranges(cu):
                    if self.valid_range(lo, hi):
                        items.append((lo, hi, off))
            items.sort()
            self._cu_range_index = (
                [i[0] for i in items],
                [i[1] for i in items],
                [i[2] for i in items],
            )
        return self._cu_range_index

    def group_by_cu(self, targets: Sequence[int]) -> dict[int, list[int]]:
        ar = self.aranges()
        groups: dict[int, list[int]] = {}
        missing = []
        for t in targets:
            c = find_range(ar, t) if ar[0] else None
            if c is None:
                missing.append(t)
            else:
                groups.setdefault(c, []).append(t)
        if missing and len(ar[3]) < len(self.cu_offsets()):
            idx = self.cu_range_index(ar[3])
            for t in missing:
                c = find_range(idx, t)
                if c is not None:
                    groups.setdefault(c, []).append(t)
        return groups

    def die_name(self, ref: int, form: int | None = None, depth: int = 0) -> str | None:
        """Demangled linkage name (or plain name) of the DIE at .debug_info offset ref, following
        DW_AT_abstract_origin / DW_AT_specification."""
        if form == FORM_GNU_REF_ALT or form == FORM_REF_SUP4 or form == FORM_REF_SUP8:
            return self.alt.die_name(ref, None, depth) if self.alt is not None else None
        if form == FORM_REF_SIG8:
            return None
        if ref in self._name_cache:
            return self._name_cache[ref]
        try:
            name = self._die_name(ref, depth)
        except DECODE_ERRORS:
            name = None
        self._name_cache[ref] = name
        return name

    def _die_name(self, ref: int, depth: int) -> str | None:
        cu = self.cu_containing(ref)
        code, p = uleb(self.info, ref)
        if not code:
            return None
        attrs, _ = self.read_attrs(cu, cu.abbrevs[code], p)
        link = attrs.get(AT_LINKAGE_NAME) or attrs.get(AT_MIPS_LINKAGE_NAME)
        if link is not None:
            s = self.attr_str(cu, *link)
            if s:
                return demangle(s)
        name = None
        if depth < 8:
            for a in (AT_SPECIFICATION, AT_ABSTRACT_ORIGIN):
                if a in attrs:
                    name = self.die_name(attrs[a][1], attrs[a][0], depth + 1)
                    if name:
                        return name
        if name is None and AT_NAME in attrs:
            bare = self.attr_str(cu, *attrs[AT_NAME])
            return self.scope_prefix(cu, ref) + bare if bare else bare
        return name

    def scope_prefix(self, cu: CU, ref: int) -> str:
        """ "a::(anonymous namespace)::C::" for a function declared inside namespaces and classes
        of cu, "" at the top: a name without a linkage name (a function of internal linkage
        that GCC inlined everywhere) is then written as the demangler writes the others."""
        if cu.scopes is None:
            cu.scopes = {}
            self._find_scopes(cu, cu.scopes)
        return cu.scopes.get(ref, "")

    def _find_scopes(self, cu: CU, out: dict[int, str]) -> None:
        d = self.info

        def visit(ab: Abbrev, r: tuple[Any, ...], start: int, ctx: str) -> str | None:
            if ab.tag == TAG_SUBPROGRAM:
                if ctx:
                    out[start] = ctx
                return None  # what a function declares inside it is not looked for
            _code, p = uleb(d, start)
            attrs, _ = self.read_attrs(cu, ab, p)
            name = self.attr_str(cu, *attrs[AT_NAME]) if AT_NAME in attrs else None
            if not name:
                return ctx + "(anonymous namespace)::" if ab.tag == TAG_NAMESPACE else ctx
            return ctx + name + "::"

        code, p = uleb(d, cu.die_off)
        if not code:
            return
        ab = reader(cu, code)
        assert ab.fn is not None  # reader() sets it
        r = ab.fn(d, p, cu.off)
        if ab.children:
            walk(d, cu, r[0], visit, _SCOPE_TAGS, "")
