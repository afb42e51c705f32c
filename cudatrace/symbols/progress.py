"""The symbolizer's default progress display: a bar on stderr, drawn only once the work has run
for more than a second. Symbolizer(progress=...) also takes any factory (label, total) -> object
with the same `total` attribute and `step()`/`close()` methods."""

from __future__ import annotations

import sys
import time
from typing import Protocol


class ProgressLike(Protocol):
    """What Symbolizer(progress=factory) expects factory(label, total) to return."""

    total: int

    def step(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


class Progress:
    delay = 1.0

    def __init__(self, label: str, total: int, enabled: bool = True):
        self.enabled = enabled and total > 0
        self.label = label
        self.total = total
        self.done = 0
        self.t0 = time.monotonic()
        self.last = 0.0
        self.shown = False

    def step(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.t0 < self.delay or (now - self.last < 0.1 and self.done < self.total):
            return
        self.last = now
        self._draw()

    def _draw(self) -> None:
        width = 30
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        filled = int(frac * width)
        bar = "#" * filled + "-" * (width - filled)
        label = self.label if len(self.label) <= 40 else "..." + self.label[-37:]
        try:
            sys.stderr.write(f"\r{label} [{bar}] {int(frac * 100):3d}% {self.done}/{self.total}")
            sys.stderr.flush()
        except Exception:
            self.enabled = False
            return
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.done = self.total
            self._draw()
            try:
                sys.stderr.write("\n")
                sys.stderr.flush()
            except Exception:
                pass
