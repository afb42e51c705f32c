"""The live screen of `cudatrace top` (curses, from the standard library): present/top.py's
lines redrawn whenever a new snapshot comes (every `interval` seconds) or a key is pressed.

Snapshots are taken in a thread of their own (`gather`, record/top.py through the command), so
that a key is answered at once even while a trace is being read; the screen draws the latest
snapshot with the view the keys chose. `q` (or Ctrl-C) quits; the terminal is given back as it
was whatever ends the loop.
"""

from __future__ import annotations

import curses
import threading
from collections.abc import Callable

from ..record_types import TopSnapshot
from .top import HELP, View, render

TICK_MS = 100  # how long a wait for a key lasts before the screen looks for a new snapshot


class _Feed:
    """The latest snapshot (or why none could be taken), refreshed in a thread."""

    def __init__(self, gather: Callable[[], TopSnapshot], interval: float) -> None:
        self.gather = gather
        self.interval = interval
        self.snap: TopSnapshot | None = None
        self.error: str | None = None
        self.count = 0  # snapshots taken: the screen redraws when it moves
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cudatrace-top", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.snap, self.error = self.gather(), None
            except Exception as e:  # shown on the screen; the next reading may do better
                self.error = f"cannot read the box: {e}"
            self.count += 1
            self.stop.wait(self.interval)


def run_screen(gather: Callable[[], TopSnapshot], view: View, interval: float) -> None:
    """The screen until `q` or Ctrl-C."""
    feed = _Feed(gather, interval)
    feed.start()
    try:
        curses.wrapper(_loop, feed, view)
    except KeyboardInterrupt:
        pass
    finally:
        feed.stop.set()


def _loop(scr: curses.window, feed: _Feed, view: View) -> None:
    try:
        curses.curs_set(0)
    except curses.error:
        pass  # a terminal without an invisible cursor
    scr.timeout(TICK_MS)
    drawn = -1
    dirty = True
    while True:
        if feed.count != drawn or dirty:
            drawn = feed.count
            _draw(scr, feed, view)
            dirty = False
        ch = scr.getch()
        if ch == -1:
            continue
        if ch in (ord("q"), ord("Q")):
            return
        if ch == curses.KEY_RESIZE:
            dirty = True
            continue
        key = {curses.KEY_RIGHT: "d", curses.KEY_LEFT: "D"}.get(ch)
        if key is None and 0 <= ch < 256:
            key = chr(ch)
        if key is not None:
            view = view.key(key, feed.snap)
            dirty = True


def _draw(scr: curses.window, feed: _Feed, view: View) -> None:
    height, width = scr.getmaxyx()
    lines = render(feed.snap, view, width - 1, height - 1)
    foot = feed.error or HELP
    scr.erase()
    for y, line in enumerate(lines):
        bold = bool(line) and not line.startswith(" ")
        _put(scr, y, line, width, curses.A_BOLD if bold else curses.A_NORMAL)
    _put(scr, height - 1, foot, width, curses.A_REVERSE)
    scr.refresh()


def _put(scr: curses.window, y: int, text: str, width: int, attr: int) -> None:
    try:
        scr.addnstr(y, 0, text, max(0, width - 1), attr)
    except curses.error:
        pass  # the last cell of the screen, or a screen smaller than a line
