"""The processes of a node that take part in budgets, seen from the host's pid namespace.

One pass over /proc finds every process that maps a ledger (a shared mapping of a file named
`*.ledger`), wherever it lives: a named group's host directory, a container's own tmpfs, a
pod's emptyDir. For each it reads what the node agent needs to tell members apart across pid
namespaces: the host pid, the pid in its own namespace (the last NSpid), its start time (what
the ledger records beside that pid), the container it runs in (its cgroup path: cgroups.py)
and the Kubernetes names its environment claims (the webhook's, the DRA plugin's: only ever
checked against what the API server says of its container, identity.py).

A ledger is opened through /proc/<pid>/map_files/<range> of a process that maps it: the
kernel resolves that link to the very file the member uses, so no path inside a container is
followed (a container could have planted a symbolic link on the way).

The same pass notes processes that were given a budget (CUDATRACE_GROUP in their environment)
and use CUDA (map libcuda) but do not map the preload library: a library that could not be
preloaded (an image whose C library is older than the library needs, say) runs them unfenced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import cgroups, procfs, settings

ENV_KEEP = (
    settings.name("GROUP"),
    settings.name("K8S_NAMESPACE"),
    settings.name("K8S_POD"),
    settings.name("K8S_CONTAINER"),
    settings.name("K8S_POD_UID"),
    settings.name("CUDA_VISIBLE_DEVICES"),
    "NVIDIA_VISIBLE_DEVICES",
)


@dataclass
class Proc:
    """One process, as the host sees it."""

    pid: int  # in the pid namespace of the /proc read (the host's)
    ns_pid: int  # in its own (innermost) pid namespace: what the ledger records
    start_ticks: int
    pidns: int  # inode of its pid namespace
    container: str = ""  # 64 hex digits its cgroup names, or "" (not in a container)
    env: dict[str, str] = field(default_factory=dict)  # claims, never identities
    shim: bool = False  # maps the preload library
    cuda: bool = False  # maps libcuda

    def labels(self) -> tuple[str, str, str]:
        """(namespace, pod, container) from what the process cannot write: the container's
        short id (its cgroup's); a pod only once verified (the agent's identities)."""
        return ("", "", self.container[:12])


@dataclass
class Mapping:
    """A ledger file some processes map: key (device, inode) and who maps it where."""

    key: tuple[str, int]
    path: str  # as the first process sees it
    links: list[tuple[Proc, str]] = field(default_factory=list)  # (process, map_files link)


@dataclass
class Scan:
    ledgers: dict[tuple[str, int], Mapping] = field(default_factory=dict)
    unfenced: list[Proc] = field(default_factory=list)
    procs: dict[int, Proc] = field(default_factory=dict)  # every process that maps a ledger


def _read_bytes(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _read(path: Path) -> str | None:
    data = _read_bytes(path)
    return None if data is None else data.decode("utf-8", "replace")


def _maps(text: str, links: str) -> tuple[list[tuple[tuple[str, int], str, str]], bool, bool]:
    """(ledger mappings as (key, path, map_files link), maps the shim, maps libcuda)."""
    ledgers, shim, cuda = [], False, False
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        addr, perms, _off, dev, inode, path = parts
        base = path.rsplit("/", 1)[-1]
        if base.startswith("libcuda.so"):
            cuda = True
        elif base == "libcudatrace.so":
            shim = True
        elif path.endswith(".ledger") and "s" in perms and inode != "0":
            lo, _, hi = addr.partition("-")
            link = f"{links}/{int(lo, 16):x}-{int(hi, 16):x}"
            ledgers.append(((dev, int(inode)), path, link))
    return ledgers, shim, cuda


def environ(pid: int, proc: Path = Path("/proc")) -> dict[str, str]:
    """The variables of ENV_KEEP in a process's environment ({} when unreadable)."""
    return _environ(_read_bytes(proc / str(pid) / "environ"))


def _environ(raw: bytes | None) -> dict[str, str]:
    out = {}
    for item in (raw or b"").split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k.decode("ascii", "replace") in ENV_KEEP:
            out[k.decode()] = v.decode("utf-8", "replace")
    return out


def _proc(proc: Path, pid: int, shim: bool, cuda: bool) -> Proc | None:
    d = proc / str(pid)
    stat, status = _read(d / "stat"), _read(d / "status")
    if stat is None or status is None:
        return None
    try:
        pidns = os.stat(d / "ns" / "pid").st_ino
    except OSError:
        pidns = 0
    return Proc(
        pid=pid,
        ns_pid=procfs.ns_pid_of(status, pid),
        start_ticks=procfs.start_ticks_of(stat),
        pidns=pidns,
        container=cgroups.parse(_read(d / "cgroup") or "").container,
        env=_environ(_read_bytes(d / "environ")),
        shim=shim,
        cuda=cuda,
    )


def scan(proc: Path = Path("/proc")) -> Scan:
    """One pass over every process readable here but this one (which maps every ledger it
    reads)."""
    out = Scan()
    me = str(os.getpid())
    for name in os.listdir(proc):
        if not name.isdigit() or name == me:
            continue
        pid = int(name)
        text = _read(proc / name / "maps")
        if not text:
            continue  # gone, or a kernel thread
        ledgers, shim, cuda = _maps(text, f"{proc}/{name}/map_files")
        if not ledgers and not cuda:
            continue
        p = _proc(proc, pid, shim, cuda)
        if p is None:
            continue
        if cuda and not shim and p.env.get(settings.name("GROUP")):
            out.unfenced.append(p)
        if not ledgers:
            continue
        out.procs[pid] = p
        for key, path, link in ledgers:
            m = out.ledgers.setdefault(key, Mapping(key, path))
            if all(q.pid != pid for q, _ in m.links):
                m.links.append((p, link))
    return out
