"""How DWARF encodes values: LEB128, strings, and the one table of attribute forms (DW_FORM_*)
from which both the generic decoder here and the generated DIE readers (dies.py) work."""

from __future__ import annotations

import struct
from typing import Any

from ..errors import CudatraceError

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

REL_REF_FORMS = frozenset((FORM_REF1, FORM_REF2, FORM_REF4, FORM_REF8, FORM_REF_UDATA))
ADDRX_FORMS = frozenset(
    (FORM_ADDRX, FORM_ADDRX1, FORM_ADDRX2, FORM_ADDRX3, FORM_ADDRX4, FORM_GNU_ADDR_INDEX)
)
STRX_FORMS = frozenset(
    (FORM_STRX, FORM_STRX1, FORM_STRX2, FORM_STRX3, FORM_STRX4, FORM_GNU_STR_INDEX)
)
CONST_FORMS = frozenset(
    (FORM_DATA1, FORM_DATA2, FORM_DATA4, FORM_DATA8, FORM_UDATA, FORM_SDATA, FORM_IMPLICIT_CONST)
)

# Encodings. A number is a fixed size in bytes (an unsigned integer; 16 bytes come back as
# bytes); ADDR, OFFSET and REF_ADDR are fixed sizes that depend on the unit header.
ADDR = "addr"  # address size
OFFSET = "offset"  # 4 (32-bit DWARF) or 8 (64-bit DWARF)
REF_ADDR = "ref_addr"  # the address size up to DWARF 2, the offset size after
ULEB = "uleb"
SLEB = "sleb"
CSTRING = "cstring"  # inline NUL-terminated string; the value is its position
PRESENT = "present"  # no bytes, value 1
IMPLICIT = "implicit"  # no bytes, value stored in the abbreviation
BLOCK1 = "block1"  # 1-byte length, then the bytes; no value
BLOCK2 = "block2"
BLOCK4 = "block4"
BLOCK = "block"  # ULEB128 length
INDIRECT = "indirect"  # ULEB128 form, then a value of that form

FORMS: dict[int, int | str] = {
    FORM_ADDR: ADDR,
    FORM_BLOCK2: BLOCK2,
    FORM_BLOCK4: BLOCK4,
    FORM_DATA2: 2,
    FORM_DATA4: 4,
    FORM_DATA8: 8,
    FORM_STRING: CSTRING,
    FORM_BLOCK: BLOCK,
    FORM_BLOCK1: BLOCK1,
    FORM_DATA1: 1,
    FORM_FLAG: 1,
    FORM_SDATA: SLEB,
    FORM_STRP: OFFSET,
    FORM_UDATA: ULEB,
    FORM_REF_ADDR: REF_ADDR,
    FORM_REF1: 1,
    FORM_REF2: 2,
    FORM_REF4: 4,
    FORM_REF8: 8,
    FORM_REF_UDATA: ULEB,
    FORM_INDIRECT: INDIRECT,
    FORM_SEC_OFFSET: OFFSET,
    FORM_EXPRLOC: BLOCK,
    FORM_FLAG_PRESENT: PRESENT,
    FORM_STRX: ULEB,
    FORM_ADDRX: ULEB,
    FORM_REF_SUP4: 4,
    FORM_STRP_SUP: OFFSET,
    FORM_DATA16: 16,
    FORM_LINE_STRP: OFFSET,
    FORM_REF_SIG8: 8,
    FORM_IMPLICIT_CONST: IMPLICIT,
    FORM_LOCLISTX: ULEB,
    FORM_RNGLISTX: ULEB,
    FORM_REF_SUP8: 8,
    FORM_STRX1: 1,
    FORM_STRX2: 2,
    FORM_STRX3: 3,
    FORM_STRX4: 4,
    FORM_ADDRX1: 1,
    FORM_ADDRX2: 2,
    FORM_ADDRX3: 3,
    FORM_ADDRX4: 4,
    FORM_GNU_ADDR_INDEX: ULEB,
    FORM_GNU_STR_INDEX: ULEB,
    FORM_GNU_REF_ALT: OFFSET,
    FORM_GNU_STRP_ALT: OFFSET,
}

# A unit's context: (byte order "<" or ">", address size, offset size, DWARF version).
Ctx = tuple[str, int, int, int]


class DwarfError(CudatraceError):
    """DWARF this reader cannot read."""


def encoding(form: int, ctx: Ctx) -> int | str:
    """The form's encoding with the unit-dependent sizes resolved to numbers."""
    enc = FORMS.get(form)
    if enc is None:
        raise DwarfError(f"unknown DW_FORM 0x{form:x}")
    if enc == ADDR:
        return ctx[1]
    if enc == OFFSET:
        return ctx[2]
    if enc == REF_ADDR:
        return ctx[1] if ctx[3] <= 2 else ctx[2]
    return enc


def fixed_size(form: int, ctx: Ctx) -> int | None:
    """Bytes taken by a value of this form, None when it varies (or the form is unknown)."""
    try:
        enc = encoding(form, ctx)
    except DwarfError:
        return None
    if enc.__class__ is int:
        return enc
    if enc == PRESENT or enc == IMPLICIT:
        return 0
    return None


def uleb(d: bytes, p: int) -> tuple[int, int]:
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


def sleb(d: bytes, p: int) -> tuple[int, int]:
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


def cstr(d: bytes, p: int) -> str:
    e = d.index(0, p)
    return bytes(d[p:e]).decode("utf-8", "replace")


_UNPACK = {
    (e, n): struct.Struct(e + f).unpack_from
    for e in "<>"
    for n, f in ((2, "H"), (4, "I"), (8, "Q"))
}


def uint(d: bytes, p: int, size: int, endian: str) -> int:
    """An unsigned integer of size bytes at p."""
    if size == 1:
        return d[p]
    unpack = _UNPACK.get((endian, size))
    if unpack is not None:
        result: int = unpack(d, p)[0]
        return result
    return int.from_bytes(d[p : p + size], "little" if endian == "<" else "big")


def read_form(form: int, d: bytes, p: int, ic: int, ctx: Ctx) -> tuple[Any, int]:
    """Decode one value: (value, new position). Values: integers (references as stored, relative
    ones not yet made absolute), the position for DW_FORM_string, bytes for 16-byte data, None
    for blocks; DW_FORM_indirect gives ((form, value), position)."""
    enc = encoding(form, ctx)
    if enc.__class__ is int:
        if enc == 16:
            return bytes(d[p : p + 16]), p + 16
        return uint(d, p, enc, ctx[0]), p + enc
    if enc == ULEB:
        return uleb(d, p)
    if enc == SLEB:
        return sleb(d, p)
    if enc == CSTRING:
        return p, d.index(0, p) + 1
    if enc == PRESENT:
        return 1, p
    if enc == IMPLICIT:
        return ic, p
    if enc == BLOCK1:
        return None, p + 1 + d[p]
    if enc == BLOCK2:
        return None, p + 2 + uint(d, p, 2, ctx[0])
    if enc == BLOCK4:
        return None, p + 4 + uint(d, p, 4, ctx[0])
    if enc == BLOCK:
        n, p = uleb(d, p)
        return None, p + n
    form, p = uleb(d, p)  # INDIRECT
    v, p = read_form(form, d, p, ic, ctx)
    return (form, v), p
