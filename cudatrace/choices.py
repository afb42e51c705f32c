"""The words the command line offers and the floors below it honour, written once: the command
line's click choices and the code that acts on them both read them from here (a leaf, so that
the command line loads without the analysis)."""

from __future__ import annotations

# `report --by`: how sites are grouped (analyze/sites/stacks.py, group_sites)
GROUPINGS = ("site", "api", "library", "process", "rank")

# `--on-exceed`: what the shim does with an allocation over budget (CUDATRACE_ON_EXCEED,
# native/shim/util.c; its default is settings.def's)
ON_EXCEED = ("fail", "warn", "abort")

# `--on-fence-error`: what the shim does when fencing was asked for and cannot be set up
# (CUDATRACE_ON_FENCE_ERROR, native/shim/budget.c; its default is settings.def's)
ON_FENCE_ERROR = ("refuse", "warn")
