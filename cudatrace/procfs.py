"""What /proc tells about processes and memory: a process tree, a parent, what a process has
mapped, its RSS, MemAvailable; a process's pid namespace, start time, cgroup and the ledgers
it maps, as the watch of the node reads them.

A leaf: imports nothing from cudatrace.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple


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


def maps_name(part: str, pid: int | str = "self", proc: str = "/proc") -> bool:
    """Whether a file whose path holds `part` (e.g. 'libcuda.so') is mapped in a process."""
    try:
        with open(f"{proc}/{pid}/maps", "rb") as f:
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


# ---- one process, as the host's watch reads it (record/gpuview.py, deploy/procscan.py) --------

LEDGER_SUFFIX = ".ledger"


class ProcStat(NamedTuple):
    """What /proc says of a process that no process can write: its pid in its own (innermost)
    pid namespace, that namespace's inode, its start time (clock ticks after boot) and name."""

    pid: int  # in the pid namespace of the /proc read
    ns_pid: int
    pidns: int  # inode of its pid namespace; 0: unknown
    start_ticks: int
    comm: str


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def start_ticks_of(stat: str) -> int:
    """Field 22 of /proc/PID/stat (0 when it cannot be read)."""
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return 0


def ns_pid_of(status: str, pid: int) -> int:
    """The last NSpid of /proc/PID/status: the pid in its own namespace (pid where absent)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            vals = line.split()[1:]
            return int(vals[-1]) if vals else pid
    return pid


def proc_stat(pid: int, proc: str = "/proc") -> ProcStat | None:
    """The process's ProcStat, None when it is gone or cannot be read from here."""
    d = f"{proc}/{pid}"
    stat, status = _read(f"{d}/stat"), _read(f"{d}/status")
    if stat is None or status is None:
        return None
    try:
        pidns = os.stat(f"{d}/ns/pid").st_ino
    except OSError:
        pidns = 0
    comm = stat[stat.find("(") + 1 : stat.rfind(")")] if "(" in stat else ""
    return ProcStat(pid, ns_pid_of(status, pid), pidns, start_ticks_of(stat), comm)


def cgroup_of(pid: int, proc: str = "/proc") -> str:
    """/proc/PID/cgroup as it is ("" when unreadable): written by the kernel, never by the
    process (deploy/identity.py reads a container and a pod from it)."""
    return _read(f"{proc}/{pid}/cgroup") or ""


def ledger_maps(pid: int, proc: str = "/proc") -> set[tuple[str, int]] | None:
    """(device "maj:min", inode) of every ledger file the process maps shared (a member maps
    its ledger while it lives); None when its maps cannot be read from here."""
    text = _read(f"{proc}/{pid}/maps")
    if text is None:
        return None
    out = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].endswith(LEDGER_SUFFIX) and "s" in parts[1]:
            if parts[4] != "0":
                out.add((parts[3], int(parts[4])))
    return out


def trace_dirs(pid: int, proc: str = "/proc") -> list[str]:
    """The directories of the trace files (`*.ctrace`) a process maps shared, as its maps name
    them: a traced process maps the trace it writes while it lives ([] where none is mapped
    or its maps cannot be read from here)."""
    text = _read(f"{proc}/{pid}/maps")
    out: list[str] = []
    for line in (text or "").splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].endswith(".ctrace") and "s" in parts[1]:
            d = os.path.dirname(parts[5])
            if d not in out:
                out.append(d)
    return out
