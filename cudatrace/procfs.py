"""What /proc tells about processes and memory: a process tree, its RSS, MemAvailable.

A leaf: imports nothing from cudatrace.
"""

from __future__ import annotations

import os


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


def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where it cannot be read)."""
    return meminfo("MemAvailable")


def meminfo(key: str) -> int | None:
    """One figure of /proc/meminfo (MemTotal, MemAvailable ...) in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_of(pids) -> int:
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
