"""A helper thread of the launcher: a daemon that runs its loop until asked to stop (the exit
watcher, the sealer)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod


class Worker(ABC):
    """Runs `_run` in a daemon thread named `name`; the loop waits on `_stop`, which `_halt`
    sets before it waits for the thread to end."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @abstractmethod
    def _run(self) -> None:
        """The loop: until self._stop is set."""

    def start(self) -> None:
        self._thread.start()

    def _halt(self) -> None:
        """Ask the loop to stop and wait for it (a thread never started is left as it is)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
