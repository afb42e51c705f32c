"""Small text pieces every text report shares: sizes, seconds, counts, shares, tables."""

from __future__ import annotations

from ..units import format_bytes


def size_text(n: int | None) -> str:
    """format_bytes, or '-' for no figure."""
    return format_bytes(n) if n is not None else "-"


def secs_text(t: float | None) -> str:
    return f"{t:.3f} s" if t is not None else "-"


def plural(n: int, what: str) -> str:
    """'1 allocation', '1,024 allocations'."""
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def percent(x: float) -> str:
    """A share (0..1) as ' 12.5%'."""
    return f"{100.0 * x:5.1f}%"


def table(rows: list[list[str]], right: set[int], indent: str = "  ") -> list[str]:
    """Rows of cells as aligned lines; columns in `right` are right-aligned."""
    if not rows:
        return []
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w[i]) if i in right else c.ljust(w[i]) for i, c in enumerate(r)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out
