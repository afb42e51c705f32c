"""The last budget denial of each running member, for `cudatrace status`.

While a traced command runs, the launcher appends every denial it attributed to the code that
asked (present/denials.py, docs/attribution.md) to denials.jsonl in the trace directory. A
member of a ledger is a traced process: its environment names that directory
(CUDATRACE_DIR), so `status` can say which code the budget last refused, not only how often."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import settings, tracedir
from ..record_types import DeniedGroup, Status

DENIALS_FILE = tracedir.DENIALS


def append_denials(trace_dir: Path, denials: list[DeniedGroup] | None) -> None:
    """Keep what the launcher printed about denials in denials.jsonl."""
    if not denials:
        return
    try:
        with open(Path(trace_dir) / DENIALS_FILE, "a") as f:
            for d in denials:
                f.write(json.dumps(dict(d, wall_time=time.time())) + "\n")
    except OSError:
        pass


def trace_dir_of(pid: int) -> Path | None:
    """The trace directory (settings.def DIR) of a running process of this user, or None."""
    try:
        env = Path("/proc/%d/environ" % pid).read_bytes()
    except OSError:
        return None
    key = settings.name("DIR").encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return Path(item[len(key) :].decode(errors="replace"))
    return None


def last_denial(trace_dir: Path, pid: int | None = None) -> DeniedGroup | None:
    """The last line of denials.jsonl (of pid when it has one), or None."""
    try:
        lines = (trace_dir / DENIALS_FILE).read_text().splitlines()
    except OSError:
        return None
    found: DeniedGroup | None = None
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if pid is None or d.get("pid") == pid or found is None:
            found = d
    return found


def attach_last_denials(st: Status) -> Status:
    """Add "last_denial" to every member of status_json's ledgers that was denied something
    and still runs (null when unknown)."""
    for s in st.get("ledgers", ()):
        for m in s.get("members", ()):
            denied = any(r.get("denials") for r in (m.get("devices") or {}).values())
            m["last_denial"] = None
            if denied and m.get("state") == "alive":
                d = trace_dir_of(m["pid"])
                if d is not None:
                    m["last_denial"] = last_denial(d, m["pid"])
    return st


TAIL_BYTES = 64 << 10  # what recent() reads of a denials.jsonl: its last lines


def recent(trace_dir: Path, last: int) -> list[DeniedGroup]:
    """The `last` denials kept in trace_dir's denials.jsonl, the latest first (read from its
    tail: a long run's file is never read whole); a line that is no denial is skipped."""
    try:
        with open(trace_dir / DENIALS_FILE, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    if len(data) == TAIL_BYTES and size > TAIL_BYTES:
        lines = lines[1:]  # the first may be cut
    out: list[DeniedGroup] = []
    for line in reversed(lines):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("pid"), int):
            out.append(d)  # type: ignore[arg-type]
            if len(out) >= last:
                break
    return out
