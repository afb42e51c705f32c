"""Small text pieces every text report shares: sizes, seconds, counts, shares, tables."""

from __future__ import annotations

import os
import shutil
from typing import IO

from ..analyze.sites.names import fit, on_terminal
from ..units import format_bytes, wrap_line


def size_text(n: int | None) -> str:
    """format_bytes, or '-' for no figure."""
    return format_bytes(n) if n is not None else "-"


def secs_text(t: float | None) -> str:
    return f"{t:.3f} s" if t is not None else "-"


def end_label(processes: int) -> str:
    """What the run's end figure is: with several processes, each one's memory ended with it, so
    the figure is what was never freed, not what was live at one moment."""
    return "live at exit" if processes <= 1 else "never freed (each process's, at its end)"


def no_sample_while_live(run_seconds: float | None, interval_ms: float | None, peak: int) -> str:
    """Why no sample of the observed figures fell while traced memory was live, as it was: no
    traced memory at all, a run shorter than one sample interval, or allocations that came and
    went between samples."""
    if not peak:
        return "no traced device memory was live at any moment"
    if interval_ms and run_seconds is not None and run_seconds * 1000 < interval_ms:
        return (
            f"the run lasted {run_seconds * 1000:.0f} ms, less than one sample interval "
            f"({interval_ms:g} ms): no sample fell while its memory was live"
        )
    every = f", every {interval_ms:g} ms" if interval_ms else ""
    return (
        "no sample fell while traced memory was live (its allocations came and went between "
        f"samples{every})"
    )


def plural(n: int, what: str) -> str:
    """'1 allocation', '1,024 allocations'."""
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def ranges(ns: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8': numbers (ranks, devices) as runs, in order."""
    out, ns = [], sorted(ns)
    i = 0
    while i < len(ns):
        j = i
        while j + 1 < len(ns) and ns[j + 1] == ns[j] + 1:
            j += 1
        out.append(str(ns[i]) if i == j else "%d-%d" % (ns[i], ns[j]))
        i = j + 1
    return ", ".join(out)


def percent(x: float) -> str:
    """A share (0..1) as ' 12.5%'."""
    return f"{100.0 * x:5.1f}%"


def term_width() -> int:
    """Columns of the terminal ($COLUMNS, else the tty's, else 120); at least 60."""
    return max(60, shutil.get_terminal_size((120, 24)).columns)


def wrap_prose(text: str, width: int | None = None, terminal: bool | None = None) -> str:
    """text with its prose wrapped at the terminal's width (each line longer than width), on a
    terminal only (terminal None: whether stdout is one; in files and pipes a line stays
    whole, as labels do). A line is prose when, past its indentation, at most one gap of two
    spaces or more cuts it ("label   value": the value's lines go on under the value); a table's
    row (several gaps) is not wrapped: tables fit themselves (table). Words are never broken."""
    if terminal is None:
        terminal = on_terminal()
    if not terminal:
        return text
    width = width or term_width()
    return "\n".join(x for line in text.split("\n") for x in wrap_line(line, width))


def table(
    rows: list[list[str]], right: set[int], indent: str = "  ", width: int | None = None
) -> list[str]:
    """Rows of cells as aligned lines; columns in `right` are right-aligned. With width, the
    last column is cut (ending in '...') so that no line is wider: a table never wraps."""
    if not rows:
        return []
    if width:
        n = len(rows[0])
        before = len(indent) + sum(max(len(r[i]) for r in rows) + 2 for i in range(n - 1))
        room = max(16, width - before)
        rows = [r[:-1] + [fit(r[-1], room)] for r in rows]
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w[i]) if i in right else c.ljust(w[i]) for i, c in enumerate(r)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


# ANSI styles of the lines that carry a report's answer (terminals only: use_colour)
STYLES = {
    "title": "\033[1m",  # bold: the report's title, the peak
    "heading": "\033[1m",  # bold: a section's first line
    "top": "\033[1;36m",  # bold cyan: the site that held the most
    "dim": "\033[2m",  # faint: a site's route
    "warn": "\033[33m",  # yellow: memory never freed
    "alert": "\033[1;31m",  # bold red: failed or denied allocations, lost or truncated traces
}
RESET = "\033[0m"


def use_colour(stream: IO[str]) -> bool:
    """Colour for a terminal: only when `stream` is a tty, never when NO_COLOR is set (any
    value but empty, no-color.org) or TERM is dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def styled(line: str, style: str | None, colour: bool) -> str:
    """line in STYLES[style] when colour is on; as it is otherwise (or for an empty line)."""
    if not colour or not style or not line:
        return line
    return f"{STYLES[style]}{line}{RESET}"
