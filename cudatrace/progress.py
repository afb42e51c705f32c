"""Progress on a terminal: click's progress bar on stderr, for work that runs past a second.

bar(label, total) gives an object with a settable `total`, `step(n)` and `close()` (the
interface Symbolizer(progress=...) takes as a factory). Nothing is drawn when stderr is not a
terminal, nor for work that ends within `Bar.delay` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import click


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:
        return False


class Bar:
    delay = 1.0

    def __init__(self, label: str, total: int, stream: TextIO | None = None):
        self.label = label
        self._total = max(0, int(total))
        self.done = 0
        self.t0 = time.monotonic()
        self.stream = stream if stream is not None else sys.stderr
        self._bar: Any = None  # click's ProgressBar once drawing starts
        self._failed = False

    @property
    def total(self) -> int:
        return self._total

    @total.setter
    def total(self, value: int) -> None:
        self._total = max(0, int(value))
        if self._bar is not None:
            self._bar.length = max(self._total, 1)

    def step(self, n: int = 1) -> None:
        self.done += n
        if self._failed:
            return
        try:
            if self._bar is None:
                if time.monotonic() - self.t0 < self.delay or not self._total:
                    return
                label = self.label if len(self.label) <= 40 else "..." + self.label[-37:]
                self._bar = click.progressbar(
                    length=max(self._total, 1),
                    label=label,
                    file=self.stream,
                    show_pos=True,
                    show_percent=True,
                    width=30,
                )
                self._bar.__enter__()
                self._bar.update(min(self.done, self._total))
            else:
                self._bar.update(n)
        except Exception:  # a closed or odd stream: stop drawing
            self._failed = True

    def close(self) -> None:
        if self._bar is not None:
            try:
                self._bar.update(max(0, self._bar.length - self._bar.pos))
                self._bar.__exit__(None, None, None)
            except Exception:
                pass
            self._bar = None


class NoBar:
    """Counts and draws nothing."""

    def __init__(self, label: str = "", total: int = 0):
        self.total = total

    def step(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def bar(label: str, total: int) -> Bar | NoBar:
    """A Bar on a terminal, else a NoBar."""
    return Bar(label, total) if stderr_is_tty() else NoBar(label, total)
