"""Sizes and times as people write and read them: format_bytes, parse_size, parse_time.

A leaf: imports nothing from cudatrace, so every floor can use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from .errors import CudatraceError

SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}

NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_SIZE_RE = re.compile(r"^\s*(" + NUMBER + r")\s*([A-Za-z]*)\s*$")
_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|ms|us|m|min)?\s*$")
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0}


class UnitError(CudatraceError, ValueError):
    """A size or number that cannot be read; the message says why."""


def format_bytes(n: float) -> str:
    """'17 B', '1.00 KiB', '512.0 MiB', '1.50 GiB': binary units, 2 decimals below 10, else 1."""
    n = int(n)
    if n < 0:
        return "-" + format_bytes(-n)
    if n < 1024:
        return f"{n} B"
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    v, i = n / 1024.0, 0
    while v >= 1024.0 and i < len(units) - 1:
        v /= 1024.0
        i += 1
    s = f"{v:.2f}" if v < 10 else f"{v:.1f}"
    if float(s) >= 1024.0 and i < len(units) - 1:  # rounding reached the next unit
        return f"1.00 {units[i + 1]}"
    return f"{s} {units[i]}"


def positive_number(text: str, what: str) -> Fraction:
    """text as an exact number above zero; UnitError naming `what` otherwise."""
    try:
        v = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise UnitError(f"{what}: '{text}' is not a number") from None
    if v < 0:
        raise UnitError(f"{what}: must be positive, not {text}")
    if v == 0:
        raise UnitError(f"{what}: must be more than zero")
    return v


def parse_size(text: str) -> int:
    """Bytes of a size such as '8GiB', '1.5G', '512MB', '1024'. K, M, G, T are the binary
    units (8G = 8 GiB); KB, MB, GB, TB the decimal ones. Raises UnitError."""
    if not isinstance(text, str) or not text.strip():
        raise UnitError("empty size")
    m = _SIZE_RE.match(text)
    if not m:
        raise UnitError(f"'{text.strip()}' is not a size")
    num, unit = m.group(1), m.group(2)
    mult = SIZE_UNITS.get(unit.lower())
    if mult is None:
        raise UnitError(f"'{text.strip()}': unknown unit '{unit}'")
    n = positive_number(num, f"size '{text.strip()}'") * mult
    if mult == 1 and n.denominator != 1:
        raise UnitError(f"size '{text.strip()}': a number of bytes must be whole")
    whole = int(n)  # floor: 0.3MiB is 314572 bytes
    if whole <= 0:
        raise UnitError(f"size '{text.strip()}' is less than a byte")
    if whole >= 1 << 64:
        raise UnitError(f"size '{text.strip()}' is too large")
    return whole


def parse_time(text: str) -> float:
    """'2.5s', '2.5', '1500ms', '1min' -> seconds. Raises UnitError. ('1m' is refused: in a
    size it means MiB, so as a time it would be read both ways.)"""
    m = _TIME_RE.match(text or "")
    if m and m.group(2) == "m":
        raise UnitError(
            f"{text!r} is ambiguous (m means MiB in sizes): write "
            f"{m.group(1)}min or a number of seconds"
        )
    if not m:
        raise UnitError(f"{text!r} is not a time (2.5s, 2.5, 1500ms)")
    return float(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]


def parse_moment(spec: str) -> str | float:
    """What --at takes: "peak", "end", or seconds since the start ('2.5s', '2.5', '1500ms').
    Raises UnitError (a ValueError)."""
    s = (spec or "peak").strip().lower()
    if s in ("peak", "end"):
        return s
    try:
        return parse_time(spec)
    except UnitError as e:
        if "ambiguous" in str(e):
            raise UnitError(str(e)) from None
        raise UnitError(f"{spec!r} is not peak, end or a time (2.5s, 2.5, 1500ms)") from None


# ---- text that reaches a terminal ------------------------------------------------------------


def lossless(text: str) -> str:
    """text that every encoder takes: bytes that were not UTF-8 (held as lone surrogates by
    Python's surrogateescape, e.g. a program's argv) become \\xNN, any other lone surrogate
    \\uDNNN; valid text is returned as it is. The one rule for a trace's bytes on every
    binary path (JSON, HTML, protobuf)."""
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    out = []
    for c in text:
        if "\udc80" <= c <= "\udcff":
            out.append("\\x%02x" % (ord(c) - 0xDC00))
        elif "\ud800" <= c <= "\udfff":
            out.append("\\u%04x" % ord(c))
        else:
            out.append(c)
    return "".join(out)


def lossless_data(obj: object) -> Any:
    """lossless() over every string of JSON-able data (keys too)."""
    if isinstance(obj, str):
        return lossless(obj)
    if isinstance(obj, dict):
        return {lossless_data(k): lossless_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [lossless_data(x) for x in obj]
    return obj


def printable(text: str) -> str:
    """text with control characters escaped (\x1b, \n ...) and bytes that were not UTF-8
    shown as \\xNN: a trace's argv, exe, paths or symbols may hold anything, and must not drive
    the terminal. The one rule for a trace's bytes on every text path."""
    text = lossless(str(text))
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def shell_quote(argv: Iterable[object]) -> str:
    """argv as one line a shell would read back (control characters escaped)."""
    import shlex

    return " ".join(shlex.quote(printable(str(a))) for a in argv)


# two spaces or more between two words: a column's gap ("label   value", a table's row)
_GAP = re.compile(r"\S( {2,})\S")


def wrap_line(line: str, width: int) -> list[str]:
    """One line of prose wrapped at width (present/text.py wrap_prose): its pieces, or itself
    when it fits or is a table's row (two gaps of two spaces or more past its indentation).
    After one such gap ("label   value") the value's lines go on under the value; else under
    the line's indentation and two spaces. Words are never broken."""
    import textwrap

    if len(line) <= width:
        return [line]
    lead = len(line) - len(line.lstrip(" "))
    gaps = list(_GAP.finditer(line, lead))
    if len(gaps) > 1:
        return [line]
    hang = gaps[0].end(1) if gaps else lead + 2
    if hang > width // 2:
        hang = lead + 2
    return textwrap.wrap(
        line[lead:],
        width,
        initial_indent=" " * lead,
        subsequent_indent=" " * hang,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [line]
