"""How the long-running commands (metrics, node, webhook, dra-plugin) stop: on SIGINT and on
SIGTERM, whatever disposition they inherited. A shell starts a background job with SIGINT
ignored, an ignored signal stays ignored across exec, and Python then installs no
KeyboardInterrupt: `cudatrace metrics &` followed by `kill -INT` never stopped."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within it, SIGINT and SIGTERM raise KeyboardInterrupt in the main thread (the server's
    own cleanup then runs); the handlers before are put back after."""
    old = {s: signal.signal(s, _stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
