"""The Kubernetes objects cudatrace writes and reads, as types (cudatrace/deploy/objects.py,
manifest_objects.py), held to the pinned kubernetes-validate schemas (the test extra):

- every key of every type is a field the schema knows at that place (so a misspelt key, or a
  field of another object, fails), a key typed str, int or bool is that in the schema, and
  every type is reached from an object checked (a new type must be named here);
- the objects built (the rendered manifests of tests/golden/manifests/, the ResourceSlice and
  DeviceClass the DRA plugin posts, the Event the agent posts) declare in their types every
  key they hold, and are valid objects.

The CDI spec is no Kubernetes object (no schema here: tests/unit/test_cdi_spec.py holds it to
the CDI versions), and AdmissionReview is not served as a resource (no schema either); the
webhook's patched pod is validated in tests/unit/test_webhook_patch.py.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

import pytest

from cudatrace.deploy import dra, manifest_objects, objects
from cudatrace.deploy.kube import PodContainer, pod_event
from support import goldens
from support.kube import DRA_VERSION, K8S_VERSION, validate

# the root types and their definitions; the DRA objects are checked at the version that
# serves them with consumable capacity, everything else at the oldest the manifests support
ROOTS: list[tuple[type, str, str]] = [
    (objects.Pod, "io.k8s.api.core.v1.Pod", K8S_VERSION),
    (objects.Event, "io.k8s.api.core.v1.Event", K8S_VERSION),
    (objects.ResourceSlice, "io.k8s.api.resource.v1.ResourceSlice", DRA_VERSION),
    (objects.DeviceClass, "io.k8s.api.resource.v1.DeviceClass", DRA_VERSION),
    (objects.ResourceClaim, "io.k8s.api.resource.v1.ResourceClaim", DRA_VERSION),
    (manifest_objects.Namespace, "io.k8s.api.core.v1.Namespace", K8S_VERSION),
    (manifest_objects.ServiceAccount, "io.k8s.api.core.v1.ServiceAccount", K8S_VERSION),
    (manifest_objects.ClusterRole, "io.k8s.api.rbac.v1.ClusterRole", K8S_VERSION),
    (manifest_objects.ClusterRoleBinding, "io.k8s.api.rbac.v1.ClusterRoleBinding", K8S_VERSION),
    (manifest_objects.ConfigMap, "io.k8s.api.core.v1.ConfigMap", K8S_VERSION),
    (manifest_objects.Secret, "io.k8s.api.core.v1.Secret", K8S_VERSION),
    (manifest_objects.Service, "io.k8s.api.core.v1.Service", K8S_VERSION),
    (manifest_objects.NetworkPolicy, "io.k8s.api.networking.v1.NetworkPolicy", K8S_VERSION),
    (manifest_objects.DaemonSet, "io.k8s.api.apps.v1.DaemonSet", K8S_VERSION),
    (manifest_objects.Deployment, "io.k8s.api.apps.v1.Deployment", K8S_VERSION),
    (manifest_objects.PodDisruptionBudget, "io.k8s.api.policy.v1.PodDisruptionBudget",
     K8S_VERSION),
    (manifest_objects.MutatingWebhookConfiguration,
     "io.k8s.api.admissionregistration.v1.MutatingWebhookConfiguration", K8S_VERSION),
]  # fmt: skip
# types of no Kubernetes schema (the module docstring says why)
NO_SCHEMA = {
    "CdiMount", "CdiDeviceNode", "CdiEdits", "CdiDevice", "CdiSpec",
    "GroupVersionKind", "AdmissionRequest", "AdmissionReview", "AdmissionStatus",
    "AdmissionResponse", "AdmissionReviewAnswer", "PatchOp",
}  # fmt: skip
KINDS = {typ.__name__: typ for typ, _, _ in ROOTS}
LEAF = {str: "string", int: "integer", bool: "boolean"}


def definitions(version: str) -> dict:
    import kubernetes_validate  # type: ignore[import-untyped]  # no type information

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = base / f"v{version}-local-strict" / "_definitions.json"
    return json.loads(path.read_text())["$defs"]


def _resolve(schema: dict | bool, defs: dict) -> dict:
    if not isinstance(schema, dict):
        return {}  # additionalProperties: true or false
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def unknown_keys(td: type, schema: dict, defs: dict, at: str, reached: set | None = None) -> list:
    """`at.key` of every key of TypedDict td the schema does not know there (or whose type is
    another), following nested types into their fields' schemas."""
    node = _resolve(schema, defs)
    props = node.get("properties", {})
    out = []
    if reached is not None:
        reached.add(td.__name__)
    for key, typ in typing.get_type_hints(td).items():
        if key not in props:
            out.append(f"{at}.{key}: no such field")
            continue
        out += _follow(typ, props[key], defs, f"{at}.{key}", reached)
    return out


def _follow(typ, schema: dict, defs: dict, at: str, reached: set | None) -> list:
    schema = _resolve(schema, defs)
    origin = typing.get_origin(typ)
    if origin is typing.Union or origin is types.UnionType:
        return [x for a in typing.get_args(typ) for x in _follow(a, schema, defs, at, reached)]
    if origin is list:
        return _follow(typing.get_args(typ)[0], schema.get("items", {}), defs, f"{at}[]", reached)
    if origin is dict:
        more = schema.get("additionalProperties", {})
        return _follow(typing.get_args(typ)[1], more, defs, f"{at}{{}}", reached)
    if typing.is_typeddict(typ):
        return unknown_keys(typ, schema, defs, at, reached)
    kinds = schema.get("type")
    if typ in LEAF and kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if LEAF[typ] not in kinds:
            return [f"{at}: {typ.__name__}, the schema says {'/'.join(kinds)}"]
    return []


def undeclared(value, typ, at: str) -> list:
    """`at.key` of every key of value (an object built) its type does not declare."""
    origin = typing.get_origin(typ)
    if origin is typing.Union or origin is types.UnionType:
        tries = [undeclared(value, a, at) for a in typing.get_args(typ)]
        return [] if any(not t for t in tries) else tries[0]
    if typing.is_typeddict(typ):
        if not isinstance(value, dict):
            return [f"{at}: not an object"]
        hints = typing.get_type_hints(typ)
        out = []
        for k, v in value.items():
            out += undeclared(v, hints[k], f"{at}.{k}") if k in hints else [f"{at}.{k}"]
        return out
    if origin is list and isinstance(value, list):
        return [x for i, v in enumerate(value) for x in undeclared(v, typing.get_args(typ)[0],
                                                                    f"{at}[{i}]")]  # fmt: skip
    if origin is dict and isinstance(value, dict):
        item = typing.get_args(typ)[1]
        return [x for k, v in value.items() for x in undeclared(v, item, f"{at}.{k}")]
    return []


@pytest.mark.parametrize("td,name,version", ROOTS, ids=[r[0].__name__ for r in ROOTS])
def test_every_key_is_a_field_of_the_schema(td, name, version):
    defs = definitions(version)
    assert unknown_keys(td, defs[name], defs, td.__name__) == []


def test_every_type_is_checked():
    reached: set = set()
    for td, name, version in ROOTS:
        defs = definitions(version)
        unknown_keys(td, defs[name], defs, td.__name__, reached)
    declared = {
        n
        for module in (objects, manifest_objects)
        for n, v in vars(module).items()
        if typing.is_typeddict(v) and not n.startswith("_") and v.__module__ == module.__name__
    }
    assert declared - NO_SCHEMA - reached == set(), "a type no object checked reaches"
    assert NO_SCHEMA <= declared
    kinds = {a.__name__ for a in typing.get_args(manifest_objects.Manifest)}
    assert kinds <= set(KINDS)


class _Probe(typing.TypedDict):
    periodSecond: int  # periodSeconds


class _Container(typing.TypedDict, total=False):
    name: str
    volumeMount: list[objects.VolumeMount]  # volumeMounts
    readinessProbe: _Probe
    tty: str  # a bool


class _PodSpec(typing.TypedDict):
    containers: list[_Container]


class _Pod(typing.TypedDict):
    spec: _PodSpec


def test_a_misspelt_key_or_a_wrong_type_is_found():
    defs = definitions(K8S_VERSION)
    assert unknown_keys(_Pod, defs["io.k8s.api.core.v1.Pod"], defs, "Pod") == [
        "Pod.spec.containers[].volumeMount: no such field",
        "Pod.spec.containers[].readinessProbe.periodSecond: no such field",
        "Pod.spec.containers[].tty: str, the schema says boolean/null",
    ]
    built = {"spec": {"containers": [{"name": "c", "volumeMounts": []}]}}
    assert undeclared(built, _Pod, "Pod") == ["Pod.spec.containers[0].volumeMounts"]


def built_objects() -> list[tuple[dict, type, str]]:
    """(object, its type, the version to validate it at) of what cudatrace posts and renders."""
    gpus = [dra.Gpu(0, "GPU-5ca1ab1e-0000-4000-8000-000000000000", "NVIDIA H200", 141 << 30)]
    owner: objects.OwnerReference = {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1",
                                     "uid": "7d1c2b3a-0000-4000-8000-0000000000aa",
                                     "controller": True}  # fmt: skip
    cfg = dra.PluginConfig(node="gpu-node-1")
    slice_ = dra.resource_slice(cfg, gpus, generation=2, owner=owner)
    slice_["metadata"]["resourceVersion"] = "41"  # as publish() writes it over the one there
    who = PodContainer("ml", "trainer", "main", "7d1c2b3a-0000-4000-8000-0000000000ab")
    out: list[tuple[dict, type, str]] = [
        (dict(slice_), objects.ResourceSlice, DRA_VERSION),
        (dict(dra.device_class()), objects.DeviceClass, DRA_VERSION),
        (dict(pod_event(who, "GpuMemoryDenied", "denied", "gpu-node-1")), objects.Event,
         K8S_VERSION),
    ]  # fmt: skip
    for path in sorted((goldens.GOLDEN / "manifests").glob("*.yaml")):
        for part in path.read_text().split("---\n")[1:]:
            doc = json.loads(part)
            out.append((doc, KINDS[doc["kind"]], K8S_VERSION))
    return out


def test_the_objects_built_are_their_types_and_valid():
    objs = built_objects()
    kinds = {o["kind"] for o, _, _ in objs}
    assert set(KINDS) - kinds == {"Pod", "ResourceClaim"}  # the patched pod, the claim read
    for obj, typ, version in objs:
        assert undeclared(obj, typ, obj["kind"]) == []
        validate(obj, version)
