"""Debugging information entries: abbreviation tables, per-abbreviation DIE readers (generated
Python, straight-line code) and the one DIE walker."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any, Protocol

from .dwarf_forms import (
    ADDRX_FORMS,
    BLOCK,
    BLOCK1,
    BLOCK2,
    BLOCK4,
    CSTRING,
    FORM_ADDR,
    FORM_IMPLICIT_CONST,
    IMPLICIT,
    INDIRECT,
    PRESENT,
    REL_REF_FORMS,
    SLEB,
    ULEB,
    Ctx,
    DwarfError,
    encoding,
    fixed_size,
    read_form,
    sleb,
    uleb,
)

TAG_COMPILE_UNIT = 0x11
TAG_PARTIAL_UNIT = 0x3C
TAG_SKELETON_UNIT = 0x4A
TAG_SUBPROGRAM = 0x2E
TAG_INLINED_SUBROUTINE = 0x1D
TAG_LEXICAL_BLOCK = 0x0B
TAG_TRY_BLOCK = 0x32
TAG_CATCH_BLOCK = 0x25
TAG_NAMESPACE = 0x39
TAG_CLASS_TYPE = 0x02
TAG_STRUCTURE_TYPE = 0x13
TAG_UNION_TYPE = 0x17
TAG_MODULE = 0x1E
SCOPE_TAGS = frozenset((TAG_INLINED_SUBROUTINE, TAG_LEXICAL_BLOCK, TAG_TRY_BLOCK, TAG_CATCH_BLOCK))

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

# A DIE reader returns the tuple
#   (next_pos, sibling, low_pc, high_pc, ranges, abstract_origin, call_file, call_line)
# with None for attributes the DIE does not have; references are made absolute.
SLOTS = {
    AT_SIBLING: 1,
    AT_LOW_PC: 2,
    AT_HIGH_PC: 3,
    AT_RANGES: 4,
    AT_ABSTRACT_ORIGIN: 5,
    AT_CALL_FILE: 6,
    AT_CALL_LINE: 7,
}
NSLOTS = 8

# A reader is compiled for an abbreviation once this many DIEs of it were read by interpreting
# (compiling costs about as much as interpreting 50 DIEs).
COMPILE_AFTER = 50

Reader = Callable[[bytes, int, int], tuple[Any, ...]]
Emit = Callable[[str], None]  # adds a line to the generated reader


class Abbrev:
    __slots__ = (
        "code",
        "tag",
        "children",
        "specs",
        "forms",
        "fn",
        "high_const",
        "skip",
        "skip_walk",
    )

    def __init__(self, code: int, tag: int, children: bool, specs: tuple[Any, ...], ctx: Ctx):
        self.code = code
        self.tag = tag
        self.children = children
        self.specs = specs  # ((attr, form, implicit_const), ...)
        self.forms: dict[int, int] = {}
        for attr, form, _ic in specs:
            self.forms.setdefault(attr, form)
        self.fn: Reader | None = None
        hf = self.forms.get(AT_HIGH_PC)
        self.high_const = hf is not None and hf != FORM_ADDR and hf not in ADDRX_FORMS
        # Size of a childless DIE whose attributes all have fixed sizes: walks step over it
        # without decoding (skip_walk: only for tags that visiting walks never look into).
        self.skip: int | None = None
        if not children:
            size = 0
            for _attr, form, _ic in specs:
                fs = fixed_size(form, ctx)
                if fs is None:
                    break
                size += fs
            else:  # every form has a fixed size
                self.skip = size
        walked = tag in SCOPE_TAGS or tag == TAG_SUBPROGRAM
        self.skip_walk = None if walked else self.skip


# One abbreviation declaration: code (not 0), tag, children flag, (attribute, form) pairs with an
# SLEB128 after DW_FORM_implicit_const (0x21), then 0, 0. Matching is deterministic on well-formed
# input; tables are located with it and each declaration is decoded on first use.
ABBREV_ENTRY_RX = re.compile(
    rb"([\x80-\xff]*[\x01-\x7f]|[\x80-\xff]+\x00)"
    rb"[\x80-\xff]*[\x00-\x7f][\x00\x01]"
    rb"(?:(?!\x00\x00)[\x80-\xff]*[\x00-\x7f]"
    rb"(?:\x21[\x80-\xff]*[\x00-\x7f]|[\x80-\xff]*[\x00-\x7f]))*"
    rb"\x00\x00",
    re.S,
)


class AbbrevTable(dict[int, Any]):
    """Abbreviation code -> Abbrev, decoded lazily from the declaration positions."""

    def __init__(self, data: bytes, ctx: Ctx, positions: dict[Any, Any], shared: dict[Any, Any]):
        super().__init__()
        self.data = data
        self.ctx = ctx
        self.pos = positions
        self.shared = shared

    @staticmethod
    def locate(data: bytes, off: int) -> dict[int, tuple[int, int]]:
        """Code -> (start, end) of each declaration of the table at off."""
        pos: dict[int, tuple[int, int]] = {}
        p = off
        match = ABBREV_ENTRY_RX.match
        while True:
            m = match(data, p)
            if m is None:  # the table's terminating 0 (or damage)
                return pos
            code = data[p]
            if code >= 0x80:
                code = uleb(data, p)[0]
            p = m.end()
            pos.setdefault(code, (m.end(1), p))

    def __missing__(self, code: int) -> Abbrev:
        d = self.data
        start, end = self.pos[code]  # KeyError for an unknown code
        key = (d[start:end], self.ctx)
        ab = self.shared.get(key)
        if ab is not None:
            self[code] = ab
            result: Abbrev = ab
            return result
        p = start
        tag, p = uleb(d, p)
        children = d[p]
        p += 1
        specs = []
        while True:
            attr = d[p]
            if attr < 0x80:
                p += 1
            else:
                attr, p = uleb(d, p)
            form = d[p]
            if form < 0x80:
                p += 1
            else:
                form, p = uleb(d, p)
            ic = 0
            if form == FORM_IMPLICIT_CONST:
                ic, p = sleb(d, p)
            if attr == 0 and form == 0:
                break
            specs.append((attr, form, ic))
        ab = Abbrev(code, tag, bool(children), tuple(specs), self.ctx)
        self.shared[key] = ab
        self[code] = ab
        return ab


class Unit(Protocol):
    """What the readers and the walk read of a unit: dwarf.CU (which imports this module)."""

    off: int
    end: int
    abbrevs: AbbrevTable
    ctx: Ctx


_COMPILED: dict[tuple[Any, ...], Reader] = {}


_UFMT = {1: "d[p]", 2: "U16(d, p)[0]", 4: "U32(d, p)[0]", 8: "U64(d, p)[0]"}


def compile_reader(ab: Abbrev, ctx: Ctx) -> Reader:
    """Generate straight-line Python that steps over one DIE of this abbreviation and picks out
    the attributes in SLOTS (references made absolute for CU-relative forms)."""
    E = ctx[0]
    code = ["def reader(d, p, cu):"]
    out = ["None"] * NSLOTS
    n = 0

    def emit(s: str) -> None:
        code.append("    " + s)

    for attr, form, ic in ab.specs:
        slot = SLOTS.get(attr)
        var = None
        if slot is not None:
            var = f"v{n}"
            n += 1
        enc = encoding(form, ctx)
        if enc == INDIRECT:
            raise DwarfError("DW_FORM_indirect not supported")
        if enc.__class__ is int or enc == PRESENT or enc == IMPLICIT:
            _emit_fixed(emit, var, enc, ic, E)
        else:
            _emit_variable(emit, var, enc)
        if var is not None and slot is not None:  # set together
            if form in REL_REF_FORMS:
                emit(f"{var} += cu")
            if out[slot] == "None":
                out[slot] = var
    out[0] = "p"
    emit(f"return ({', '.join(out)})")
    ns: dict[Any, Any] = {  # the generated code's globals; exec adds its reader
        "U16": struct.Struct(E + "H").unpack_from,
        "U32": struct.Struct(E + "I").unpack_from,
        "U64": struct.Struct(E + "Q").unpack_from,
        "SLEB": sleb,
    }
    exec(compile("\n".join(code), f"<dwarf-abbrev-{ab.code}>", "exec"), ns)
    result: Callable[[bytes, int, int], tuple[Any, ...]] = ns["reader"]
    return result


def _emit_fixed(emit: Emit, var: str | None, enc: int | str, ic: int, E: str) -> None:
    """A form of fixed size (or none: present, implicit const): read into var if kept."""
    size = enc if enc.__class__ is int else 0
    if var is not None:
        if enc == IMPLICIT:
            emit(f"{var} = {ic}")
        elif enc == PRESENT:
            emit(f"{var} = 1")
        elif size == 3:
            if E == "<":
                emit(f"{var} = d[p] | d[p+1] << 8 | d[p+2] << 16")
            else:
                emit(f"{var} = d[p] << 16 | d[p+1] << 8 | d[p+2]")
        elif size in _UFMT:
            emit(f"{var} = {_UFMT[size]}")
        else:
            emit(f"{var} = None")
    if size:
        emit(f"p += {size}")


def _emit_uleb_into(emit: Emit, var: str) -> None:
    emit(f"{var} = d[p]; p += 1")
    emit(f"if {var} >= 0x80:")
    emit(f"    {var} &= 0x7f; s = 7")
    emit("    while True:")
    emit(f"        b = d[p]; p += 1; {var} |= (b & 0x7f) << s; s += 7")
    emit("        if b < 0x80: break")


def _emit_uleb_skip(emit: Emit) -> None:
    emit("while d[p] >= 0x80: p += 1")
    emit("p += 1")


def _emit_variable(emit: Emit, var: str | None, enc: int | str) -> None:
    """A form of variable size (LEB128, string, block): read into var if kept, step over."""
    if enc == ULEB:
        if var is not None:
            _emit_uleb_into(emit, var)
        else:
            _emit_uleb_skip(emit)
    elif enc == SLEB:
        if var is not None:
            emit(f"{var}, p = SLEB(d, p)")
        else:
            _emit_uleb_skip(emit)
    elif enc == CSTRING:
        if var is not None:
            emit(f"{var} = p")
        emit("p = d.index(0, p) + 1")
    elif enc == BLOCK1:
        emit("p += 1 + d[p]")
    elif enc == BLOCK2:
        emit(f"p += 2 + {_UFMT[2]}")
    elif enc == BLOCK4:
        emit(f"p += 4 + {_UFMT[4]}")
    elif enc == BLOCK:
        _emit_uleb_into(emit, "ln")
        emit("p += ln")


def _interpreting_reader(ab: Abbrev, ctx: Ctx, key: tuple[Any, ...]) -> Reader:
    specs = ab.specs
    slots = [SLOTS.get(attr) for attr, _f, _i in specs]
    calls = 0

    def reader(d: bytes, p: int, cuoff: int) -> tuple[Any, ...]:
        nonlocal calls
        calls += 1
        if calls > COMPILE_AFTER:
            fn = _COMPILED.get(key)
            if fn is None:
                fn = _COMPILED[key] = compile_reader(ab, ctx)
            ab.fn = fn
            return fn(d, p, cuoff)
        out: list[Any] = [None] * NSLOTS
        for (_attr, form, ic), slot in zip(specs, slots):
            v, p = read_form(form, d, p, ic, ctx)
            if slot is not None and out[slot] is None:
                if form in REL_REF_FORMS:
                    v += cuoff
                out[slot] = v
        out[0] = p
        return tuple(out)

    return reader


def reader(cu: Unit, code: int) -> Abbrev:
    """The abbreviation of code in cu's table, with its DIE reader: the compiled one when it
    exists, else an interpreting one that compiles once the abbreviation proves frequent."""
    ab = cu.abbrevs[code]
    if ab.fn is None:
        key = (ab.specs, cu.ctx)
        fn = _COMPILED.get(key)
        if fn is None:
            fn = _interpreting_reader(ab, cu.ctx, key)
        ab.fn = fn
    result: Abbrev = ab
    return result


def _reader_fn(cu: Unit, code: int) -> Reader:
    """The DIE reader of code in cu's table, made on first use."""
    fn = reader(cu, code).fn
    assert fn is not None  # reader() sets it
    return fn


# the context (last argument, and what a visit returns) is the visit's own: walk only passes it on
Visit = Callable[[Abbrev, tuple[Any, ...], int, Any], object]


def walk(
    d: bytes,
    cu: Unit,
    p: int,
    visit: Visit | None = None,
    tags: frozenset[Any] = frozenset(),
    ctx: object = None,
) -> int:
    """Walk the DIEs from p up to the 0 that closes their scope and return the position after
    it (or the end of the unit). visit(abbrev, record, die_offset, ctx) is called for DIEs whose
    tag is in tags (record: the reader's tuple); a DIE with children is entered when it returns
    a context other than None, which the visits of its children get. Other subtrees are skipped,
    through DW_AT_sibling when present. Childless fixed-size DIEs of tags other than subprograms
    and scopes are stepped over unread (Abbrev.skip_walk), so tags holds those tags or tags of
    DIEs with children. Without visit the walk only finds the end of the scope."""
    off = cu.off
    end = cu.end
    abbrevs = cu.abbrevs
    stack = [ctx]  # contexts of the entered scopes
    while p < end:
        start = p
        code = d[p]
        p += 1
        if code >= 0x80:
            b = d[p]
            if b < 0x80:
                code = (code & 0x7F) | (b << 7)
                p += 1
            else:
                code, p = uleb(d, p - 1)
        if code == 0:
            stack.pop()
            if not stack:
                return p
            ctx = stack[-1]
            continue
        ab = abbrevs[code]
        if visit is None:
            if ab.skip is not None:
                p += ab.skip
                continue
        elif ab.skip_walk is not None:
            p += ab.skip_walk
            continue
        fn = ab.fn or _reader_fn(cu, code)
        r = fn(d, p, off)
        if not ab.children:
            if visit is not None and ab.tag in tags:
                visit(ab, r, start, ctx)
            p = r[0]
            continue
        inner = None
        if visit is not None and ab.tag in tags:
            inner = visit(ab, r, start, ctx)
        if inner is not None:
            stack.append(inner)
            ctx = inner
            p = r[0]
        elif r[1] is not None and r[1] > p:
            p = r[1]
        elif visit is None:
            stack.append(None)
            p = r[0]
        else:
            p = walk(d, cu, r[0])
    return p
