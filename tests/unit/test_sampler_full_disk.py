"""The launcher's files and the sampler under hostile conditions (no simulated driver
needed)."""

from __future__ import annotations

import threading
from pathlib import Path

from cudatrace.record.sampler import Sampler


def test_sampler_on_a_full_disk_prints_no_traceback(monkeypatch):
    hooked = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args))
    s = Sampler(0, Path("/dev/full"), 0.01)  # every write fails with ENOSPC
    s.start()
    s.join(timeout=5)
    s.stop()
    assert not hooked, [str(h.exc_value) for h in hooked]
    d = s.describe()
    assert d["error"]
