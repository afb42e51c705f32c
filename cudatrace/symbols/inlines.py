"""Which function holds an address and which inlined calls lead to it: an index of a unit's
concrete subprograms, then a walk of only the scopes that hold wanted addresses."""

from __future__ import annotations

from typing import Any, cast

from .dies import (
    AT_ABSTRACT_ORIGIN,
    SCOPE_TAGS,
    TAG_INLINED_SUBROUTINE,
    TAG_MODULE,
    TAG_NAMESPACE,
    TAG_SUBPROGRAM,
    Abbrev,
    Reader,
    reader,
    walk,
)
from .dwarf import CU, DECODE_ERRORS, Dwarf, RangeIndex, find_range
from .dwarf_forms import uleb

_INDEX_TAGS = frozenset((TAG_SUBPROGRAM, TAG_NAMESPACE, TAG_MODULE))

# An inlined call: (abstract_origin reference, its form, call_file, call_line), each may be None.
Inlined = tuple[Any, ...]


def subprograms(dw: Dwarf, cu: CU) -> RangeIndex:
    """(starts, ends, die_offsets) of the concrete subprograms of a CU (top level and inside
    namespaces), sorted by start."""
    if cu.subprogs is not None:
        return cu.subprogs
    items = []

    def visit(ab: Abbrev, r: tuple[Any, ...], start: int, ctx: object) -> object:
        if ab.tag != TAG_SUBPROGRAM:
            return ctx  # a namespace: look inside
        if r[2] is not None or r[4] is not None:
            for lo, hi in dw.die_ranges(cu, ab, r) or ():
                if dw.valid_range(lo, hi):
                    items.append((lo, hi, start))
        return None

    d = dw.info
    code, p = uleb(d, cu.die_off)
    if code:
        ab = reader(cu, code)
        r = cast(Reader, ab.fn)(d, p, cu.off)  # reader() set it
        if ab.children:
            walk(d, cu, r[0], visit, _INDEX_TAGS, True)
    items.sort()
    cu.subprogs = ([i[0] for i in items], [i[1] for i in items], [i[2] for i in items])
    return cu.subprogs


def inline_info(dw: Dwarf, cu: CU, targets: list[int]) -> dict[int, tuple[int | None, list[Any]]]:
    """For each target: (subprogram DIE offset or None, [Inlined records, outermost first])."""
    sp = subprograms(dw, cu)
    by_sp: dict[int, list[int]] = {}
    out: dict[int, tuple[int | None, list[Any]]] = {}
    for t in targets:
        die = find_range(sp, t) if sp[0] else None
        if die is None:
            out[t] = (None, [])
        else:
            by_sp.setdefault(die, []).append(t)
    chains: dict[int, list[Inlined]] = {}

    def visit(ab: Abbrev, r: tuple[Any, ...], start: int, inner: list[int]) -> list[int] | None:
        # inner: the targets inside the enclosing scope
        rngs = dw.die_ranges(cu, ab, r)
        tag = ab.tag
        if rngs is None:
            inside = inner if tag != TAG_INLINED_SUBROUTINE else None
        elif len(rngs) == 1:
            lo, hi = rngs[0]
            inside = [t for t in inner if lo <= t < hi]
        else:
            inside = [t for t in inner if any(lo <= t < hi for lo, hi in rngs)]
        if not inside:
            return None
        if tag == TAG_INLINED_SUBROUTINE:
            rec = (r[5], ab.forms.get(AT_ABSTRACT_ORIGIN), r[6], r[7])
            for t in inside:
                chains[t].append(rec)
        return inside

    d = dw.info
    for die, ts in by_sp.items():
        for t in ts:
            chains[t] = []
        try:
            code, p = uleb(d, die)
            ab = reader(cu, code)
            r = cast(Reader, ab.fn)(d, p, cu.off)  # reader() set it
            if ab.children:
                walk(d, cu, r[0], visit, SCOPE_TAGS, ts)
        except DECODE_ERRORS:
            pass
        for t in ts:
            out[t] = (die, chains[t])
    return out


# An inlined call's code: (low offset, high offset, depth (1: inlined into a concrete
# function), the demangled name of the inlined function).
InlineRange = tuple[int, int, int, str]


def inline_ranges(dw: Dwarf, limit: int = 200_000) -> list[InlineRange]:
    """Every inlined call of the module's code, its ranges and depth: what the preload library
    cannot read (the launcher hands it over, record/hints.py). At most limit ranges."""
    out: list[InlineRange] = []

    def visit(ab: Abbrev, r: tuple[Any, ...], start: int, depth: int) -> int | None:
        if len(out) >= limit:
            return None
        if ab.tag != TAG_INLINED_SUBROUTINE:
            return depth  # a lexical block: look inside
        rngs = dw.die_ranges(cu, ab, r)
        name = dw.die_name(r[5], ab.forms.get(AT_ABSTRACT_ORIGIN)) if r[5] is not None else None
        if name and rngs:
            for lo, hi in rngs:
                if dw.valid_range(lo, hi):
                    out.append((lo, hi, depth + 1, name))
        return depth + 1

    d = dw.info
    for cu_off in dw.cu_offsets():
        if len(out) >= limit:
            break
        try:
            cu = dw.cu_at(cu_off)
            for die in dict.fromkeys(subprograms(dw, cu)[2]):  # once, whatever its ranges
                code, p = uleb(d, die)
                ab = reader(cu, code)
                r = cast(Reader, ab.fn)(d, p, cu.off)
                if ab.children:
                    walk(d, cu, r[0], visit, SCOPE_TAGS, 0)
        except DECODE_ERRORS:
            continue
    return out
