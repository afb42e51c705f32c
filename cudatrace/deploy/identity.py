"""Who a process on the node is, from what it cannot write: its container and pod from its cgroup
path (cgroups.py), confirmed against the API server: the pod exists, runs on this node, and its
status lists that container id (and, where the cgroup names the pod's uid, it is this pod's).
Only a verified identity names a pod: in a metric's labels, in an Event. A process's
environment (CUDATRACE_K8S_*, the webhook's and the DRA plugin's) may only be checked against
it: a claim that differs, or that names a pod where nothing could be verified, is a mismatch,
said once and counted, never used.

The node's pods are listed once (`GET /api/v1/pods?fieldSelector=spec.nodeName=NODE`) and
again when a container the list lacks appears (at most every UNKNOWN_S seconds) or every
REFRESH_S seconds: one request a pass at worst, none most passes. The kubelet writes a new
container's id into its pod's status a moment after it starts: a container the list lacks is
given VERIFY_WAIT_S seconds before its environment's claim is a mismatch, and an Event about
it waits as long for its pod (then it is said in the log alone).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .. import cgroups, procfs, settings
from .kube import Kube, KubeError, PodContainer, pod_event
from .objects import Event

REFRESH_S = 60.0
UNKNOWN_S = 5.0
VERIFY_WAIT_S = 15.0
RUNTIME_PREFIXES = ("containerd://", "cri-o://", "docker://", "podman://")
# what a process's environment claims, by the settings' IDs (each read by its literal name)
ENV_KEYS = {
    "K8S_NAMESPACE": settings.name("K8S_NAMESPACE"),
    "K8S_POD": settings.name("K8S_POD"),
    "K8S_CONTAINER": settings.name("K8S_CONTAINER"),
    "K8S_POD_UID": settings.name("K8S_POD_UID"),
}


@dataclass(frozen=True)
class PodRef:
    """A container of a pod of this node, as the API server lists it."""

    namespace: str
    pod: str
    uid: str
    container: str  # its name in the pod
    node: str


@dataclass(frozen=True)
class Identity:
    """A process's identity: `container` and `pod_uid` from its cgroup; `ref` the pod the API
    server confirmed (None: unverified); `mismatch` why its environment's claim was not taken
    ("" when it claims nothing, or what the API server says)."""

    container: str = ""
    pod_uid: str = ""
    ref: PodRef | None = None
    mismatch: str = ""

    @property
    def verified(self) -> bool:
        return self.ref is not None

    def labels(self) -> tuple[str, str, str]:
        """(namespace, pod, container) for metrics and Events: the verified pod's names, else
        the container's short id alone."""
        if self.ref is not None:
            return (self.ref.namespace, self.ref.pod, self.ref.container or self.container[:12])
        return ("", "", self.container[:12])


def _obj(v: object) -> dict[str, object]:
    """An API server's value read as an object: {} when it is anything else."""
    return v if isinstance(v, dict) else {}


def _container_ids(pod: Mapping[str, object]) -> list[tuple[str, str]]:
    """(64-hex id, name) of each container the pod's status lists."""
    status = _obj(pod.get("status"))
    out = []
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        rows = status.get(key)
        for c in rows if isinstance(rows, list) else []:
            cid = c.get("containerID") if isinstance(c, dict) else None
            if not isinstance(cid, str):
                continue
            for prefix in RUNTIME_PREFIXES:
                if cid.startswith(prefix):
                    cid = cid[len(prefix) :]
            if len(cid) == 64 and isinstance(c.get("name"), str):
                out.append((cid, c["name"]))
    return out


def index_pods(items: object, node: str) -> dict[str, PodRef]:
    """container id -> PodRef, of the pods in `items` (a PodList's) that run on `node`; any
    item not shaped as a pod is passed over."""
    out: dict[str, PodRef] = {}
    for pod in items if isinstance(items, list) else []:
        if not isinstance(pod, dict):
            continue
        meta, spec = _obj(pod.get("metadata")), _obj(pod.get("spec"))
        ns, name, uid = (meta.get(k) for k in ("namespace", "name", "uid"))
        if spec.get("nodeName") != node:
            continue
        if not (isinstance(ns, str) and isinstance(name, str) and isinstance(uid, str)):
            continue
        for cid, cname in _container_ids(pod):
            out[cid] = PodRef(ns, name, uid, cname, node)
    return out


@dataclass
class PodIndex:
    """This node's pods, by container id, listed from the API server when needed."""

    kube: Kube
    node: str
    say: Callable[[str], None]
    pods: dict[str, PodRef] = field(default_factory=dict)
    listed_at: float | None = None
    error: str | None = None

    def _list(self) -> None:
        q = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.node}"})
        self.listed_at = time.monotonic()
        try:
            answer = self.kube.request("GET", f"/api/v1/pods?{q}")
        except KubeError as e:
            if self.error != str(e):
                self.say(f"cannot list this node's pods (identities stay unverified): {e}")
            self.error = str(e)
            return
        if self.error is not None:
            self.say("this node's pods are listed again")
        self.error = None
        self.pods = index_pods(answer.get("items") if isinstance(answer, dict) else None, self.node)

    def lookup(self, container: str) -> PodRef | None:
        now = time.monotonic()
        age = None if self.listed_at is None else now - self.listed_at
        if age is None or age >= REFRESH_S or (container not in self.pods and age >= UNKNOWN_S):
            self._list()
        return self.pods.get(container)


def _claims(env: Mapping[str, str]) -> dict[str, str]:
    return {k: env[var] for k, var in ENV_KEYS.items() if env.get(var)}


def _mismatch(claims: Mapping[str, str], ref: PodRef | None, container: str) -> str:
    """Why the environment's claim is not the verified identity ("" when it agrees)."""
    if not claims:
        return ""
    said = "/".join(claims.get(k, "?") for k in ("K8S_NAMESPACE", "K8S_POD"))
    if ref is None:
        where = "a container no pod of this node lists" if container else "no container"
        return f"its environment names pod {said}, but it runs in {where}"
    truth = {"K8S_NAMESPACE": ref.namespace, "K8S_POD": ref.pod, "K8S_POD_UID": ref.uid}
    if ref.container:
        truth["K8S_CONTAINER"] = ref.container
    wrong = [k for k, v in claims.items() if k in truth and v != truth[k]]
    if not wrong:
        return ""
    return (
        f"its environment names pod {said}"
        + (f" container {claims['K8S_CONTAINER']}" if "K8S_CONTAINER" in claims else "")
        + f", but it is pod {ref.namespace}/{ref.pod} container {ref.container}"
    )


def identify(
    pid: int, env: Mapping[str, str], index: PodIndex | None, proc: str = "/proc"
) -> Identity:
    """The identity of host pid `pid` (its environment `env` as procscan read it)."""
    cg = cgroups.parse(procfs.cgroup_of(pid, proc))
    ref = index.lookup(cg.container) if index is not None and cg.container else None
    if ref is not None and cg.pod_uid and cg.pod_uid != ref.uid:
        ref = None  # the cgroup names another pod than the one listing the container
    claims = _claims(env)
    if index is None and claims:
        return Identity(cg.container, cg.pod_uid, None, "")  # no API server: nothing to check
    return Identity(cg.container, cg.pod_uid, ref, _mismatch(claims, ref, cg.container))


@dataclass
class _Held:
    """An Event waiting for its container's pod to be listed (the process may be gone)."""

    container: str
    pod_uid: str  # the cgroup's, "" where it names none
    reason: str
    message: str
    count: int
    until: float


class Identities:
    """The identities of a pass (`refresh`), and what is told of a process (`tell`): said on
    stderr, and sent as an Event of its pod where the API server verified it."""

    def __init__(
        self,
        kube: Kube | None,
        node: str,
        say: Callable[[str], None],
        proc: str,
        post: Callable[[Event], None] | None = None,
    ):
        """post: how an Event goes out (the agent's kube.EventQueue; default: posted now)."""
        self.kube, self.node, self.say, self.proc, self.post = kube, node, say, proc, post
        self.index = PodIndex(kube, node, say) if kube is not None else None
        self.now: dict[int, Identity] = {}  # host pid -> identity, this pass
        self._since: dict[tuple[int, int], float] = {}  # (pid, start) -> first seen unverified
        self._said: set[tuple[int, int]] = set()  # mismatches said
        self._held: list[_Held] = []

    def get(self, pid: int) -> Identity | None:
        return self.now.get(pid)

    def refresh(self, pids: Mapping[int, Mapping[str, str]]) -> None:
        """Identify each host pid (its environment's claims beside it); say new mismatches;
        send the Events that waited for a pod now verified."""
        now = time.monotonic()
        self.now = {pid: identify(pid, env, self.index, self.proc) for pid, env in pids.items()}
        keys = set()
        for pid, ident in self.now.items():
            st = procfs.proc_stat(pid, self.proc)
            key = (pid, st.start_ticks if st else 0)
            keys.add(key)
            waiting = ident.container and not ident.verified and self.index is not None
            first = self._since.setdefault(key, now) if waiting else now
            if (
                ident.mismatch
                and key not in self._said
                and now - first >= (VERIFY_WAIT_S if waiting else 0)
            ):
                self.say(f"pid {pid}: {ident.mismatch}: its environment's names are not used")
                self._said.add(key)
        self._said &= keys
        self._since = {k: v for k, v in self._since.items() if k in keys}
        self._release(now)

    def _release(self, now: float) -> None:
        keep = []
        for h in self._held:
            ref = self.index.lookup(h.container) if self.index is not None else None
            if ref is not None and (not h.pod_uid or h.pod_uid == ref.uid):
                self._post(Identity(h.container, h.pod_uid, ref), h.reason, h.message, h.count)
            elif now < h.until:
                keep.append(h)
        self._held = keep

    def tell(self, pid: int, container: str, reason: str, message: str, count: int = 1) -> None:
        """Say message, naming the process; send it as an Event of its verified pod, or hold
        it while the container may yet be listed."""
        ident = self.now.get(pid)
        ns, pod, cname = ident.labels() if ident is not None else ("", "", container[:12])
        who = f"pod {ns}/{pod} container {cname}" if pod else f"container {cname}"
        self.say(f"{who if cname or pod else f'pid {pid}'}: {message}")
        if self.kube is None or ident is None:
            return
        if ident.ref is not None:
            self._post(ident, reason, message, count)
        elif ident.container:
            until = time.monotonic() + VERIFY_WAIT_S
            held = _Held(ident.container, ident.pod_uid, reason, message, count, until)
            self._held.append(held)

    def _post(self, ident: Identity, reason: str, message: str, count: int) -> None:
        assert self.kube is not None and ident.ref is not None
        ref = ident.ref
        ev = pod_event(PodContainer(ref.namespace, ref.pod, ref.container, ref.uid), reason,
                       message, self.node, count=count)  # fmt: skip
        if self.post is not None:
            self.post(ev)
            return
        try:
            self.kube.post_event(ev)
        except KubeError as e:
            self.say(f"cannot post the event: {e}")

    def counts(self) -> dict[str, int]:
        """Processes verified, unverified, and whose environment claims another pod."""
        out = {"verified": 0, "unverified": 0, "mismatch": 0}
        for ident in list(self.now.values()):
            out["verified" if ident.verified else "unverified"] += 1
            out["mismatch"] += bool(ident.mismatch)
        return out
