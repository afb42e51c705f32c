"""What /proc tells about processes and memory: a process tree, a parent, what a process has
mapped, its RSS, MemAvailable.

A leaf: imports nothing from cudatrace.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def tree_pids(root: int) -> list[int]:
    """root and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read().decode(errors="replace")
            ppid = int(s[s.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def parent_of(pid: int) -> int | None:
    """The parent of a running process, from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read().decode(errors="replace")
        return int(s[s.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def maps_name(part: str, pid: int | str = "self") -> bool:
    """Whether a file whose path holds `part` (e.g. 'libcuda.so') is mapped in a process."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return any(part.encode() in line for line in f)
    except OSError:
        return False


def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where it cannot be read)."""
    return meminfo_field("MemAvailable")


def meminfo_field(key: str) -> int | None:
    """One figure of /proc/meminfo (MemTotal, MemAvailable ...) in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def meminfo(keys: Iterable[str] = ("MemTotal", "MemFree", "MemAvailable")) -> dict[str, int]:
    """Fields of /proc/meminfo in bytes (those it has)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in keys:
                    out[k] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def pss_of(pids: Iterable[int]) -> int | None:
    """The summed proportional set size of the processes (/proc/<pid>/smaps_rollup): shared
    pages divided among their users, so a tree's figure does not count them twice. None where
    no process's figure can be read."""
    total, seen = 0, False
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        seen = True
                        break
        except (OSError, ValueError, IndexError):
            pass
    return total if seen else None


def rss_of(pids: Iterable[int]) -> int:
    """The summed resident set of the given processes, in bytes (gone ones count 0)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            pass
    return total
