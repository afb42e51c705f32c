"""How allocations are attributed to call sites: the one record every report takes (the
analysis builds its stacks and sites from it; the command line's options build it:
commands/options.py, attribution_options)."""

from __future__ import annotations

from typing import NamedTuple

VIEWS = ("hybrid", "python", "native")


class Attribution(NamedTuple):
    """Every command that reports (report, diff, export, sweep) means the same by these."""

    depth: int = 1  # frames that make a site
    fold: bool = True  # fold the allocator layers (analyze/sites/layers.py)
    fold_patterns: tuple[str, ...] = ()  # --fold REGEX: more layers, '!REGEX': never a layer
    full_names: bool = False  # whole demangled signatures
    view: str = "hybrid"  # a VIEWS word: Python frames and native ones, or one kind alone
    show_cuda_frames: bool = False  # keep the CUDA libraries' own frames (no folding at all)
