"""The objects `cudatrace manifests kubernetes` deploys (manifests.py), as types: the subset of
their fields it sets. The pods they run are objects.py's (PodSpec, Container, Volume), shared
with the webhook; the DRA driver's DeviceClass is there too. tests/unit/test_objects_schema.py
holds each type's keys to the Kubernetes schema and validates the objects built.
"""

from __future__ import annotations

from typing import TypedDict, Union

from .objects import DeviceClass, LabelSelector, ObjectMeta, PodSpec

# ---- what `cudatrace manifests kubernetes` deploys ---------------------------------------------


class Namespace(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta


class _ServiceAccountRequired(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta


class ServiceAccount(_ServiceAccountRequired, total=False):
    automountServiceAccountToken: bool


class PolicyRule(TypedDict, total=False):
    apiGroups: list[str]
    resources: list[str]
    nonResourceURLs: list[str]
    verbs: list[str]


class ClusterRole(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    rules: list[PolicyRule]


class RoleRef(TypedDict):
    apiGroup: str
    kind: str
    name: str


class Subject(TypedDict):
    kind: str
    name: str
    namespace: str


class ClusterRoleBinding(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    roleRef: RoleRef
    subjects: list[Subject]


class ConfigMap(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    data: dict[str, str]


class Secret(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    type: str
    data: dict[str, str]  # base64


class _ServicePortRequired(TypedDict):
    port: int


class ServicePort(_ServicePortRequired, total=False):
    name: str
    protocol: str
    targetPort: int | str


class ServiceSpec(TypedDict, total=False):
    clusterIP: str
    selector: dict[str, str]
    ports: list[ServicePort]


class Service(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: ServiceSpec


class NetworkPolicyPeer(TypedDict):
    namespaceSelector: LabelSelector


class NetworkPolicyPort(TypedDict):
    protocol: str
    port: int


# `from` is a Python keyword: the class syntax cannot declare it
NetworkPolicyIngressRule = TypedDict(
    "NetworkPolicyIngressRule", {"from": list[NetworkPolicyPeer], "ports": list[NetworkPolicyPort]}
)


class NetworkPolicySpec(TypedDict):
    podSelector: LabelSelector
    policyTypes: list[str]
    ingress: list[NetworkPolicyIngressRule]


class NetworkPolicy(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: NetworkPolicySpec


class PodTemplate(TypedDict):
    metadata: ObjectMeta
    spec: PodSpec


class UpdateStrategy(TypedDict):
    type: str


class DaemonSetSpec(TypedDict):
    selector: LabelSelector
    updateStrategy: UpdateStrategy
    template: PodTemplate


class DaemonSet(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: DaemonSetSpec


class DeploymentSpec(TypedDict):
    replicas: int
    selector: LabelSelector
    template: PodTemplate


class Deployment(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: DeploymentSpec


class PodDisruptionBudgetSpec(TypedDict):
    maxUnavailable: int
    selector: LabelSelector


class PodDisruptionBudget(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PodDisruptionBudgetSpec


class ServiceReference(TypedDict):
    name: str
    namespace: str
    path: str
    port: int


class WebhookClientConfig(TypedDict):
    service: ServiceReference
    caBundle: str  # base64


class RuleWithOperations(TypedDict):
    operations: list[str]
    apiGroups: list[str]
    apiVersions: list[str]
    resources: list[str]
    scope: str


class MatchCondition(TypedDict):
    name: str
    expression: str  # CEL


class MutatingWebhook(TypedDict):
    name: str
    clientConfig: WebhookClientConfig
    rules: list[RuleWithOperations]
    matchConditions: list[MatchCondition]
    namespaceSelector: LabelSelector
    admissionReviewVersions: list[str]
    sideEffects: str
    failurePolicy: str
    reinvocationPolicy: str
    timeoutSeconds: int


class MutatingWebhookConfiguration(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    webhooks: list[MutatingWebhook]


# an object of `cudatrace manifests kubernetes`, in the order they are written
Manifest = Union[
    Namespace,
    ServiceAccount,
    ClusterRole,
    ClusterRoleBinding,
    ConfigMap,
    Secret,
    DaemonSet,
    Service,
    NetworkPolicy,
    DeviceClass,
    Deployment,
    PodDisruptionBudget,
    MutatingWebhookConfiguration,
]
