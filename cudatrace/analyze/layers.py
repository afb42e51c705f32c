"""Allocator layers, recognized from the call graph of the allocation stacks (docs/attribution.md).

Programs allocate through their own layers (tensor -> backend -> device); the innermost frame
of every stack is then the allocator, and the code that asked for the memory is further up.
This module finds the layers from the stacks alone, never from names:

* a *client* of a function g is a caller c of g (c != g) that reaches allocation only through
  g: every allocation stack holding c has g below c;
* g is a *layer* when it has at least MIN_CLIENTS (2) clients, or matches a `--fold` pattern;
* in one stack, the fold runs from the innermost frame up to the last layer of the first
  chain of layers: everything below the first layer folds with it (its implementation, the
  innermost helper often has a single caller), then upwards layer after layer, through
  *private* frames (whose only caller is the frame above) when a layer of the same module
  follows them;
* the frame above the fold is the site (the code that asked); the folded frames are its `via`.

Functions are compared by identity (module basename and demangled name; module and offset for
a frame that could not be symbolized), recursion (a function calling itself) is not a caller,
and frames are whatever the symbolizer gave (inlined frames included).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Sequence

MIN_CLIENTS = 2


class CallGraph:
    """Stacks (function identities, innermost first) -> layers. Add stacks, then ask."""

    def __init__(self, min_clients: int = MIN_CLIENTS):
        self.min_clients = min_clients
        self._stacks: set[tuple] = set()
        self._layers: set | None = None
        self._callers: dict[Hashable, set] = {}
        self.version = 0

    def add(self, stacks: Iterable[Sequence[Hashable]]) -> None:
        n = len(self._stacks)
        for s in stacks:
            if s:
                self._stacks.add(tuple(s))
        if len(self._stacks) != n:
            self._layers = None
            self.version += 1

    def _compute(self) -> None:
        callers: dict[Hashable, set] = {}
        below: dict[Hashable, set] = {}  # functions below c in every stack holding c
        for s in self._stacks:
            first: dict[Hashable, int] = {}
            for i, f in enumerate(s):
                first.setdefault(f, i)
                if i + 1 < len(s) and s[i + 1] != f:
                    callers.setdefault(f, set()).add(s[i + 1])
            for f, i in first.items():
                cur = below.get(f)
                if cur is None:
                    below[f] = set(s[:i])
                elif cur:
                    below[f] = {g for g in cur if first.get(g, i) < i}
        layers = set()
        for g, cs in callers.items():
            if len(cs) < self.min_clients:
                continue
            clients = sum(1 for c in cs if g in below.get(c, ()))
            if clients >= self.min_clients:
                layers.add(g)
        self._callers = callers
        self._layers = layers

    @property
    def layers(self) -> set:
        if self._layers is None:
            self._compute()
        return self._layers

    def callers(self, f: Hashable) -> set:
        if self._layers is None:
            self._compute()
        return self._callers.get(f, set())

    def is_private(self, f: Hashable, caller: Hashable) -> bool:
        """f's only caller (recursion aside) is `caller`."""
        cs = self.callers(f)
        return not cs or cs == {caller}

    def cut(self, stack: Sequence[Hashable], forced: Callable[[int], bool] | None = None) -> int:
        """How many frames of the stack (innermost first) fold into the allocator: 0 when no
        layer is in it. forced(i): frame i is a layer by --fold."""
        layers = self.layers
        n = len(stack)

        def is_layer(i: int) -> bool:
            return stack[i] in layers or (forced is not None and forced(i))

        first = next((i for i in range(n) if is_layer(i)), None)
        if first is None:
            return 0
        top = first
        i = first + 1
        while i < n:
            if is_layer(i):
                top = i
                i += 1
                continue
            # private frames between two layers fold with them
            j = i
            while (
                j < n and not is_layer(j) and j + 1 < n and self.is_private(stack[j], stack[j + 1])
            ):
                j += 1
            if j < n and is_layer(j) and j > i and _one_module(stack, i - 1, j):
                top = j
                i = j + 1
                continue
            break
        return top + 1


def _module(f: Hashable):
    """The module of a function identity (module basename, name or offset); None if unknown."""
    return f[0] if isinstance(f, tuple) and f else None


def _one_module(stack: Sequence[Hashable], lo: int, hi: int) -> bool:
    """Frames lo..hi lie in one module (or modules are unknown): private frames fold between
    two layers only inside a library, never across its API (a Python binding between ATen's
    dispatcher and the interpreter is where the program's code is)."""
    mods = {_module(stack[k]) for k in range(lo, hi + 1)}
    return len(mods) == 1


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern]:
    """--fold REGEX values, compiled; raises ValueError naming a bad one."""
    out = []
    for p in patterns or ():
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise ValueError(f"--fold {p!r}: {e}") from None
    return out
