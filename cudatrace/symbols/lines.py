"""Line programs (.debug_line, DWARF 2-5): headers, file tables, and the (file, line) of
addresses, found by scanning sequences with regular expressions and decoding only those that
can hold a wanted address."""

from __future__ import annotations

import bisect
import os
import re
import struct
import sys
from collections.abc import Sequence
from typing import Any, Literal

from .dwarf import CU, Dwarf
from .dwarf_forms import (
    FORM_INDIRECT,
    FORM_STRING,
    FORM_UDATA,
    DwarfError,
    cstr,
    read_form,
    sleb,
    uleb,
)

_INF = float("inf")


class LineHeader:
    __slots__ = (
        "version",
        "end",
        "program",
        "min_inst",
        "line_base",
        "line_range",
        "opcode_base",
        "std_lens",
        "dirs_raw",
        "files_raw",
    )
    version: int
    end: int
    program: int
    min_inst: int
    line_base: int
    line_range: int
    opcode_base: int
    std_lens: list[int]
    dirs_raw: list[dict[Any, Any]]
    files_raw: list[dict[Any, Any]]


def line_header(dw: Dwarf, cu: CU) -> LineHeader:
    """Parse the line-program header at the CU's DW_AT_stmt_list (DWARF 2-5)."""
    d = dw.line
    h = LineHeader()
    if cu.stmt_list is None:
        raise DwarfError("the unit has no line table (DW_AT_stmt_list)")
    length, p, osz = dw.initial_length(d, cu.stmt_list)
    h.end = min(p + length, len(d))
    version = h.version = dw.uint(d, p, 2)
    p += 2
    if not 2 <= version <= 5:
        raise DwarfError(f"unsupported line table version {version}")
    if version >= 5:
        p += 2  # address_size, segment_selector_size
    hlen = dw.uint(d, p, osz)
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
    h.std_lens = list(d[p : p + h.opcode_base - 1])
    p += max(0, h.opcode_base - 1)
    h.files_raw = []
    if version >= 5:
        h.dirs_raw, p = _lnct_entries(cu, d, p)
        h.files_raw, p = _lnct_entries(cu, d, p)
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
            di, q = uleb(d, e + 1)
            entry[2] = (FORM_UDATA, di)
            _mtime, q = uleb(d, q)
            _size, p = uleb(d, q)
            h.files_raw.append(entry)
    return h


def _lnct_entries(cu: CU, d: bytes, p: int) -> tuple[list[dict[Any, Any]], int]:
    """DWARF 5 directory or file entries: [{content type: (form, value)}]."""
    nfmt = d[p]
    p += 1
    fmt = []
    for _ in range(nfmt):
        ct, p = uleb(d, p)
        form, p = uleb(d, p)
        fmt.append((ct, form))
    count, p = uleb(d, p)
    out = []
    for _ in range(count):
        entry = {}
        for ct, form in fmt:
            v, p = read_form(form, d, p, 0, cu.ctx)
            if form == FORM_INDIRECT:
                form, v = v
            entry[ct] = (form, v)
        out.append(entry)
    return out, p


class FileTable:
    """File index -> full path for one CU, resolved on first use, numbered per DWARF version
    (1-based up to DWARF 4, 0-based in DWARF 5)."""

    def __init__(self, dw: Dwarf, cu: CU, h: LineHeader):
        self.dw = dw
        self.cu = cu
        self.h = h
        self.cache: dict[int, str | None] = {}

    def path(self, index: int | None) -> str | None:
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

    def _str(self, fv: tuple[int, Any] | None) -> str | None:
        if fv is None:
            return None
        form, v = fv
        if form == FORM_STRING:
            try:
                return cstr(self.dw.line, v)
            except (ValueError, IndexError):
                return None
        return self.dw.attr_str(self.cu, form, v)

    def _resolve(self, index: int) -> str | None:
        h, cu = self.h, self.cu
        comp_dir = cu.comp_dir or ""
        v5 = h.version >= 5
        i = index if v5 else index - 1
        if not 0 <= i < len(h.files_raw):
            return None
        e = h.files_raw[i]
        name = self._str(e.get(1))
        if name is None:
            return None
        di = e.get(2, (FORM_UDATA, 0))[1] or 0
        if v5:
            dname = self._str(h.dirs_raw[di].get(1)) if di < len(h.dirs_raw) else None
        elif di == 0:
            dname = comp_dir
        else:
            dname = self._str(h.dirs_raw[di - 1].get(1)) if di - 1 < len(h.dirs_raw) else None
        path = os.path.join(dname or "", name)
        if not os.path.isabs(path) and comp_dir:
            path = os.path.join(comp_dir, path)
        return path


def lines_for(dw: Dwarf, cu: CU, targets: list[int]) -> dict[int, tuple[int, int]]:
    """For each target in this CU, the (file index, line) of the last line-table row at or
    below it within a sequence that extends past it; sets cu.files.

    Two passes: _scan_sequences finds every sequence's byte range and start address at C
    speed; only sequences that can hold a target are then decoded, from their start to
    their last target. Sequences of one CU do not overlap, so a sequence starting at A
    ends at or before the next sequence start above A: that bound decides which targets a
    sequence can hold, without trusting .debug_aranges to match sequences."""
    if cu.stmt_list is None or not dw.line:
        return {}
    d = dw.line
    h = line_header(dw, cu)
    res: dict[int, tuple[int, int]] = {}
    args = (
        h.min_inst,
        h.line_base,
        h.line_range,
        h.opcode_base,
        h.std_lens,
        targets,
        res,
        dw.zero_invalid,
        dw.E,
    )
    scan = _scan_sequences(d, h.program, h.end, h.opcode_base, h.std_lens, dw.E, cu.asz)
    if scan is None:
        _decode_rows(d, h.program, h.end, *args)
    else:
        seqs, new_files = scan
        for pos, di in new_files:  # DW_LNE_define_file (DWARF <= 4)
            h.files_raw.append({1: (FORM_STRING, pos), 2: (FORM_UDATA, di)})
        zero_invalid = dw.zero_invalid
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
    cu.files = FileTable(dw, cu, h)
    return res


_SKIP_RX_CACHE: dict[tuple[Any, ...], re.Pattern[bytes]] = {}
_LINE_TABLES: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _skip_regex(ob: int, std_lens: Sequence[int], extended: bool = True) -> re.Pattern[bytes]:
    """A regular expression matching any run of line-program opcodes other than
    DW_LNE_end_sequence and the rarer extended opcodes, for this header's opcode_base and operand
    counts: skipping a sequence with it runs in C and is exact (a tokenizer, not a byte-pattern
    search)."""
    key = (ob, tuple(std_lens), extended)
    rx = _SKIP_RX_CACHE.get(key)
    if rx is None:
        uleb_rx = rb"[\x80-\xff]*[\x00-\x7f]"
        single = [bytes([op]) for op in range(ob, 256)]
        by_nargs: dict[int, list[Any]] = {}
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
        alts = [
            b"[" + b"".join(re.escape(c) for c in ops) + b"]" + uleb_rx * n
            for n, ops in sorted(by_nargs.items())
        ]
        alts.append(b"[" + b"".join(re.escape(c) for c in single) + b"]+")
        alts += fixed
        # DW_LNE_set_discriminator (extended opcode 4, ULEB operand of 1-3 bytes): gcc emits it
        # often; other extended opcodes stop the match and are handled by the caller.
        if extended:
            alts += [
                rb"\x00\x02\x04[\x00-\x7f]",
                rb"\x00\x03\x04[\x80-\xff][\x00-\x7f]",
                rb"\x00\x04\x04[\x80-\xff]{2}[\x00-\x7f]",
            ]
        rx = re.compile(b"(?:" + b"|".join(alts) + b")*", re.S)
        _SKIP_RX_CACHE[key] = rx
    return rx


_SEQ_RX_CACHE: dict[tuple[Any, ...], re.Pattern[bytes]] = {}
# The tokenization never needs backtracking; Python 3.11+ can be told so (twice as fast).
_POSSESSIVE_STAR = b"*+" if sys.version_info >= (3, 11) else b"*"


def _sequence_regex(ob: int, std_lens: Sequence[int], asz: int) -> re.Pattern[bytes]:
    """Matches one whole sequence made of ordinary opcodes, set_discriminator and set_address,
    ending with DW_LNE_end_sequence; group 1 is the operand of a leading set_address."""
    key = (ob, tuple(std_lens), asz)
    rx = _SEQ_RX_CACHE.get(key)
    if rx is None:
        body = _skip_regex(ob, std_lens).pattern[3:-2]  # the alternatives inside (?:...)*
        plain = _skip_regex(ob, std_lens, False).pattern  # without extended opcodes
        setaddr = re.escape(bytes([0, asz + 1, 2]))
        rx = re.compile(
            plain
            + rb"(?:"
            + setaddr
            + rb"([\x00-\xff]{%d}))?" % asz
            + rb"(?:"
            + body
            + rb"|"
            + setaddr
            + rb"[\x00-\xff]{%d})" % asz
            + _POSSESSIVE_STAR
            + rb"\x00\x01\x01",
            re.S,
        )
        _SEQ_RX_CACHE[key] = rx
    return rx


def _scan_sequences(
    d: bytes, p: int, end: int, ob: int, std_lens: Sequence[int], E: str, asz: int
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]] | None:
    """First pass over a line program, in C through regular expressions: the byte range and
    start address of every sequence, and the DW_LNE_define_file entries. Returns (sequences,
    define_files) with sequences as [(start address, byte start, byte end)], or None when the
    program does not tokenize (then the caller decodes it all)."""
    seq_match = _sequence_regex(ob, std_lens, asz).match
    match = _skip_regex(ob, std_lens).match
    order: Literal["little", "big"] = "little" if E == "<" else "big"
    seqs = []
    files: list[tuple[int, int]] = []
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
            skipped = match(d, p, end)  # the pattern matches an empty run too
            p = skipped.end() if skipped is not None else p
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
                ln, q = uleb(d, p + 1)
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
                    start = int.from_bytes(d[q + 1 : p], order)
            elif sub == 3:  # define_file
                try:
                    e = d.index(0, q + 1)
                    files.append((q + 1, uleb(d, e + 1)[0]))
                except (ValueError, IndexError):
                    pass
    return seqs, files


def _special_tables(
    ob: int, line_base: int, line_range: int, min_inst: int
) -> tuple[list[Any], list[Any]]:
    """(address advance, line advance) of each special opcode, cached per header shape."""
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
    return tables


def _skip_ulebs(d: bytes, p: int, n: int) -> int:
    """The position after n ULEB128 numbers from p."""
    for _ in range(n):
        while d[p] >= 0x80:
            p += 1
        p += 1
    return p


def _decode_rows(
    d: bytes,
    p: int,
    end: int,
    min_inst: int,
    line_base: int,
    line_range: int,
    ob: int,
    std_lens: Sequence[int],
    targets: Sequence[int],
    res: dict[Any, Any],
    zero_invalid: bool,
    E: str,
    bend: float = _INF,
) -> None:
    """Run line-program opcodes over [p, end) (one or more sequences), streaming: no row table
    is built. Rows are matched against the sorted targets as addresses increase: a target gets
    the (file, line) of the last row at or below it in a sequence that extends past it. Stops
    early once the next target is >= bend (the caller knows the sequence ends before bend)."""
    ADV, LADV = _special_tables(ob, line_base, line_range, min_inst)
    const_add = ADV[255]
    ntargets = len(targets)
    bisect_left = bisect.bisect_left
    u16 = struct.Struct(E + "H").unpack_from
    order: Literal["little", "big"] = "little" if E == "<" else "big"
    INF = _INF
    address = 0
    file = 1
    line = 1
    pf = 1
    pl = 1
    k = 0
    nt: float = -1  # next target; -1: at the start of a sequence, before any row
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
                ln, p = uleb(d, p - 1)
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
                    v, p = sleb(d, p)
                    line += v
            continue
        elif op == 2:  # advance_pc
            b = d[p]
            if b < 0x80:
                p += 1
                address += b * min_inst
            else:
                v, p = uleb(d, p)
                address += v * min_inst
            continue
        elif op == 4:  # set_file
            b = d[p]
            if b < 0x80:
                p += 1
                file = b
            else:
                file, p = uleb(d, p)
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
            p = _skip_ulebs(d, p, std_lens[op - 1] if op - 1 < len(std_lens) else 0)
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
