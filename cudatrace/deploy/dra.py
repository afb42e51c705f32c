"""Dynamic Resource Allocation (resource.k8s.io/v1): the scheduler hands out GPU memory, and a
claim's share of a GPU becomes the budget of the containers given the claim (`cudatrace
dra-plugin`; docs/kubernetes.md, "Dynamic Resource Allocation").

The kubelet plugin of the DRA driver `gpu.cudatrace.dev` (dra_grpc.py serves it):

- it publishes the node's GPUs as one ResourceSlice: a device per GPU (`gpu-0`, ...) whose
  `memory` capacity is NVML's total (less --reserve) and which allows multiple allocations, so
  the scheduler hands out one GPU's memory to many claims (consumable capacity: a request's
  `capacity.requests.memory`) and never more than the GPU has;
- NodePrepareResources (the kubelet, once a pod's claim is allocated on this node): it reads the
  claim from the API server and writes a CDI spec of the claim's own. What the claim consumes of
  each GPU is the budget of a group named by the claim's uid, whose ledger directory
  (<state>/claims/<uid>) every container given the claim mounts: all the containers of all the
  pods sharing a claim share one budget. The fence is sealed: its record
  (<state>/fences/claim-<uid>, root's) is mounted read-only where the preload library reads it,
  so nothing a container sets can raise it (docs/budgets.md, "The sealed fence"). The spec's common edits (the preload library, the
  ledger directory, the environment) are applied once per container however many of the claim's
  devices it gets; each device adds only CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's ordinals in NVML's
  order, which a budget per ordinal follows). The answer names, for each allocated GPU, the
  claim's device and the GPU itself from the GPU's own CDI spec (--gpu-cdi, default
  `nvidia.com/gpu={index}` as nvidia-ctk writes it; '' when the GPUs reach containers another
  way);
- NodeUnprepareResources: it removes the spec, and the claim's ledger directory once no member
  lives (sweep(), every --resync seconds, removes those kept for a member still alive).

What it keeps on disk, which is all a restarted plugin reads back (docs/kubernetes.md, "What
the plugin keeps on disk"):

    <root>/shim/<id>/                    the preload library and its ld.so.preload, installed
                                         versioned and atomically at start (install.py); the
                                         specs point here; never removed by the plugin (the
                                         node agent removes installs nobody uses)
    <cdi dir>/<vendor>-claim-<uid>.json  a prepared claim's CDI spec (0644, written whole, by
                                         rename); it is the plugin's record of which claims are
                                         prepared: sweep() keeps a claim's directory while its
                                         spec is there. /var/run/cdi is a tmpfs: gone with a
                                         reboot, as the kubelet's preparation is
    <state>/fences/claim-<uid>           a claim's sealed fence record (root's, 0644, written
                                         whole on prepare), mounted read-only at
                                         /etc/cudatrace/fence; removed on unprepare and by
                                         sweep() with the claim's ledger directory
    <state>/claims/<uid>/                a claim's ledger directory (1777: members of any uid),
                                         mounted into the claim's containers; the members write
                                         <uid>.ledger in it, the plugin reads nothing of it but
                                         whether a member lives (the ledger's locks)
    <kubelet dir>/plugins_registry/<driver>-reg.sock, <kubelet dir>/plugins/<driver>/dra.sock
                                         the sockets (0600), made at start over a stale socket
                                         (never over anything else), the registration's removed
                                         first at a stop

There is no checkpoint of prepared claims beside the specs: a NodePrepareResources asked again
(after a restart, or by the kubelet's retry) reads the claim from the API server and writes the
same spec; a NodeUnprepareResources needs the claim's uid alone. The ResourceSlice lives in the
API server, its pool's generation one past the one there at each start.

The API server's answers are read as anything (kube.need, check_claim): a claim answered without
the fields read is tried again within the kubelet's call (3 tries, about a second), then refused
with the field named; the slice is published again after growing pauses (1 s to 60 s) while it
cannot be. The plugin never exits on an answer.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from .. import fence_record, settings
from ..errors import CudatraceError
from . import cdi
from .install import Installed
from .kube import Backoff, Kube, KubeError, Retry, need
from .objects import (
    CdiSpec,
    ClaimMeta,
    DeviceAttribute,
    DeviceClass,
    ObjectMeta,
    OwnerReference,
    ResourceClaim,
    ResourceSlice,
    SliceDevice,
)
from .plan import DEFAULT_ROOT, DEFAULT_STATE, VENDOR, Fence, PlanError, check_name, record

if TYPE_CHECKING:
    from ..nvml import Nvml

DRIVER = "gpu.cudatrace.dev"  # the DRA driver: ResourceSlices, allocation results
DEVICE_CLASS = "gpu-memory.cudatrace.dev"  # the DeviceClass claims name (manifests.py)
CAPACITY = "memory"  # the consumable capacity of a device: a claim's capacity.requests.memory
CLAIM_KIND = "claim"  # CDI kind <vendor>/claim: one spec file per claim
CLAIMS_DIR = "claims"  # <state>/claims/<claim uid>: a claim's ledger directory
FENCES_DIR = "fences"  # <state>/fences/claim-<claim uid>: a claim's sealed fence record
CDI_DIR = "/var/run/cdi"  # a tmpfs: a claim's spec goes with a reboot, as its preparation does
KUBELET_DIR = "/var/lib/kubelet"
GPU_CDI = "nvidia.com/gpu={index}"  # the GPU's own CDI device (nvidia-ctk cdi generate)
RESOURCE_API = "/apis/resource.k8s.io/v1"
DEVICE_ORDER = "CUDA_DEVICE_ORDER=PCI_BUS_ID"  # CUDA's ordinals in NVML's (PCI bus) order
MIN_BUDGET = 1 << 20  # the preload library's least budget (docs/budgets.md)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_QUANTITY = re.compile(
    r"(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei)|([numkMGTPE])|[eE]([+-]?\d+))?"
)
_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class DraError(CudatraceError):
    """A claim that cannot be prepared, or a node that cannot offer its GPUs; the message says
    why (the kubelet shows a claim's in the pod's events)."""


@dataclass(frozen=True)
class PluginConfig:
    """What `cudatrace dra-plugin` was told (commands/dra.py builds it)."""

    node: str
    driver: str = DRIVER
    vendor: str = VENDOR
    root: Path = Path(DEFAULT_ROOT)
    state: Path = Path(DEFAULT_STATE)
    cdi_dir: Path = Path(CDI_DIR)
    preload: str = "file"
    on_exceed: str = "fail"
    shim: Path | None = None
    gpu_cdi: str = GPU_CDI
    reserve: int = 0
    kubelet_dir: Path = Path(KUBELET_DIR)

    @property
    def socket(self) -> Path:
        """The DRA service's socket, which the registration names."""
        return self.kubelet_dir / "plugins" / self.driver / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        """Where the kubelet's plugin watcher finds the plugin."""
        return self.kubelet_dir / "plugins_registry" / f"{self.driver}-reg.sock"


@dataclass(frozen=True)
class Gpu:
    """A GPU of the node as its ResourceSlice offers it: memory in bytes."""

    index: int
    uuid: str
    product: str
    memory: int

    @property
    def device(self) -> str:
        return f"gpu-{self.index}"


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Share:
    """One allocation result of this driver in a claim: a request's share of a GPU."""

    request: str
    gpu: Gpu
    memory: int


@dataclass(frozen=True)
class ClaimPlan:
    """What a claim gets on this node: its shares, and the pod it belongs to (name, uid) when a
    pod owns it (a claim made from a ResourceClaimTemplate)."""

    ref: ClaimRef
    shares: tuple[Share, ...]
    pod: tuple[str, str] | None = None

    def per_gpu(self) -> dict[int, int]:
        """GPU index -> the bytes the claim consumes of it (its requests together)."""
        out: dict[int, int] = {}
        for s in self.shares:
            out[s.gpu.index] = out.get(s.gpu.index, 0) + s.memory
        return dict(sorted(out.items()))

    def budget(self) -> str:
        """The budget variable's value (settings.def BUDGET): one size when every GPU of the
        claim has the same (exact for any of them a container sees), else one per CUDA ordinal
        in NVML's order."""
        sizes = list(self.per_gpu().values())
        if len(set(sizes)) == 1:
            return str(sizes[0])
        return ",".join(f"{k}={n}" for k, n in enumerate(sizes))


@dataclass(frozen=True)
class Prepared:
    """A prepared claim's devices for the kubelet: (request names, pool, device, CDI ids)."""

    devices: tuple[tuple[tuple[str, ...], str, str, tuple[str, ...]], ...] = ()


# ---- quantities, the node's GPUs, the objects ----------------------------------------------


def parse_quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity (`8Gi`, `8G`, `8589934592`, `1.5Gi`, `5e9`), rounded up
    to a whole byte. Raises DraError."""
    m = _QUANTITY.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise DraError(f"{text!r} is not a Kubernetes quantity of bytes (8Gi)")
    num, binary, decimal, exp = m.groups()
    value = Fraction(num)
    if binary:
        value *= _BINARY[binary]
    elif decimal or exp:
        value *= Fraction(10) ** (_DECIMAL[decimal] if decimal else int(exp))
    whole = -(-value.numerator // value.denominator)
    if whole >= 1 << 64:
        raise DraError(f"{text!r} is too large")
    return whole


def node_gpus(nvml: Nvml, reserve: int = 0) -> list[Gpu]:
    """The GPUs NVML lists, each offering its total memory less reserve. Raises DraError when
    there is none to offer."""
    if not nvml.available:
        raise DraError(f"no GPU to offer: {nvml.why}")
    uuids, names = nvml.uuids(), nvml.names()
    out = []
    for row in nvml.memory():
        i = int(row["index"])
        if "total" not in row:
            raise DraError(f"NVML cannot read the memory of GPU {i} (NVML error {row['error']})")
        memory = int(row["total"]) - reserve
        if memory < MIN_BUDGET:
            raise DraError(f"GPU {i} has {row['total']} bytes: nothing left past --reserve")
        out.append(Gpu(i, uuids.get(i, ""), names.get(i, ""), memory))
    if not out:
        raise DraError("NVML lists no GPU on this node")
    return out


def slice_name(node: str, driver: str) -> str:
    name = f"{node}-{driver}"
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise DraError(f"{name!r} cannot name a ResourceSlice: give a shorter --node-name")
    return name


def resource_slice(
    cfg: PluginConfig, gpus: list[Gpu], generation: int = 1, owner: OwnerReference | None = None
) -> ResourceSlice:
    """The node's ResourceSlice: one pool (the node's name), a device per GPU."""
    devices: list[SliceDevice] = []
    for g in gpus:
        attributes: dict[str, DeviceAttribute] = {"index": {"int": g.index}}
        if g.uuid:
            attributes["uuid"] = {"string": g.uuid[:64]}
        if g.product:
            attributes["productName"] = {"string": g.product[:64]}
        devices.append(
            {
                "name": g.device,
                "allowMultipleAllocations": True,
                "attributes": attributes,
                "capacity": {CAPACITY: {"value": str(g.memory)}},
            }
        )
    meta: ObjectMeta = {
        "name": slice_name(cfg.node, cfg.driver),
        "labels": {"app.kubernetes.io/name": "cudatrace"},
    }
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": cfg.driver,
            "nodeName": cfg.node,
            "pool": {"name": cfg.node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class(driver: str = DRIVER, name: str = DEVICE_CLASS) -> DeviceClass:
    """The DeviceClass claims name: every device of the driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "cudatrace"}},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
    }


# ---- a claim -> its plan -> its CDI spec ----------------------------------------------------


def check_ref(ref: ClaimRef) -> ClaimRef:
    if not _DNS_LABEL.fullmatch(ref.namespace) or not _DNS_SUBDOMAIN.fullmatch(ref.name):
        raise DraError(f"claim {ref.namespace!r}/{ref.name!r}: not a namespace and a name")
    try:
        check_name(ref.uid, f"claim {ref}: uid")
    except PlanError as e:
        raise DraError(str(e)) from None
    return ref


def check_claim(obj: Mapping[str, object]) -> None:
    """A ResourceClaim as the API server answered it, as far as claim_plan reads it (its
    ResourceClaim type): a retryable KubeError naming the first field that is not what it
    must be."""
    w = "the ResourceClaim"

    def found(*path: str) -> object:
        """The value at path, None where it is missing or null."""
        cur: object = obj
        for key in path:
            if not isinstance(cur, dict) or cur.get(key) is None:
                return None
            cur = cur[key]
        return cur

    need(obj, "metadata", "uid", what=w)
    if found("metadata", "ownerReferences") is not None:
        refs = need(obj, "metadata", "ownerReferences", typ=list, what=w)
        for i in range(len(refs)):
            need(obj, "metadata", "ownerReferences", i, typ=dict, what=w)
    if found("status") is not None:
        need(obj, "status", typ=dict, what=w)
    if not found("status", "allocation"):
        return  # not allocated: claim_plan says so
    need(obj, "status", "allocation", typ=dict, what=w)
    at = ("status", "allocation", "devices")
    if found(*at) is None:
        return
    need(obj, *at, typ=dict, what=w)
    if found(*at, "results") is None:
        return
    for i in range(len(need(obj, *at, "results", typ=list, what=w))):
        r = need(obj, *at, "results", i, typ=dict, what=w)
        for key in ("request", "driver", "pool", "device"):
            if key in r:
                need(obj, *at, "results", i, key, what=w)
        if r.get("consumedCapacity") is not None:
            need(obj, *at, "results", i, "consumedCapacity", typ=dict, what=w)
            if CAPACITY in r["consumedCapacity"]:
                need(obj, *at, "results", i, "consumedCapacity", CAPACITY, typ=(str, int), what=w)


def _owner_pod(meta: ClaimMeta) -> tuple[str, str] | None:
    for o in meta.get("ownerReferences") or []:
        if o.get("kind") == "Pod" and o.get("apiVersion") == "v1" and o.get("controller"):
            return str(o.get("name", "")), str(o.get("uid", ""))
    return None


def claim_plan(
    claim: ResourceClaim, ref: ClaimRef, cfg: PluginConfig, gpus: list[Gpu]
) -> ClaimPlan:
    """What the claim gets of this node's GPUs. Raises DraError when it cannot be prepared here."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise DraError(
            f"claim {ref} is {meta.get('uid')!r} now, not {ref.uid} (deleted and made again?)"
        )
    alloc = (claim.get("status") or {}).get("allocation")
    if not alloc:
        raise DraError(f"claim {ref} is not allocated")
    by_name = {g.device: g for g in gpus}
    shares = []
    for r in (alloc.get("devices") or {}).get("results") or []:
        if r.get("driver") != cfg.driver:
            continue
        where = f"claim {ref}, request {r.get('request')!r}"
        if r.get("pool") != cfg.node:
            raise DraError(f"{where}: allocated in pool {r.get('pool')!r}, not {cfg.node!r}")
        gpu = by_name.get(r.get("device", ""))
        if gpu is None:
            raise DraError(f"{where}: this node has no device {r.get('device')!r}")
        consumed = (r.get("consumedCapacity") or {}).get(CAPACITY)
        memory = gpu.memory if consumed is None else parse_quantity(str(consumed))
        if memory < MIN_BUDGET:
            raise DraError(f"{where}: {memory} bytes of {gpu.device}; a budget needs 1 MiB")
        shares.append(Share(str(r.get("request", "")), gpu, memory))
    return ClaimPlan(ref, tuple(shares), _owner_pod(meta))


def claim_dir(state: Path, uid: str) -> Path:
    return Path(state).absolute() / CLAIMS_DIR / uid


def record_file(state: Path, uid: str) -> Path:
    return Path(state).absolute() / FENCES_DIR / f"claim-{uid}"


def spec_file(cfg: PluginConfig, uid: str) -> Path:
    return cdi.spec_path(cfg.cdi_dir, cfg.vendor, f"{CLAIM_KIND}-{uid}")


def cdi_device(plan: ClaimPlan, gpu: Gpu) -> str:
    return f"{plan.ref.uid}-{gpu.device}"


def claim_spec(plan: ClaimPlan, cfg: PluginConfig, inst: Installed) -> CdiSpec:
    """The claim's CDI spec: the fence in its common edits, a device per GPU."""
    uid = plan.ref.uid
    edits = cdi.device_edits(claim_fence(plan, cfg), inst, cfg.preload, cfg.state,
                             record_file(cfg.state, uid), claim_dir(cfg.state, uid))  # fmt: skip
    edits["env"].append(f"{settings.name('K8S_NAMESPACE')}={plan.ref.namespace}")
    if plan.pod is not None:
        edits["env"].append(f"{settings.name('K8S_POD')}={plan.pod[0]}")
        edits["env"].append(f"{settings.name('K8S_POD_UID')}={plan.pod[1]}")
    gpus = sorted({s.gpu for s in plan.shares}, key=lambda g: g.index)
    spec: CdiSpec = {
        "cdiVersion": "",
        "kind": f"{cfg.vendor}/{CLAIM_KIND}",
        "containerEdits": edits,
        "devices": [
            {"name": cdi_device(plan, g), "containerEdits": {"env": [DEVICE_ORDER]}} for g in gpus
        ],
    }
    spec["cdiVersion"] = cdi.min_version(spec)
    return spec


def claim_fence(plan: ClaimPlan, cfg: PluginConfig) -> Fence:
    """The claim's fence: a group named by its uid, what it consumes of each GPU."""
    return Fence(plan.ref.uid, plan.ref.uid, plan.budget(), cfg.on_exceed)


def claim_record(plan: ClaimPlan, cfg: PluginConfig) -> str:
    """The text of the claim's sealed fence record (fence_record.render)."""
    rec = record(claim_fence(plan, cfg), owner=f"claim {plan.ref} ({plan.ref.uid})")
    return fence_record.render(rec).text


def prepared(plan: ClaimPlan, cfg: PluginConfig) -> Prepared:
    """The kubelet's devices of a claim: for each share, the GPU's own CDI device (--gpu-cdi)
    and the claim's."""
    out = []
    for s in plan.shares:
        ids = []
        if cfg.gpu_cdi:
            ids.append(cfg.gpu_cdi.format(index=s.gpu.index, uuid=s.gpu.uuid))
        ids.append(f"{cfg.vendor}/{CLAIM_KIND}={cdi_device(plan, s.gpu)}")
        out.append(((s.request,), cfg.node, s.gpu.device, tuple(ids)))
    return Prepared(tuple(out))


def _generation(slice_: Mapping[str, object] | None) -> int:
    """The pool generation of a ResourceSlice as the API server has it (0: none readable)."""
    spec = (slice_ or {}).get("spec")
    pool = spec.get("pool") if isinstance(spec, dict) else None
    gen = pool.get("generation") if isinstance(pool, dict) else None
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else 0


# ---- the plugin --------------------------------------------------------------------------------


@dataclass
class Plugin:
    """The plugin's state: the node's GPUs, the install the specs point at, the API server.
    prepare(), unprepare() and sweep() run one at a time (the gRPC server calls them from its
    threads)."""

    cfg: PluginConfig
    gpus: list[Gpu]
    kube: Kube | None = None
    say: Callable[[str], None] = print
    inst: Installed | None = None
    generation: int = 0
    registered: str = ""  # what the kubelet said of the registration, once it has
    published: bool = False  # the ResourceSlice is the one this plugin wrote
    publishes: int = 0
    next_publish: float = 0.0
    backoff: Backoff = field(default_factory=Backoff)
    last_pass: float = field(default_factory=time.monotonic)  # the loop's, for its health
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def setup(self) -> Installed:
        """Install the preload library the specs point at; make the claims' directory."""
        from .install import install

        self.inst = install(self.cfg.root, self.cfg.shim)
        base = Path(self.cfg.state).absolute() / CLAIMS_DIR
        try:
            base.mkdir(mode=0o755, parents=True, exist_ok=True)
            (base.parent / FENCES_DIR).mkdir(mode=0o755, exist_ok=True)
            Path(self.cfg.cdi_dir).mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as e:
            raise DraError(f"cannot make {e.filename}: {e.strerror}") from None
        return self.inst

    # ---- the claims -----------------------------------------------------------------------

    def read_claim(self, ref: ClaimRef) -> ResourceClaim:
        """The claim, as the API server has it now: an answer that fails or is not a claim as
        read is tried again (3 tries in about a second, within the kubelet's call), then
        refused with the reason (the kubelet asks again later)."""
        if self.kube is None:
            raise DraError(f"claim {ref}: no API server to read it from (--kubernetes off)")
        path = f"{RESOURCE_API}/namespaces/{ref.namespace}/resourceclaims/{ref.name}"
        retry = Retry(attempts=3, first=0.25, say=lambda line: self.say(f"claim {ref}: {line}"))
        try:
            answer = self.kube.request("GET", path, retry=retry, check=check_claim)
        except KubeError as e:
            raise DraError(f"claim {ref}: {e}") from None
        return cast(ResourceClaim, answer)  # check_claim found what claim_plan reads as typed

    def prepare(self, refs: list[ClaimRef]) -> dict[str, Prepared | str]:
        """claim uid -> its devices, or why it cannot be prepared."""
        out: dict[str, Prepared | str] = {}
        for ref in refs:
            try:
                check_ref(ref)
                claim = self.read_claim(ref)
                with self._lock:
                    out[ref.uid] = self._prepare(claim, ref)
            except CudatraceError as e:
                out[ref.uid] = str(e)
                self.say(f"claim {ref}: not prepared: {e}")
        return out

    def _prepare(self, claim: ResourceClaim, ref: ClaimRef) -> Prepared:
        assert self.inst is not None, "setup() first"
        plan = claim_plan(claim, ref, self.cfg, self.gpus)
        if not plan.shares:
            return Prepared()
        d = claim_dir(self.cfg.state, ref.uid)
        try:
            if d.is_symlink():
                raise DraError(f"{d} is a symbolic link; refusing to use it")
            d.mkdir(mode=0o755, exist_ok=True)
            os.chmod(d, 0o1777)  # a shared ledger directory: members of any uid (docs/budgets.md)
            cdi.shared_mark(d)
            fence_record.write(record_file(self.cfg.state, ref.uid), claim_record(plan, self.cfg))
        except OSError as e:
            raise DraError(f"cannot make {d}: {e.strerror}") from None
        except fence_record.FenceRecordError as e:
            raise DraError(str(e)) from None
        cdi.write_spec(spec_file(self.cfg, ref.uid), claim_spec(plan, self.cfg, self.inst))
        sizes = ", ".join(f"{n} bytes of GPU {i}" for i, n in plan.per_gpu().items())
        self.say(f"claim {ref} ({ref.uid}) prepared: {sizes}")
        return prepared(plan, self.cfg)

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        """claim uid -> '' once unprepared, or why not."""
        out: dict[str, str] = {}
        for ref in refs:
            try:
                check_ref(ref)
                with self._lock:
                    self._unprepare(ref)
                out[ref.uid] = ""
            except CudatraceError as e:
                out[ref.uid] = str(e)
                self.say(f"claim {ref}: not unprepared: {e}")
        return out

    def _unprepare(self, ref: ClaimRef) -> None:
        for path in (spec_file(self.cfg, ref.uid), record_file(self.cfg.state, ref.uid)):
            try:  # the spec first: no container starts with a record gone
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise DraError(f"cannot remove {path}: {e.strerror}") from None
        gone = self._forget(claim_dir(self.cfg.state, ref.uid))
        self.say(f"claim {ref} ({ref.uid}) unprepared" + ("" if gone else "; " + gone))

    def _forget(self, d: Path) -> str:
        """Remove a claim's ledger directory once no member lives; '' when it is gone, else
        why it stays (for now)."""
        from ..record.ledger import LedgerError

        if not d.exists():
            return ""
        try:
            if not cdi.ledger_dir_idle(d):
                return f"{d} kept while a member lives"
            cdi.remove_group_dir(d)
        except (LedgerError, OSError) as e:
            return f"{d} kept: {e}"
        return ""

    def sweep(self) -> None:
        """Remove the ledger directories of claims no longer prepared (no spec) once idle."""
        base = Path(self.cfg.state).absolute() / CLAIMS_DIR
        with self._lock:
            try:
                names = sorted(n for n in os.listdir(base) if not n.startswith("."))
            except OSError:
                return
            for uid in names:
                if not spec_file(self.cfg, uid).exists() and not self._forget(base / uid):
                    record_file(self.cfg.state, uid).unlink(missing_ok=True)
                    self.say(f"claim {uid}: its ledger directory is gone")

    # ---- the ResourceSlice ----------------------------------------------------------------

    def _owner(self) -> OwnerReference | None:
        """The node as the slice's owner (the slice goes when the node does), when readable."""
        assert self.kube is not None
        try:
            node = self.kube.request("GET", f"/api/v1/nodes/{self.cfg.node}")
            uid = need(node, "metadata", "uid", what=f"node {self.cfg.node}")
        except KubeError as e:
            self.say(f"the ResourceSlice has no owner (cannot read node {self.cfg.node}: {e})")
            return None
        return {"apiVersion": "v1", "kind": "Node", "name": self.cfg.node, "uid": uid,
                "controller": True}  # fmt: skip

    def publish(self, replace: bool = True) -> ResourceSlice | None:
        """Create the node's ResourceSlice, or (replace) write it over the one there with the
        next generation; without replace only a missing one is made (the kubelet removes a
        driver's slices when its plugin is away). Returns the slice written, None if none."""
        if self.kube is None:
            return None
        name = slice_name(self.cfg.node, self.cfg.driver)
        path = f"{RESOURCE_API}/resourceslices"
        what = f"the ResourceSlice {name}"
        try:
            cur: dict[str, Any] | None = self.kube.request("GET", f"{path}/{name}")
        except KubeError as e:
            if e.code != 404:
                raise
            cur = None
        if cur is not None and not replace:
            return None
        version = need(cur, "metadata", "resourceVersion", what=what) if cur is not None else ""
        self.generation = max(_generation(cur), self.generation) + 1
        obj = resource_slice(self.cfg, self.gpus, self.generation, self._owner())
        if cur is None:
            self.kube.request("POST", path, obj)
        else:
            obj["metadata"]["resourceVersion"] = version
            self.kube.request("PUT", f"{path}/{name}", obj)
        return obj

    def keep_published(self, resync: float) -> float:
        """One pass over the ResourceSlice: published (the first time, or after a failure, over
        the one there; else only when the kubelet removed it), or why not said and tried again
        after a pause that grows (1 s to 60 s). Returns the seconds until the next pass."""
        if self.kube is None:
            return resync
        now = time.monotonic()
        if now < self.next_publish:
            return min(resync, self.next_publish - now)
        name = slice_name(self.cfg.node, self.cfg.driver)
        try:
            obj = self.publish(replace=not self.published)
        except (KubeError, DraError) as e:
            pause = self.backoff.failed()
            self.next_publish = now + pause
            self.published = False
            self.say(f"cannot publish the ResourceSlice {name}: {e}; trying again in {pause:g} s")
            return min(resync, pause)
        if obj is not None:
            again = " again" if self.backoff.failures or self.publishes else ""
            self.say(f"published the ResourceSlice {name}{again} (generation {self.generation})")
            self.publishes += 1
        self.backoff.ok()
        self.published = True
        return resync
