"""Stopping a swept server: after a time, or once a URL answers and live memory settled."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .records import Ended


@dataclass
class StopRule:
    stop_after: float | None = None
    url: str | None = None
    settle: float = 2.0
    grace: float = 10.0
    url_timeout: float = 300.0

    @property
    def active(self) -> bool:
        return self.stop_after is not None or self.url is not None


def url_answers(url: str, timeout: float = 2.0) -> bool:
    """True once anything answers HTTP there (an error status too); no proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            r.read(1)
        return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def live_bytes(out: Path) -> int | None:
    """Traced bytes live now in a running trace directory (None if it cannot be read yet)."""
    from ..analyze.read.rundir import read_dir
    from ..analyze.replay.model import build

    try:
        td = read_dir(out)
        return build(td).end_bytes if td.traces else 0
    except Exception:
        return None


def _tree(pid: int) -> list[int]:
    from ..procfs import tree_pids

    try:
        return tree_pids(pid)
    except OSError:
        return [pid]


def _start_ticks(pid: int) -> int | None:
    """When pid started (/proc/PID/stat field 22), None when it is gone or a zombie: with the
    pid, it names one process, so a pid reused meanwhile is never signalled."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read().decode(errors="replace")
        fields = s[s.rindex(")") + 2 :].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


class Watcher(threading.Thread):
    """Stops one run by the rule; `info` says how (None: the command ended by itself)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], out: Path, rule: StopRule, done: threading.Event
    ) -> None:
        super().__init__(daemon=True, name="cudatrace-sweep-watcher")
        self.proc, self.out, self.rule, self.done = proc, out, rule, done
        self.info: Ended | None = None
        self.t0 = time.monotonic()
        # every process of the tree seen since the stop began (pid -> start time): a child that
        # ignores SIGINT outlives its parent, is re-parented away from the tree, and must still
        # get SIGTERM and SIGKILL
        self.seen: dict[int, int] = {}

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def run(self) -> None:
        r = self.rule
        if r.stop_after is not None:
            if not self.done.wait(r.stop_after):
                self.stop({"how": "stopped", "why": "time", "seconds": r.stop_after})
            return
        if r.url is None:
            return
        answered = None
        while not self.done.is_set():
            if url_answers(r.url):
                answered = self.elapsed()
                break
            if self.elapsed() >= r.url_timeout:
                self.stop({"how": "url_timeout", "url": r.url, "seconds": r.url_timeout})
                return
            self.done.wait(0.2)
        if answered is None:
            return
        last, since, settled = object(), time.monotonic(), False
        while not self.done.is_set():
            t = time.monotonic()
            v = live_bytes(self.out)
            took = time.monotonic() - t
            now = time.monotonic()
            if v != last or v is None:
                last, since = v, now
            elif now - since >= r.settle:
                settled = True
                break
            if self.elapsed() - answered >= max(r.url_timeout, r.settle):
                break
            self.done.wait(max(0.1, min(r.settle / 4, 1.0), 2 * took))
        if self.done.is_set():
            return
        self.stop(
            {
                "how": "stopped",
                "why": "url",
                "url": r.url,
                "answered_after": answered,
                "settle": r.settle,
                "settled": settled,
                "live_bytes": last if isinstance(last, int) else None,
            }
        )

    def _remember(self) -> None:
        if self.proc.returncode is None:
            for pid in _tree(self.proc.pid):
                t = _start_ticks(pid)
                if t is not None:
                    self.seen.setdefault(pid, t)

    def _alive(self) -> list[int]:
        """The processes of the tree still running (each the same process as when seen)."""
        return [pid for pid, t in self.seen.items() if _start_ticks(pid) == t]

    def _send(self, sig: signal.Signals) -> None:
        self._remember()
        for pid in self._alive():
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def _ended(self, grace: float) -> bool:
        """Wait up to grace for the command and every process of its tree to end."""
        deadline = time.monotonic() + grace
        while True:
            self._remember()
            if self.done.is_set() and not self._alive():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.done.wait(min(0.05, left))
            time.sleep(0.02 if self.done.is_set() else 0)

    def stop(self, info: Ended) -> None:
        info["after"] = self.elapsed()
        self.info = info
        for sig in (signal.SIGINT, signal.SIGTERM):
            info["signal"] = sig.name
            self._send(sig)
            if self._ended(self.rule.grace):
                return
        info["signal"] = "SIGKILL"
        if info["how"] == "stopped":
            info["how"] = "killed"
        self._send(signal.SIGKILL)


# ---- running ---------------------------------------------------------------------------------
