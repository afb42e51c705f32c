"""The Kubernetes and CDI objects cudatrace writes, as types: the subset of their fields it sets
(CDI specs: cdi.py and dra.py; the admission webhook's JSONPatch of a pod, and the pod as it
reads it: webhook.py; Events: kube.py; the DRA driver's ResourceSlice and DeviceClass, and the
ResourceClaim as dra.py reads it once check_claim has checked it: dra.py; the pods of the
manifests' daemons: manifests.py, the other objects it deploys in manifest_objects.py). What
the API server answers otherwise is read field by field as anything (kube.py `need`), not
typed here. tests/unit/test_objects_schema.py holds each type's keys to the Kubernetes schema
(kubernetes-validate's) and validates the objects built.
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


class ConfigMapSource(TypedDict):
    name: str


class SecretSource(TypedDict):
    secretName: str


class _VolumeRequired(TypedDict):
    name: str


class Volume(_VolumeRequired, total=False):
    hostPath: HostPathSource
    downwardAPI: DownwardSource
    emptyDir: EmptyDirSource
    configMap: ConfigMapSource
    secret: SecretSource


class ResourceRequirements(TypedDict, total=False):
    limits: dict[str, str]
    requests: dict[str, str]
    claims: list[dict[str, str]]


class ContainerPort(TypedDict):
    name: str
    containerPort: int


class HttpGet(TypedDict):
    path: str
    port: int | str  # a number or a port's name
    scheme: str  # HTTP, HTTPS


class _ProbeRequired(TypedDict):
    httpGet: HttpGet
    periodSeconds: int
    timeoutSeconds: int
    failureThreshold: int


class Probe(_ProbeRequired, total=False):
    initialDelaySeconds: int


class Capabilities(TypedDict):
    drop: list[str]


class SeccompProfile(TypedDict):
    type: str


class SecurityContext(TypedDict, total=False):
    privileged: bool
    runAsNonRoot: bool
    runAsUser: int
    allowPrivilegeEscalation: bool
    readOnlyRootFilesystem: bool
    capabilities: Capabilities
    seccompProfile: SeccompProfile


class Container(TypedDict, total=False):
    """A container of a pod: as the webhook reads it (name, env, resources, volumeMounts: the
    fields it reads and patches) and as the manifests' daemons run."""

    name: str
    image: str
    command: list[str]
    args: list[str]
    env: list[EnvVar]
    ports: list[ContainerPort]
    livenessProbe: Probe
    readinessProbe: Probe
    securityContext: SecurityContext
    resources: ResourceRequirements
    volumeMounts: list[VolumeMount]


class Toleration(TypedDict):
    operator: str  # Exists


class LabelSelectorRequirement(TypedDict):
    key: str
    operator: str  # In, NotIn
    values: list[str]


class LabelSelector(TypedDict, total=False):
    matchLabels: dict[str, str]
    matchExpressions: list[LabelSelectorRequirement]


class TopologySpreadConstraint(TypedDict):
    maxSkew: int
    topologyKey: str
    whenUnsatisfiable: str
    labelSelector: LabelSelector


class PodSpec(TypedDict, total=False):
    """A pod's spec: as the webhook reads it (containers, volumes) and as the manifests' pods
    run."""

    serviceAccountName: str
    automountServiceAccountToken: bool
    priorityClassName: str
    hostPID: bool
    tolerations: list[Toleration]
    topologySpreadConstraints: list[TopologySpreadConstraint]
    containers: list[Container]
    volumes: list[Volume]
    runtimeClassName: str
    nodeSelector: dict[str, str]


class _OwnerReferenceRequired(TypedDict):
    apiVersion: str
    kind: str
    name: str
    uid: str


class OwnerReference(_OwnerReferenceRequired, total=False):
    controller: bool


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    annotations: dict[str, str]
    labels: dict[str, str]
    ownerReferences: list[OwnerReference]
    resourceVersion: str


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


# ---- the DRA driver's objects (resource.k8s.io/v1) ---------------------------------------------


class DeviceAttribute(TypedDict, total=False):
    int: int
    string: str


class DeviceCapacity(TypedDict):
    value: str  # a quantity


class SliceDevice(TypedDict):
    name: str
    allowMultipleAllocations: bool
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]


class ResourcePool(TypedDict):
    name: str
    generation: int
    resourceSliceCount: int


class ResourceSliceSpec(TypedDict):
    driver: str
    nodeName: str
    pool: ResourcePool
    devices: list[SliceDevice]


class ResourceSlice(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: ResourceSliceSpec


class CelSelector(TypedDict):
    expression: str


class DeviceSelector(TypedDict):
    cel: CelSelector


class DeviceClassSpec(TypedDict):
    selectors: list[DeviceSelector]


class DeviceClass(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: DeviceClassSpec


class AllocationResult(TypedDict, total=False):
    """One device of a claim's allocation, as dra.py reads it (check_claim checked that each
    of these fields, when there, is a string; the consumed memory a string or a number)."""

    request: str
    driver: str
    pool: str
    device: str
    consumedCapacity: dict[str, str | int]


class DeviceAllocation(TypedDict, total=False):
    results: list[AllocationResult]


class Allocation(TypedDict, total=False):
    devices: DeviceAllocation


class ClaimStatus(TypedDict, total=False):
    allocation: Allocation


class ClaimMeta(TypedDict, total=False):
    """A claim's metadata as dra.py reads it: its uid (checked a string) and its owners (each
    checked an object, its fields compared, never trusted to be of a type)."""

    uid: str
    ownerReferences: list[dict[str, object]]


class ResourceClaim(TypedDict, total=False):
    """A ResourceClaim as the API server answered it, once check_claim has found the fields
    claim_plan reads as they must be."""

    metadata: ClaimMeta
    status: ClaimStatus
