"""Folded stacks: one line per stack, `root;caller;...;leaf bytes`, the bytes live at the moment.

The input of Brendan Gregg's flamegraph.pl, and a format speedscope and the Perfetto UI
import. Frame names are report's labels; a name cannot break the format: ';' inside a name
becomes a fullwidth semicolon (U+FF1B) and line breaks and other control characters a space.
Lines come sorted by bytes, largest first; their numbers add up to the total at the moment.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .view import View

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def escape(name: str) -> str:
    return _CONTROL.sub(" ", name.replace(";", "\uff1b")).strip() or "?"


def lines(view: View) -> list[tuple[str, int]]:
    """(folded stack, bytes), largest first; stacks with the same names are merged."""
    stacks = view.live_stacks()
    view.prepare(stacks)
    merged: dict[str, int] = {}
    for (ti, leaf), (_count, nbytes) in stacks.items():
        if nbytes <= 0:
            continue
        key = ";".join(escape(n) for n in view.names(ti, leaf))
        merged[key] = merged.get(key, 0) + nbytes
    return sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))


def write(view: View, path: Path) -> dict[str, int]:
    out = lines(view)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for key, nbytes in out:
            f.write("%s %d\n" % (key, nbytes))
    return {"stacks": len(out), "bytes": sum(b for _, b in out)}
