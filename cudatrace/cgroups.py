"""The container and the pod a process runs in, read from its cgroup path (/proc/PID/cgroup):
written by the kernel when the runtime placed the process, never by the process itself, so a
tenant cannot name another's container or pod there as it can in its environment.

The runtimes' names, cgroup v1 (one line per hierarchy) and v2 (`0::PATH`) alike, with the
systemd driver or cgroupfs:

    /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope
    /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/crio-<id>.scope
    /kubepods/burstable/pod<uid>/<id>              (cgroupfs: containerd, CRI-O without a prefix)
    /kubepods/pod<uid>/crio-<id>                   (a Guaranteed pod: no QoS level)
    /machine.slice/libpod-<id>.scope, /libpod_parent/libpod-<id>   (Podman, systemd or cgroupfs)
    /system.slice/docker-<id>.scope, /docker/<id>  (Docker)

The container is the outermost component naming one: what follows is the container's own (a
container that may write its cgroup can make `.../cri-containerd-<id>.scope/<another id>`,
never change what is above its own). A pod's uid counts only above the container. Paths seen
through a cgroup namespace (`/../../kubepods-...`) read the same. Two hierarchies naming two
containers is a conflict: no identity. Conmon's scopes (`crio-conmon-`, `libpod-conmon-`) are
the runtime's monitor, not a container.

A leaf: imports nothing from cudatrace.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_ID = r"([0-9a-f]{64})"
_CONTAINER = [
    (re.compile(rf"cri-containerd-{_ID}(?:\.scope)?"), "containerd"),
    (re.compile(rf"crio-{_ID}(?:\.scope)?"), "cri-o"),
    (re.compile(rf"libpod-{_ID}(?:\.scope)?"), "podman"),
    (re.compile(rf"docker-{_ID}(?:\.scope)?"), "docker"),
]
_BARE = re.compile(_ID)
_POD = re.compile(
    r"(?:kubepods(?:-burstable|-besteffort)?-pod([0-9a-f_]{36})\.slice|pod([0-9a-f-]{36}))"
)
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class CgroupIdentity(NamedTuple):
    """What a cgroup path says: the container's 64-hex id ("" none), the runtime that named
    it, the pod's uid ("" none: not a Kubernetes pod's container, or not said), conflict: the
    hierarchies disagree (then nothing else is given)."""

    container: str = ""
    runtime: str = ""
    pod_uid: str = ""
    conflict: bool = False


def _component(part: str, parent: str, under_pod: bool) -> tuple[str, str] | None:
    """(id, runtime) when this path component names a container."""
    for rx, runtime in _CONTAINER:
        m = rx.fullmatch(part)
        if m:
            return m.group(1), runtime
    m = _BARE.fullmatch(part)
    if m and (under_pod or parent == "docker"):
        return m.group(1), "docker" if parent == "docker" else "kubernetes"
    return None


def _pod_uid(part: str) -> str:
    m = _POD.fullmatch(part)
    if not m:
        return ""
    uid = (m.group(1) or m.group(2) or "").replace("_", "-")
    return uid if _UID.fullmatch(uid) else ""


def parse_path(path: str) -> CgroupIdentity:
    """The identity one cgroup path names (CgroupIdentity() for none)."""
    pod, parent = "", ""
    for part in path.split("/"):
        found = _component(part, parent, bool(pod))
        if found is not None:
            return CgroupIdentity(found[0], found[1], pod)
        pod = _pod_uid(part) or pod
        parent = part
    return CgroupIdentity()


def parse(text: str) -> CgroupIdentity:
    """The identity /proc/PID/cgroup's lines name (every hierarchy must agree)."""
    seen: set[CgroupIdentity] = set()
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        ident = parse_path(path)
        if ident.container:
            seen.add(ident)
    if len(seen) > 1:
        # the same container with and without its pod (a v1 hierarchy left at the pod's
        # level) is one identity: the one that names the pod
        ids = {i.container for i in seen}
        pods = {i.pod_uid for i in seen if i.pod_uid}
        if len(ids) == 1 and len(pods) <= 1:
            return max(seen, key=lambda i: bool(i.pod_uid))
        return CgroupIdentity(conflict=True)
    return next(iter(seen), CgroupIdentity())
