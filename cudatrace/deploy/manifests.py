"""What a cluster or a host needs to run cudatrace's container pieces, written out
(`cudatrace manifests kubernetes|systemd`):

Kubernetes (a YAML stream; each document is JSON, which YAML reads as it is; the streams of
tests/golden/manifests/ are these objects as a reviewer sees them):
  Namespace            labelled for the privileged Pod Security level (the node agent is)
  ServiceAccount, ClusterRole, ClusterRoleBinding   the node agent may create Events, list
                       pods (it asks for its node's, to verify who runs there) and (with
                       its metrics authorized) review tokens and access, no more
  ClusterRole          cudatrace-metrics-reader: get /metrics, for the operator to bind to the
                       scraper's ServiceAccount (metrics authorized)
  ConfigMap            the groups config, when one is given
  Secret               the agent's metrics certificate (metrics authorized)
  DaemonSet            `cudatrace node` on each GPU node, system-node-critical: host pid
                       namespace (it maps members in containers to host pids and reads their
                       mappings), privileged (/proc/<pid>/map_files), the install root, state
                       and CDI directories from the host, NVML through the NVIDIA runtime
                       class; metrics on the pod's IP, HTTPS and authorized by the API server
                       unless --metrics-auth none; liveness /healthz, readiness /readyz
  Service              cudatrace-node, headless: the agents' metrics (the name in their
                       certificate, a ServiceMonitor's target)
  NetworkPolicy        with --scraper-namespace: the agents admit only those namespaces
  ServiceAccount       the webhook's, without a token (it calls no API; --no-webhook: none
                       of the webhook's objects)
  Secret, Deployment, Service   `cudatrace webhook` over HTTPS, non-root, read-only, spread
                       over nodes, system-cluster-critical, liveness and readiness /healthz
  PodDisruptionBudget  at most one webhook replica down by a drain
  MutatingWebhookConfiguration  pods on CREATE, only those annotated cudatrace.dev/budget
                       (matchConditions), failurePolicy Fail: such a pod is fenced or refused
                       (--webhook-on-error allow: Ignore, the webhook admitting with a warning)

  DRA (--dra, before the webhook's; Kubernetes 1.34 or later, consumable capacity beta in 1.36):
  DeviceClass          gpu-memory.cudatrace.dev: the devices of the driver gpu.cudatrace.dev
  ServiceAccount, ClusterRole, ClusterRoleBinding   the plugin may read ResourceClaims and
                       Nodes and write ResourceSlices, no more
  DaemonSet            `cudatrace dra-plugin` on each GPU node, system-node-critical: its
                       sockets in the kubelet's plugins_registry and plugins/<driver>
                       directories, the install root, state and CDI directories from the
                       host, NVML through the runtime class; liveness /healthz (its loop and
                       both sockets answer), readiness /readyz (registered, slice published)

systemd: a unit that runs `cudatrace node` on a host with Podman, Docker or containerd.
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import dra as dra_api
from .manifest_objects import (
    ClusterRole,
    ClusterRoleBinding,
    DaemonSet,
    Deployment,
    Manifest,
    MutatingWebhookConfiguration,
    NetworkPolicy,
    PodDisruptionBudget,
    PolicyRule,
    Secret,
    Service,
    ServiceAccount,
)
from .objects import (
    Container,
    EnvVar,
    ObjectMeta,
    PodSpec,
    Probe,
    SecurityContext,
    Volume,
    VolumeMount,
)
from .plan import DEFAULT_ROOT, DEFAULT_STATE
from .webhook import ANN_BUDGET

APP = "cudatrace"
METRICS_PORT = 9478
DRA_HEALTH_PORT = 9479
WEBHOOK_PORT = 8443
CDI_DIR = "/var/run/cdi"
GROUPS_MOUNT = "/etc/cudatrace"
TLS_MOUNT = "/tls"
NODE_CRITICAL = "system-node-critical"  # the node's own daemons: evicted last, scheduled first
CLUSTER_CRITICAL = "system-cluster-critical"  # the webhook: pods are refused while it is away
POD_IP: EnvVar = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def _b64(path: Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def _meta(name: str, ns: str | None, **labels: str) -> ObjectMeta:
    m: ObjectMeta = {"name": name, "labels": {"app.kubernetes.io/name": APP, **labels}}
    if ns:
        m["namespace"] = ns
    return m


def _rbac(ns: str, reviews: bool) -> list[ServiceAccount | ClusterRole | ClusterRoleBinding]:
    """The agent's ServiceAccount and role; reviews: it may review tokens and access (the
    metrics authorized), and the role an operator binds to whoever scrapes."""
    rules: list[PolicyRule] = [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        # identities (identity.py): this node's pods, by fieldSelector spec.nodeName
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    if reviews:
        rules += [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
             "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
             "verbs": ["create"]},
        ]  # fmt: skip
    reader: ClusterRole = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(f"{APP}-metrics-reader", None),
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(f"{APP}-node", ns)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(f"{APP}-node", None),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(f"{APP}-node", None),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{APP}-node",
            },
            "subjects": [{"kind": "ServiceAccount", "name": f"{APP}-node", "namespace": ns}],
        },
        *([reader] if reviews else []),
    ]


def _host_dir(name: str, path: str) -> Volume:
    return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def _probe(path: str, port: int | str, scheme: str, period: int = 10, delay: int = 0) -> Probe:
    probe: Probe = {
        "httpGet": {"path": path, "port": port, "scheme": scheme},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
    }
    if delay:
        probe["initialDelaySeconds"] = delay
    return probe


def _agent_volumes(c: Cluster) -> tuple[list[str], list[VolumeMount], list[Volume]]:
    """(the agent's arguments past its directories, its mounts, its volumes)."""
    args: list[str] = []
    for b in c.budgets:
        args += ["--budget", b]
    mounts: list[VolumeMount] = [
        {"name": "root", "mountPath": DEFAULT_ROOT},
        {"name": "state", "mountPath": DEFAULT_STATE},
        {"name": "cdi", "mountPath": CDI_DIR},
    ]
    volumes = [
        _host_dir("root", DEFAULT_ROOT),
        _host_dir("state", DEFAULT_STATE),
        _host_dir("cdi", CDI_DIR),
    ]
    if c.groups_text is not None:
        args += ["--groups", f"{GROUPS_MOUNT}/groups.conf"]
        mounts.append({"name": "groups", "mountPath": GROUPS_MOUNT, "readOnly": True})
        volumes.append({"name": "groups", "configMap": {"name": f"{APP}-groups"}})
    if c.metrics_tls is not None:
        args += ["--metrics-cert", f"{TLS_MOUNT}/tls.crt", "--metrics-key", f"{TLS_MOUNT}/tls.key"]
        mounts.append({"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": f"{APP}-node-metrics-tls"}})
    if c.metrics_auth == "kubernetes":
        args += ["--metrics-auth", "kubernetes"]
    return args, mounts, volumes


def daemonset(c: Cluster) -> DaemonSet:
    """`cudatrace node` on each GPU node: its metrics on the pod's IP (HTTPS and authorized
    unless --metrics-auth none), its health for the kubelet's probes."""
    more, mounts, volumes = _agent_volumes(c)
    args = ["node", "--root", DEFAULT_ROOT, "--state", DEFAULT_STATE, "--cdi-dir", CDI_DIR,
            "--listen", f"$(POD_IP):{METRICS_PORT}", *more]  # fmt: skip
    scheme = "HTTPS" if c.metrics_tls is not None else "HTTP"
    pod: PodSpec = {
        "serviceAccountName": f"{APP}-node",
        "priorityClassName": NODE_CRITICAL,
        "hostPID": True,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "node",
                "image": c.image,
                "command": ["cudatrace"],
                "args": args,
                "env": _node_env(),
                "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
                "livenessProbe": _probe("/healthz", "metrics", scheme, delay=30),
                "readinessProbe": _probe("/readyz", "metrics", scheme),
                "securityContext": {"privileged": True},
                "resources": {
                    "requests": {"cpu": "50m", "memory": "64Mi"},
                    "limits": {"memory": "256Mi"},
                },  # fmt: skip
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
              "prometheus.io/scheme": scheme.lower()}  # fmt: skip
    return _node_daemonset(c, "node", pod, scrape)


def _node_env() -> list[EnvVar]:
    """The environment of the node's daemons: their node, their pod's address, every GPU (for
    NVML, its utility capability alone)."""
    return [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        POD_IP,
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
    ]


def _node_daemonset(
    c: Cluster, component: str, pod: PodSpec, annotations: Mapping[str, str] | None = None
) -> DaemonSet:
    """A DaemonSet of one of the node's daemons (component: node, dra-plugin), its pods on the
    runtime class and the nodes asked, rolled one node at a time."""
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component}
    if c.runtime_class:
        pod["runtimeClassName"] = c.runtime_class
    if c.node_selector:
        pod["nodeSelector"] = c.node_selector
    template: ObjectMeta = {"labels": labels}
    if annotations:
        template["annotations"] = dict(annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(
            f"{APP}-{component}", c.namespace, **{"app.kubernetes.io/component": component}
        ),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": template, "spec": pod},
        },
    }


def _agent_access(c: Cluster) -> list[Secret | Service | NetworkPolicy]:
    """The agents' metrics: their certificate, a headless Service (the certificate's name, a
    ServiceMonitor's target), and with --scraper-namespace a NetworkPolicy admitting only those
    namespaces."""
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": "node"}
    out: list[Secret | Service | NetworkPolicy] = []
    if c.metrics_tls is not None:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": _meta(f"{APP}-node-metrics-tls", c.namespace),
                "type": "kubernetes.io/tls",
                "data": {
                    "tls.crt": _b64(c.metrics_tls["metrics.crt"]),
                    "tls.key": _b64(c.metrics_tls["metrics.key"]),
                },
            }  # fmt: skip
        )
    out.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(f"{APP}-node", c.namespace),
            "spec": {
                "clusterIP": "None",
                "selector": labels,
                "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}],
            },
        }
    )
    if c.scraper_namespaces:
        out.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": _meta(f"{APP}-node-metrics", c.namespace),
                "spec": {
                    "podSelector": {"matchLabels": labels},
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {
                            "from": [
                                {
                                    "namespaceSelector": {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/metadata.name",
                                                "operator": "In",
                                                "values": list(c.scraper_namespaces),
                                            }
                                        ]
                                    }
                                }
                            ],
                            "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
                        }
                    ],
                },
            }  # fmt: skip
        )
    return out


def _webhook_objects(c: Cluster) -> list[Manifest]:
    """The webhook: its account, certificate, Deployment, Service, disruption budget and the
    MutatingWebhookConfiguration that calls it."""
    assert c.tls is not None
    ns, tls = c.namespace, c.tls
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": "webhook"}
    name = f"{APP}-webhook"
    account: ServiceAccount = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(name, ns),
        "automountServiceAccountToken": False,
    }
    secret: Secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(f"{name}-tls", ns),
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": _b64(tls["tls.crt"]), "tls.key": _b64(tls["tls.key"])},
    }
    service: Service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, ns),
        "spec": {
            "selector": labels,
            "ports": [{"name": "https", "port": 443, "targetPort": WEBHOOK_PORT}],
        },
    }
    disruption: PodDisruptionBudget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(name, ns),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }
    return [
        account,
        secret,
        _webhook_deployment(c, name, labels),
        service,
        disruption,
        _webhook_configuration(ns, name, tls, c.webhook_on_error),
    ]


def _webhook_deployment(c: Cluster, name: str, selected: Mapping[str, str]) -> Deployment:
    """The webhook's pods: spread over nodes, unprivileged, its certificate mounted."""
    labels = dict(selected)
    secure: SecurityContext = {
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container: Container = {
        "name": "webhook",
        "image": c.image,
        "command": ["cudatrace"],
        "args": [
            "webhook",
            "--cert",
            "/tls/tls.crt",
            "--key",
            "/tls/tls.key",
            "--listen",
            f"0.0.0.0:{WEBHOOK_PORT}",
            "--root",
            DEFAULT_ROOT,
            "--on-error",
            c.webhook_on_error,
        ],  # fmt: skip
        "ports": [{"name": "https", "containerPort": WEBHOOK_PORT}],
        "livenessProbe": _probe("/healthz", "https", "HTTPS", delay=5),
        "readinessProbe": _probe("/healthz", "https", "HTTPS", period=5),
        "securityContext": secure,
        "resources": {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}},
        "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, c.namespace, **{"app.kubernetes.io/component": "webhook"}),
        "spec": {
            "replicas": c.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": False,
                    "priorityClassName": CLUSTER_CRITICAL,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [container],
                    "volumes": [{"name": "tls", "secret": {"secretName": f"{name}-tls"}}],
                },
            },
        },
    }


def _webhook_configuration(
    ns: str, name: str, tls: Mapping[str, Path], on_error: str
) -> MutatingWebhookConfiguration:
    """Pods on CREATE, those annotated cudatrace.dev/budget only, to the webhook's Service;
    failurePolicy Fail: such a pod is fenced or refused, never admitted unfenced (on_error
    allow: Ignore, as the webhook admits what it cannot read)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": _meta(APP, None),
        "webhooks": [
            {
                "name": "pods.cudatrace.dev",
                "clientConfig": {
                    "service": {"name": name, "namespace": ns, "path": "/mutate", "port": 443},
                    "caBundle": _b64(tls["ca.crt"]),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "matchConditions": [
                    {
                        "name": "budget-annotated",
                        "expression": "has(object.metadata.annotations) && "
                        f"'{ANN_BUDGET}' in object.metadata.annotations",
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": [ns, "kube-system"],
                        }
                    ]
                },
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore" if on_error == "allow" else "Fail",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 5,
            }
        ],
    }


@dataclass(frozen=True)
class Cluster:
    """What `manifests kubernetes` was told. tls: the webhook's ca.crt, tls.crt, tls.key
    (None: no webhook); dra: the DRA driver's objects too."""

    image: str
    tls: dict[str, Path] | None
    namespace: str = APP
    budgets: tuple[str, ...] = ()
    groups_text: str | None = None
    runtime_class: str = "nvidia"
    replicas: int = 2
    node_selector: dict[str, str] = field(default_factory=dict)
    dra: bool = False
    kubelet_dir: str = dra_api.KUBELET_DIR
    gpu_cdi: str = dra_api.GPU_CDI
    metrics_auth: str = "kubernetes"  # or "none"
    metrics_tls: dict[str, Path] | None = None  # ca.crt, metrics.crt, metrics.key
    scraper_namespaces: tuple[str, ...] = ()
    webhook_on_error: str = "refuse"


def kubernetes(c: Cluster) -> list[Manifest]:
    """Every object, in the order `kubectl apply` wants them."""
    docs: list[Manifest] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": _meta(
                c.namespace, None, **{"pod-security.kubernetes.io/enforce": "privileged"}
            ),
        }
    ]
    docs += _rbac(c.namespace, c.metrics_auth == "kubernetes")
    if c.groups_text is not None:
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(f"{APP}-groups", c.namespace),
                "data": {"groups.conf": c.groups_text},
            }
        )
    access = _agent_access(c)
    docs += [d for d in access if d["kind"] == "Secret"]  # before the pods that mount it
    docs.append(daemonset(c))
    docs += [d for d in access if d["kind"] != "Secret"]
    if c.dra:
        docs += dra_objects(c)
    if c.tls is not None:
        docs += _webhook_objects(c)
    return docs


# ---- the DRA driver ---------------------------------------------------------------------------


def _dra_rbac(ns: str) -> list[ServiceAccount | ClusterRole | ClusterRoleBinding]:
    name = f"{APP}-dra-plugin"
    resource = "resource.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, ns)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(name, None),
            "rules": [
                {"apiGroups": [resource], "resources": ["resourceclaims"], "verbs": ["get"]},
                {
                    "apiGroups": [resource],
                    "resources": ["resourceslices"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(name, None),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        },  # fmt: skip
    ]


def dra_daemonset(c: Cluster) -> DaemonSet:
    """`cudatrace dra-plugin` on each GPU node, its sockets where the kubelet looks."""
    kd = c.kubelet_dir.rstrip("/")
    plugin_dir, registry = f"{kd}/plugins/{dra_api.DRIVER}", f"{kd}/plugins_registry"
    args = ["dra-plugin", "--root", DEFAULT_ROOT, "--state", DEFAULT_STATE, "--cdi-dir",
            CDI_DIR, "--kubelet-dir", kd, "--gpu-cdi", c.gpu_cdi,
            "--health-listen", f"$(POD_IP):{DRA_HEALTH_PORT}"]  # fmt: skip
    paths = {"root": DEFAULT_ROOT, "state": DEFAULT_STATE, "cdi": CDI_DIR, "plugin": plugin_dir}
    volumes = [_host_dir(n, p) for n, p in paths.items()]
    volumes.append({"name": "registry", "hostPath": {"path": registry, "type": "Directory"}})
    mounts: list[VolumeMount] = [
        {"name": n, "mountPath": p} for n, p in {**paths, "registry": registry}.items()
    ]
    pod: PodSpec = {
        "serviceAccountName": f"{APP}-dra-plugin",
        "priorityClassName": NODE_CRITICAL,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "plugin",
                "image": c.image,
                "command": ["cudatrace"],
                "args": args,
                "env": _node_env(),
                "ports": [{"name": "health", "containerPort": DRA_HEALTH_PORT}],
                "livenessProbe": _probe("/healthz", "health", "HTTP", delay=10),
                "readinessProbe": _probe("/readyz", "health", "HTTP"),
                "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False},
                "resources": {
                    "requests": {"cpu": "20m", "memory": "64Mi"},
                    "limits": {"memory": "256Mi"},
                },  # fmt: skip
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    return _node_daemonset(c, "dra-plugin", pod)


def dra_objects(c: Cluster) -> list[Manifest]:
    """The DeviceClass, the plugin's RBAC and its DaemonSet."""
    return [dra_api.device_class(), *_dra_rbac(c.namespace), dra_daemonset(c)]


def yaml_stream(docs: Sequence[Mapping[str, object]]) -> str:
    """A YAML stream of the documents (each JSON, which is YAML)."""
    return "".join(f"---\n{json.dumps(d, indent=2)}\n" for d in docs)


def systemd_unit(argv: list[str]) -> str:
    """A unit running `cudatrace node` (argv: the command line, the program first)."""
    return (
        "[Unit]\n"
        "Description=cudatrace node agent: GPU memory budgets for containers\n"
        "After=local-fs.target\n"
        "Before=podman.service docker.service containerd.service crio.service\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={shlex.join(argv)}\n"
        "Restart=on-failure\n"
        "RestartSec=2\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
