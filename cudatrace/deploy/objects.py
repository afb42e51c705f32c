"""The Kubernetes and CDI objects cudatrace writes, as types: the subset of their fields it sets
(CDI specs: cdi.py and dra.py; the admission webhook's JSONPatch of a pod, and the pod as it
reads it: webhook.py; Events: kube.py). What the API server answers otherwise is read field by
field as anything (kube.py `need`), not typed here.
"""

from __future__ import annotations

from typing import TypedDict, Union

# ---- CDI (the Container Device Interface's spec, cdiVersion 0.3.0 to 0.7.0) -------------------


class _CdiMountRequired(TypedDict):
    hostPath: str
    containerPath: str


class CdiMount(_CdiMountRequired, total=False):
    type: str  # 0.4.0
    options: list[str]


class CdiDeviceNode(TypedDict, total=False):
    path: str
    hostPath: str  # 0.5.0


class CdiEdits(TypedDict, total=False):
    """containerEdits: of the spec, or of one device."""

    env: list[str]  # NAME=value
    mounts: list[CdiMount]
    deviceNodes: list[CdiDeviceNode]
    additionalGids: list[int]  # 0.7.0
    intelRdt: dict[str, str]  # 0.7.0


class _CdiDeviceRequired(TypedDict):
    name: str
    containerEdits: CdiEdits


class CdiDevice(_CdiDeviceRequired, total=False):
    annotations: dict[str, str]  # 0.6.0


class _CdiSpecRequired(TypedDict):
    cdiVersion: str
    kind: str  # vendor/class
    devices: list[CdiDevice]


class CdiSpec(_CdiSpecRequired, total=False):
    annotations: dict[str, str]  # 0.6.0
    containerEdits: CdiEdits


# ---- what the webhook adds to a pod (core/v1) --------------------------------------------------


class FieldRef(TypedDict):
    fieldPath: str


class EnvVarSource(TypedDict):
    fieldRef: FieldRef


class _EnvVarRequired(TypedDict):
    name: str


class EnvVar(_EnvVarRequired, total=False):
    value: str
    valueFrom: EnvVarSource


class _VolumeMountRequired(TypedDict):
    name: str
    mountPath: str


class VolumeMount(_VolumeMountRequired, total=False):
    subPath: str
    readOnly: bool


class HostPathSource(TypedDict):
    path: str
    type: str  # Directory, File


class DownwardItem(TypedDict):
    path: str
    fieldRef: FieldRef


class DownwardSource(TypedDict):
    items: list[DownwardItem]
    defaultMode: int


class EmptyDirSource(TypedDict):
    medium: str
    sizeLimit: str


class _VolumeRequired(TypedDict):
    name: str


class Volume(_VolumeRequired, total=False):
    hostPath: HostPathSource
    downwardAPI: DownwardSource
    emptyDir: EmptyDirSource


class ResourceRequirements(TypedDict, total=False):
    limits: dict[str, str]
    requests: dict[str, str]
    claims: list[dict[str, str]]


class Container(TypedDict, total=False):
    """A container of a pod as the webhook reads it (the fields it reads and patches)."""

    name: str
    env: list[EnvVar]
    resources: ResourceRequirements
    volumeMounts: list[VolumeMount]


class PodSpec(TypedDict, total=False):
    containers: list[Container]
    volumes: list[Volume]


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    annotations: dict[str, str]
    labels: dict[str, str]


class Pod(TypedDict, total=False):
    """A pod in an AdmissionReview, as the webhook reads it: JSON from the API server, its
    shape not checked beyond what admission.py checks (each read that fails is answered)."""

    metadata: ObjectMeta
    spec: PodSpec


# ---- AdmissionReview (admission.k8s.io/v1) ------------------------------------------------------


class GroupVersionKind(TypedDict, total=False):
    group: str
    version: str
    kind: str


class AdmissionRequest(TypedDict, total=False):
    """A review's request as the webhook reads it (admission.py checks each field it reads)."""

    uid: str
    kind: GroupVersionKind
    operation: str  # CREATE, UPDATE ...
    namespace: str
    object: Pod


class AdmissionReview(TypedDict, total=False):
    apiVersion: str
    kind: str
    request: AdmissionRequest


class AdmissionStatus(TypedDict):
    code: int
    message: str


class _AdmissionResponseRequired(TypedDict):
    uid: str
    allowed: bool


class AdmissionResponse(_AdmissionResponseRequired, total=False):
    status: AdmissionStatus  # why not allowed
    patchType: str  # JSONPatch
    patch: str  # base64 of the JSONPatch
    warnings: list[str]


class AdmissionReviewAnswer(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponse


PatchValue = Union[str, EnvVar, VolumeMount, Volume, list[EnvVar], list[VolumeMount], list[Volume]]


class PatchOp(TypedDict):
    """One JSONPatch (RFC 6902) operation of the webhook's patch."""

    op: str  # add, replace
    path: str  # a JSON pointer
    value: PatchValue


# ---- Events (core/v1) ---------------------------------------------------------------------------


class _ObjectReferenceRequired(TypedDict):
    apiVersion: str
    kind: str
    namespace: str
    name: str


class ObjectReference(_ObjectReferenceRequired, total=False):
    uid: str
    fieldPath: str


class EventMeta(TypedDict):
    generateName: str
    namespace: str


class EventSource(TypedDict):
    component: str
    host: str


class Event(TypedDict):
    apiVersion: str
    kind: str
    metadata: EventMeta
    involvedObject: ObjectReference
    reason: str
    message: str
    type: str  # Warning, Normal
    source: EventSource
    reportingComponent: str
    reportingInstance: str
    firstTimestamp: str
    lastTimestamp: str
    count: int
