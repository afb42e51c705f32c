"""What a cluster or a host needs to run cudatrace's container pieces, written out
(`cudatrace manifests kubernetes|systemd`):

Kubernetes (a YAML stream; each document is JSON, which YAML reads as it is):
  Namespace            labelled for the privileged Pod Security level (the node agent is)
  ServiceAccount, ClusterRole, ClusterRoleBinding   the node agent may create Events, no more
  ServiceAccount       the webhook's, without a token (it calls no API)
  ConfigMap            the groups config, when one is given
  DaemonSet            `cudatrace node` on each GPU node: host pid namespace (it maps members
                       in containers to host pids and reads their mappings), privileged
                       (/proc/<pid>/map_files), the install root, state and CDI directories
                       from the host, NVML through the NVIDIA runtime class
  Secret, Deployment, Service   `cudatrace webhook` over HTTPS, non-root, read-only
  MutatingWebhookConfiguration  pods on CREATE, only those annotated cudatrace.dev/budget
                       (matchConditions), failurePolicy Fail: such a pod is fenced or refused

systemd: a unit that runs `cudatrace node` on a host with Podman, Docker or containerd.
"""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path

from .plan import DEFAULT_ROOT, DEFAULT_STATE
from .webhook import ANN_BUDGET

APP = "cudatrace"
METRICS_PORT = 9478
WEBHOOK_PORT = 8443
CDI_DIR = "/var/run/cdi"
GROUPS_MOUNT = "/etc/cudatrace"


def _b64(path: Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def _meta(name: str, ns: str | None, **labels: str) -> dict:
    m: dict = {"name": name, "labels": {"app.kubernetes.io/name": APP, **labels}}
    if ns:
        m["namespace"] = ns
    return m


def _rbac(ns: str) -> list[dict]:
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(f"{APP}-node", ns)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(f"{APP}-node", None),
            "rules": [
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                {
                    "apiGroups": ["events.k8s.io"],
                    "resources": ["events"],
                    "verbs": ["create", "patch"],
                },
            ],
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
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(f"{APP}-webhook", ns),
            "automountServiceAccountToken": False,
        },
    ]


def _host_dir(name: str, path: str) -> dict:
    return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def daemonset(
    ns: str,
    image: str,
    budgets: tuple[str, ...],
    groups: bool,
    runtime_class: str,
    node_selector: dict[str, str],
) -> dict:
    args = ["node", "--root", DEFAULT_ROOT, "--state", DEFAULT_STATE, "--cdi-dir", CDI_DIR,
            "--listen", f"0.0.0.0:{METRICS_PORT}"]  # fmt: skip
    for b in budgets:
        args += ["--budget", b]
    mounts: list[dict] = [
        {"name": "root", "mountPath": DEFAULT_ROOT},
        {"name": "state", "mountPath": DEFAULT_STATE},
        {"name": "cdi", "mountPath": CDI_DIR},
    ]
    volumes = [
        _host_dir("root", DEFAULT_ROOT),
        _host_dir("state", DEFAULT_STATE),
        _host_dir("cdi", CDI_DIR),
    ]
    if groups:
        args += ["--groups", f"{GROUPS_MOUNT}/groups.conf"]
        mounts.append({"name": "groups", "mountPath": GROUPS_MOUNT, "readOnly": True})
        volumes.append({"name": "groups", "configMap": {"name": f"{APP}-groups"}})
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": "node"}
    pod: dict = {
        "serviceAccountName": f"{APP}-node",
        "hostPID": True,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "node",
                "image": image,
                "command": ["cudatrace"],
                "args": args,
                "env": [
                    {
                        "name": "NODE_NAME",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    },
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
                ],
                "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
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
    if runtime_class:
        pod["runtimeClassName"] = runtime_class
    if node_selector:
        pod["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(f"{APP}-node", ns, **{"app.kubernetes.io/component": "node"}),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(METRICS_PORT),
                    },
                },
                "spec": pod,
            },
        },
    }


def _webhook_objects(ns: str, image: str, tls: dict[str, Path], replicas: int) -> list[dict]:
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": "webhook"}
    name = f"{APP}-webhook"
    secure = {
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "name": "webhook",
        "image": image,
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
        ],  # fmt: skip
        "ports": [{"name": "https", "containerPort": WEBHOOK_PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": WEBHOOK_PORT, "scheme": "HTTPS"}
        },
        "securityContext": secure,
        "resources": {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}},
        "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": True}],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": _meta(f"{name}-tls", ns),
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": _b64(tls["tls.crt"]), "tls.key": _b64(tls["tls.key"])},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(name, ns, **{"app.kubernetes.io/component": "webhook"}),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "automountServiceAccountToken": False,
                        "containers": [container],
                        "volumes": [{"name": "tls", "secret": {"secretName": f"{name}-tls"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(name, ns),
            "spec": {
                "selector": labels,
                "ports": [{"name": "https", "port": 443, "targetPort": WEBHOOK_PORT}],
            },
        },
        _webhook_configuration(ns, name, tls),
    ]


def _webhook_configuration(ns: str, name: str, tls: dict[str, Path]) -> dict:
    """Pods on CREATE, those annotated cudatrace.dev/budget only, to the webhook's Service;
    failurePolicy Fail: such a pod is fenced or refused, never admitted unfenced."""
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
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 5,
            }
        ],
    }


def kubernetes(
    image: str,
    tls: dict[str, Path],
    namespace: str = APP,
    budgets: tuple[str, ...] = (),
    groups_text: str | None = None,
    runtime_class: str = "nvidia",
    replicas: int = 2,
    node_selector: dict[str, str] | None = None,
) -> list[dict]:
    """Every object, in the order `kubectl apply` wants them."""
    docs: list[dict] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": _meta(
                namespace, None, **{"pod-security.kubernetes.io/enforce": "privileged"}
            ),
        }
    ]
    docs += _rbac(namespace)
    if groups_text is not None:
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(f"{APP}-groups", namespace),
                "data": {"groups.conf": groups_text},
            }
        )
    docs.append(
        daemonset(
            namespace, image, budgets, groups_text is not None, runtime_class, node_selector or {}
        )
    )
    docs += _webhook_objects(namespace, image, tls, replicas)
    return docs


def yaml_stream(docs: list[dict]) -> str:
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
