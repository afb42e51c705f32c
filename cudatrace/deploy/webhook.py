"""The mutating admission webhook (`cudatrace webhook`): a pod annotated `cudatrace.dev/budget:
8GiB` gets, in its GPU containers only, the edits a CDI device gives (plan.py), as a JSONPatch
in an `admission.k8s.io/v1` AdmissionReview response (served by admission.py).

Which containers: those of `spec.containers` that request a GPU (a resource of --gpu-resource,
default nvidia.com/gpu and nvidia.com/mig-*, or a DRA claim), or exactly those the annotation
`cudatrace.dev/containers: a,b` names. Init containers and sidecars (init containers that
keep running) are never touched, nor containers that ask for no GPU.

What each gets:
- the preload library: the node's install (`<root>/shim/<id>`, made by `cudatrace node`)
  mounted read-only, and its `ld.so.preload` file over /etc/ld.so.preload (hostPath volumes of
  type Directory and File: a node without that install fails the pod's start, visibly, rather
  than running it unfenced);
- the group's ledger directory: an emptyDir of the pod in memory, mounted into its GPU
  containers alone, gone with the pod; the ledgers go in a directory below it that the first
  member makes (the emptyDir itself is mode 0777, which the ledger refuses);
- the fence, sealed (docs/budgets.md, "The sealed fence"): its record (fence_record.render: the
  group `pod-<the admission's uid>`, the pod's own in its own ledger directory; the budget in
  bytes; on-exceed; refuse on fence errors) is the pod's annotation cudatrace.dev/fence, mounted
  read-only at /etc/cudatrace/fence through the downward API (a subPath: a regular file), which
  the preload library reads for itself: nothing a container's processes set can raise it;
- the environment: the same fence in the environment contract's variables, and the names the
  node agent labels metrics and Events with (namespace, pod, container, the pod's uid).
  Environment variables of the container named CUDATRACE_* are replaced.

The pod is marked `cudatrace.dev/patched: <id>`; a marked pod is left as it is (reinvocation).
A budget that cannot be read, a container name that does not exist, a volume or mount in the
way: the pod is refused with the reason, never admitted unfenced.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass

from .. import fence_record, settings
from ..errors import CudatraceError
from .install import PRELOAD_NAME, SHIM_DIR, preload_path
from .objects import (
    AdmissionResponse,
    AdmissionReview,
    AdmissionReviewAnswer,
    Container,
    EnvVar,
    EnvVarSource,
    PatchOp,
    Pod,
    Volume,
    VolumeMount,
)
from .plan import (
    CONTAINER_LEDGER_DIR,
    VENDOR,
    Fence,
    PlanError,
    budget_bytes,
    check_on_exceed,
    record,
)

ANN_BUDGET = f"{VENDOR}/budget"
ANN_CONTAINERS = f"{VENDOR}/containers"
ANN_ON_EXCEED = f"{VENDOR}/on-exceed"
ANN_PATCHED = f"{VENDOR}/patched"
ANN_FENCE = f"{VENDOR}/fence"  # the sealed record, mounted through the downward API
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-*")
VOL_LIB, VOL_PRELOAD, VOL_LEDGER = "cudatrace-lib", "cudatrace-preload", "cudatrace-ledger"
VOL_FENCE = "cudatrace-fence"
LEDGER_SUBDIR = "pod"


class Refused(CudatraceError):
    """A pod the webhook refuses; the message says why (shown to whoever created it)."""


@dataclass(frozen=True)
class WebhookConfig:
    root: str  # the nodes' install root (cudatrace node --root)
    ident: str  # the install's id (install.shim_ident): the same build the nodes install
    gpu_resources: tuple[str, ...] = GPU_RESOURCES
    on_exceed: str = "fail"
    preload: str = "file"

    @property
    def shim_dir(self) -> str:
        return f"{self.root.rstrip('/')}/{SHIM_DIR}/{self.ident}"


def _pointer(*parts: object) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _is_gpu(resource: str, names: tuple[str, ...]) -> bool:
    return any(resource == n or (n.endswith("*") and resource.startswith(n[:-1])) for n in names)


def gpu_containers(pod: Pod, cfg: WebhookConfig) -> list[int]:
    """Indexes in spec.containers of the containers to fence."""
    containers = pod.get("spec", {}).get("containers") or []
    named = (pod.get("metadata", {}).get("annotations") or {}).get(ANN_CONTAINERS)
    if named is not None:
        want = [n.strip() for n in named.split(",") if n.strip()]
        names = [c.get("name") for c in containers]
        missing = [n for n in want if n not in names]
        if missing or not want:
            raise Refused(
                f"{ANN_CONTAINERS}: no container named {', '.join(missing) or '(none given)'} "
                f"in spec.containers ({', '.join(map(str, names))})"
            )
        return [i for i, c in enumerate(containers) if c.get("name") in want]
    out = []
    for i, c in enumerate(containers):
        res = c.get("resources") or {}
        asked = list(res.get("limits") or {}) + list(res.get("requests") or {})
        if res.get("claims") or any(_is_gpu(r, cfg.gpu_resources) for r in asked):
            out.append(i)
    return out


def _fence(pod: Pod, cfg: WebhookConfig, group: str) -> Fence:
    ann = pod.get("metadata", {}).get("annotations") or {}
    try:
        budget = budget_bytes(ann[ANN_BUDGET], ANN_BUDGET)
        on_exceed = check_on_exceed(ann.get(ANN_ON_EXCEED, cfg.on_exceed), ANN_ON_EXCEED)
    except PlanError as e:
        raise Refused(str(e)) from None
    return Fence("pod", group, budget, on_exceed)


LEDGER_DIR = f"{CONTAINER_LEDGER_DIR}/{LEDGER_SUBDIR}"


def pod_record(fence: Fence, namespace: str) -> fence_record.FenceRecord:
    """The pod's sealed record: its group in its own ledger directory, which the first member
    makes (the emptyDir is the pod's alone; mode 0777, which a ledger directory may not be)."""
    return record(fence, LEDGER_DIR, owner=f"pod of namespace {namespace}", make_dir=True)


def _field(path: str) -> EnvVarSource:
    """A value from the downward API: the pod's own field at `path`."""
    return {"fieldRef": {"fieldPath": path}}


def container_env(c: Container, fence: Fence, namespace: str, cfg: WebhookConfig) -> list[EnvVar]:
    """The container's environment: its own (less CUDATRACE_*), the names the node agent
    labels with, then the fence's (fence_record.render: LD_PRELOAD with the library first
    under --preload env, the application's own after it)."""
    own = [e for e in c.get("env") or [] if not str(e.get("name", "")).startswith(settings.PREFIX)]
    theirs = [e.get("value", "") for e in own if e.get("name") == "LD_PRELOAD"]
    shim = preload_path(cfg.shim_dir) if cfg.preload == "env" else None  # musl passes it by
    rendered = fence_record.render(pod_record(fence, namespace), shim, (theirs or [""])[-1])
    if shim:
        own = [e for e in own if e.get("name") != "LD_PRELOAD"]
    return own + [
        {"name": settings.name("K8S_NAMESPACE"), "value": namespace},
        {"name": settings.name("K8S_POD"), "valueFrom": _field("metadata.name")},
        {"name": settings.name("K8S_POD_UID"), "valueFrom": _field("metadata.uid")},
        {"name": settings.name("K8S_CONTAINER"), "value": c["name"]},
        *(EnvVar(name=k, value=v) for k, v in rendered.env),
    ]


def _mounts(cfg: WebhookConfig) -> list[VolumeMount]:
    m: list[VolumeMount] = [
        {"name": VOL_LIB, "mountPath": cfg.shim_dir, "readOnly": True},
        # a subPath: the container sees a regular file (a downward API volume's files are
        # links), read-only
        {
            "name": VOL_FENCE,
            "mountPath": fence_record.path(),
            "subPath": "fence",
            "readOnly": True,
        },  # fmt: skip
    ]
    if cfg.preload == "file":
        m.append({"name": VOL_PRELOAD, "mountPath": "/etc/ld.so.preload", "readOnly": True})
    m.append({"name": VOL_LEDGER, "mountPath": CONTAINER_LEDGER_DIR})
    return m


def _volumes(cfg: WebhookConfig) -> list[Volume]:
    ann = f"metadata.annotations['{ANN_FENCE}']"
    v: list[Volume] = [
        {"name": VOL_LIB, "hostPath": {"path": cfg.shim_dir, "type": "Directory"}},
        {
            "name": VOL_FENCE,
            "downwardAPI": {
                "items": [{"path": "fence", "fieldRef": {"fieldPath": ann}}],
                "defaultMode": 0o444,
            },  # fmt: skip
        },
    ]
    if cfg.preload == "file":
        v.append(
            {
                "name": VOL_PRELOAD,
                "hostPath": {"path": f"{cfg.shim_dir}/{PRELOAD_NAME}", "type": "File"},
            }
        )
    v.append({"name": VOL_LEDGER, "emptyDir": {"medium": "Memory", "sizeLimit": "4Mi"}})
    return v


def _check_room(pod: Pod, idx: list[int], cfg: WebhookConfig) -> None:
    spec = pod["spec"]
    ours = {v["name"] for v in _volumes(cfg)}
    taken = ours & {v.get("name") for v in spec.get("volumes") or []}
    if taken:
        raise Refused(f"the pod already has a volume named {sorted(taken)[0]}")
    paths = {m["mountPath"] for m in _mounts(cfg)}
    for i in idx:
        c = spec["containers"][i]
        clash = paths & {m.get("mountPath") for m in c.get("volumeMounts") or []}
        if clash:
            raise Refused(f"container {c['name']} already mounts {sorted(clash)[0]}")


def patch_for(
    pod: Pod, namespace: str, cfg: WebhookConfig, admission: str = ""
) -> tuple[list[PatchOp], list[str]]:
    """(JSONPatch operations, warnings) for a pod; ([], ...) when it is left alone. admission:
    the AdmissionReview's uid, which names the pod's group (the pod's own uid is not known
    yet when it is admitted)."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    if ANN_BUDGET not in ann or ANN_PATCHED in ann:
        return [], []
    group = "pod-" + ("".join(c for c in admission if c.isalnum() or c == "-")[:56] or
                      os.urandom(8).hex())  # fmt: skip
    fence = _fence(pod, cfg, group)
    idx = gpu_containers(pod, cfg)
    if not idx:
        return [], [
            f"cudatrace: {ANN_BUDGET} is set but no container asks for a GPU "
            f"({', '.join(cfg.gpu_resources)}); name them in {ANN_CONTAINERS}"
        ]
    _check_room(pod, idx, cfg)
    spec = pod["spec"]
    ops: list[PatchOp] = []
    if spec.get("volumes") is None:
        ops.append({"op": "add", "path": "/spec/volumes", "value": _volumes(cfg)})
    else:
        ops += [{"op": "add", "path": "/spec/volumes/-", "value": v} for v in _volumes(cfg)]
    for i in idx:
        c = spec["containers"][i]
        env = container_env(c, fence, namespace, cfg)
        ops.append(
            {
                "op": "replace" if c.get("env") is not None else "add",
                "path": _pointer("spec", "containers", i, "env"),
                "value": env,
            }
        )
        if c.get("volumeMounts") is None:
            ops.append(
                {
                    "op": "add",
                    "path": _pointer("spec", "containers", i, "volumeMounts"),
                    "value": _mounts(cfg),
                }  # fmt: skip
            )
        else:
            ops += [
                {
                    "op": "add",
                    "path": _pointer("spec", "containers", i, "volumeMounts", "-"),
                    "value": m,
                }  # fmt: skip
                for m in _mounts(cfg)
            ]
    text = fence_record.render(pod_record(fence, namespace)).text
    ops.append({"op": "add", "path": _pointer("metadata", "annotations", ANN_FENCE),
                "value": text})  # fmt: skip
    ops.append({"op": "add", "path": _pointer("metadata", "annotations", ANN_PATCHED),
                "value": cfg.ident})  # fmt: skip
    return ops, []


def review(body: AdmissionReview, cfg: WebhookConfig) -> AdmissionReviewAnswer:
    """The AdmissionReview response to an AdmissionReview request."""
    req = body.get("request") or {}
    resp: AdmissionResponse = {"uid": req.get("uid", ""), "allowed": True}
    kind = (req.get("kind") or {}).get("kind")
    obj: Pod = req.get("object") or {}
    if kind == "Pod" and req.get("operation", "CREATE") == "CREATE" and isinstance(obj, dict):
        try:
            ns = req.get("namespace") or (obj.get("metadata") or {}).get("namespace") or "default"
            ops, warnings = patch_for(obj, ns, cfg, str(req.get("uid", "")))
        except Refused as e:
            resp = {
                "uid": resp["uid"],
                "allowed": False,
                "status": {"code": 400, "message": f"cudatrace: {e}"},
            }
            ops, warnings = [], []
        if ops:
            resp["patchType"] = "JSONPatch"
            resp["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        if warnings:
            resp["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}
