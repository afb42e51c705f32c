"""`cudatrace manifests kubernetes|systemd` (cudatrace/deploy/manifests.py): every Kubernetes
object is valid for Kubernetes' schema (kubernetes-validate, strict, the pinned version), and
the systemd unit is one systemd reads."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess

import pytest

from support.cli import checkout_env, cudatrace
from support.kube import DRA_VERSION, K8S_VERSION, validate


def documents(text: str) -> list[dict]:
    assert text.startswith("---\n")
    return [json.loads(part) for part in text.split("---\n")[1:]]


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.fail("openssl is needed (apt-get install openssl)")
    return tmp_path_factory.mktemp("tls")


def test_kubernetes_manifests_validate(tmp_path, tls_dir):
    groups = tmp_path / "groups.conf"
    groups.write_text("[team-a]\nbudget = 40GiB\n")
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "registry.example/cudatrace:1",
                  "--tls-dir", tls_dir, "--groups", groups, "--budget", "8GiB")  # fmt: skip
    assert r.returncode == 0, r.stderr
    docs = documents(r.stdout)
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert kinds == [
        ("Namespace", "cudatrace"), ("ServiceAccount", "cudatrace-node"),
        ("ClusterRole", "cudatrace-node"), ("ClusterRoleBinding", "cudatrace-node"),
        ("ClusterRole", "cudatrace-metrics-reader"), ("ConfigMap", "cudatrace-groups"),
        ("Secret", "cudatrace-node-metrics-tls"), ("DaemonSet", "cudatrace-node"),
        ("Service", "cudatrace-node"), ("ServiceAccount", "cudatrace-webhook"),
        ("Secret", "cudatrace-webhook-tls"), ("Deployment", "cudatrace-webhook"),
        ("Service", "cudatrace-webhook"), ("PodDisruptionBudget", "cudatrace-webhook"),
        ("MutatingWebhookConfiguration", "cudatrace"),
    ]  # fmt: skip
    for d in docs:
        validate(d)
    by = {d["kind"]: d for d in docs}
    ds = by["DaemonSet"]["spec"]["template"]["spec"]
    assert ds["hostPID"] and ds["containers"][0]["securityContext"]["privileged"]
    assert ds["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert ds["runtimeClassName"] == "nvidia" and ds["priorityClassName"] == "system-node-critical"
    agent = ds["containers"][0]
    args = agent["args"]
    assert args[:1] == ["node"] and "--budget" in args and "/etc/cudatrace/groups.conf" in args
    # metrics: on the pod's IP, HTTPS, to whom the API server allows; probes on the same port
    assert args[args.index("--listen") + 1] == "$(POD_IP):9478"
    assert args[args.index("--metrics-auth") + 1] == "kubernetes"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in agent[
        "env"
    ]
    assert agent["livenessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": "metrics",
        "scheme": "HTTPS",
    }
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    roles = [d for d in docs if d["kind"] == "ClusterRole"]
    verbs = {(g, r): v for d in roles[:1] for rule in d["rules"] for g in rule["apiGroups"]
             for r in rule["resources"] for v in [tuple(rule["verbs"])]}  # fmt: skip
    assert verbs == {("", "events"): ("create", "patch"), ("events.k8s.io", "events"): ("create", "patch"),
                     ("", "pods"): ("list",),
                     ("authentication.k8s.io", "tokenreviews"): ("create",),
                     ("authorization.k8s.io", "subjectaccessreviews"): ("create",)}  # fmt: skip
    assert roles[1]["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    crt = base64.b64decode([d for d in docs if d["kind"] == "Secret"][0]["data"]["tls.crt"])
    assert crt == (tls_dir / "metrics.crt").read_bytes()
    # the webhook: spread, critical, probed, at most one replica down by a drain
    pdb = by["PodDisruptionBudget"]["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"] == by["Deployment"]["spec"]["selector"]
    wpod = by["Deployment"]["spec"]["template"]["spec"]
    assert wpod["priorityClassName"] == "system-cluster-critical"
    assert wpod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert wpod["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert by["ConfigMap"]["data"]["groups.conf"] == groups.read_text()
    (wh,) = by["MutatingWebhookConfiguration"]["webhooks"]
    ca = base64.b64decode(wh["clientConfig"]["caBundle"])
    assert ca == (tls_dir / "ca.crt").read_bytes()
    assert wh["failurePolicy"] == "Fail" and wh["admissionReviewVersions"] == ["v1"]
    assert (
        "'cudatrace.dev/budget' in object.metadata.annotations"
        in wh["matchConditions"][0]["expression"]
    )
    assert wh["rules"][0]["resources"] == ["pods"] and wh["rules"][0]["operations"] == ["CREATE"]
    dep = by["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert dep["securityContext"]["runAsNonRoot"] and dep["args"][0] == "webhook"
    # the server certificate names the Service the configuration calls
    out = subprocess.run(["openssl", "x509", "-in", tls_dir / "tls.crt", "-noout", "-ext",
                          "subjectAltName"], capture_output=True, text=True).stdout  # fmt: skip
    assert "DNS:cudatrace-webhook.cudatrace.svc" in out, out


def test_kubernetes_manifests_refuse_what_nodes_cannot_offer(tmp_path, tls_dir):
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "x", "--tls-dir",
                  tls_dir, "--budget", "60%")  # fmt: skip
    assert r.returncode == 2 and "give a size" in r.stderr, r.stderr


def test_dra_manifests_validate(tls_dir):
    """--dra: the DeviceClass, the plugin's RBAC and DaemonSet, valid from the oldest version
    the manifests serve to the one where consumable capacity is beta; with the webhook or not."""
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "registry.example/cudatrace:1",
                  "--dra", "--no-webhook", "--kubelet-dir", "/var/lib/k0s/kubelet",
                  "--metrics-auth", "none")  # fmt: skip
    assert r.returncode == 0, r.stderr
    docs = documents(r.stdout)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Namespace", "cudatrace"), ("ServiceAccount", "cudatrace-node"),
        ("ClusterRole", "cudatrace-node"), ("ClusterRoleBinding", "cudatrace-node"),
        ("DaemonSet", "cudatrace-node"), ("Service", "cudatrace-node"),
        ("DeviceClass", "gpu-memory.cudatrace.dev"),
        ("ServiceAccount", "cudatrace-dra-plugin"), ("ClusterRole", "cudatrace-dra-plugin"),
        ("ClusterRoleBinding", "cudatrace-dra-plugin"), ("DaemonSet", "cudatrace-dra-plugin"),
    ]  # fmt: skip
    for d in docs:
        validate(d, K8S_VERSION)
        validate(d, DRA_VERSION)
    cls, role, ds = docs[6], docs[8], docs[10]
    assert cls["spec"]["selectors"] == [
        {"cel": {"expression": "device.driver == 'gpu.cudatrace.dev'"}}
    ]
    rules = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
             for r in rule["resources"]}  # fmt: skip
    assert rules == {
        ("resource.k8s.io", "resourceclaims"): {"get"},
        ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update",
                                                "patch", "delete"},
        ("", "nodes"): {"get"},
    }  # fmt: skip
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][:1] == ["dra-plugin"] and "--kubelet-dir" in c["args"]
    assert c["args"][c["args"].index("--kubelet-dir") + 1] == "/var/lib/k0s/kubelet"
    assert c["args"][c["args"].index("--gpu-cdi") + 1] == "nvidia.com/gpu={index}"
    vols = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    assert vols["registry"] == {
        "path": "/var/lib/k0s/kubelet/plugins_registry",
        "type": "Directory",
    }
    assert vols["plugin"]["path"] == "/var/lib/k0s/kubelet/plugins/gpu.cudatrace.dev"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert all(mounts[n] == vols[n]["path"] for n in vols)  # the same paths inside: the kubelet's
    assert pod["serviceAccountName"] == "cudatrace-dra-plugin" and "hostPID" not in pod
    assert pod["priorityClassName"] == "system-node-critical"
    assert c["args"][c["args"].index("--health-listen") + 1] == "$(POD_IP):9479"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health", "scheme": "HTTP"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # plain metrics (--metrics-auth none): HTTP, no token reviews in the agent's role
    agent = docs[4]["spec"]["template"]["spec"]["containers"][0]
    assert (
        "--metrics-auth" not in agent["args"]
        and agent["livenessProbe"]["httpGet"]["scheme"] == "HTTP"
    )
    assert [r["resources"] for r in docs[2]["rules"]] == [["events"], ["events"], ["pods"]]
    # both routes
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "x", "--dra",
                  "--tls-dir", tls_dir)  # fmt: skip
    assert r.returncode == 0, r.stderr
    kinds = [d["kind"] for d in documents(r.stdout)]
    assert "DeviceClass" in kinds and "MutatingWebhookConfiguration" in kinds


def test_the_dra_examples_of_the_docs_are_valid_objects():
    """Every YAML example of docs/kubernetes.md's DRA section (claims, templates, pods) is a
    valid object where consumable capacity is beta."""
    import re

    import yaml

    from support.paths import REPO

    text = (REPO / "docs" / "kubernetes.md").read_text()
    section = text.split("## Dynamic Resource Allocation", 1)[1]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    docs = [d for b in blocks for d in yaml.safe_load_all(b) if d]
    assert {d["kind"] for d in docs} == {"ResourceClaimTemplate", "Pod", "ResourceClaim"}
    for d in docs:
        validate(d, DRA_VERSION)
    claims = [d for d in docs if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate")]
    for c in claims:
        spec = c["spec"]["spec"] if c["kind"] == "ResourceClaimTemplate" else c["spec"]
        for r in spec["devices"]["requests"]:
            assert r["exactly"]["deviceClassName"] == "gpu-memory.cudatrace.dev"
            assert "memory" in r["exactly"]["capacity"]["requests"]


def test_manifests_refuse_a_stream_that_fences_nothing(tls_dir):
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "x", "--no-webhook")
    assert r.returncode == 2 and "give --dra" in r.stderr, r.stderr
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "x")
    assert r.returncode == 2 and "--tls-dir" in r.stderr, r.stderr
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "x", "--dra",
                  "--no-webhook", "--metrics-auth", "none", "--gpu-cdi", "gpu0")  # fmt: skip
    assert r.returncode == 2 and "VENDOR/CLASS=NAME" in r.stderr, r.stderr
    # the agents' authorized metrics need their certificate too
    r = cudatrace(
        checkout_env(), "manifests", "kubernetes", "--image", "x", "--dra", "--no-webhook"
    )
    assert r.returncode == 2 and "--tls-dir" in r.stderr and "metrics" in r.stderr, r.stderr
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "x", "--tls-dir", tls_dir,
                  "--scraper-namespace", "Monitoring!")  # fmt: skip
    assert r.returncode == 2 and "not a namespace" in r.stderr, r.stderr


def test_fail_open_and_network_policy(tls_dir):
    """--webhook-on-error allow: the webhook admits what it cannot read (with a warning) and the
    API server admits what it cannot reach (Ignore); --scraper-namespace: a NetworkPolicy."""
    r = cudatrace(checkout_env(), "manifests", "kubernetes", "--image", "x", "--tls-dir", tls_dir,
                  "--webhook-on-error", "allow", "--scraper-namespace", "monitoring",
                  "--scraper-namespace", "obs")  # fmt: skip
    assert r.returncode == 0, r.stderr
    by = {d["kind"]: d for d in documents(r.stdout)}
    (wh,) = by["MutatingWebhookConfiguration"]["webhooks"]
    assert wh["failurePolicy"] == "Ignore"
    args = by["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--on-error") + 1] == "allow"
    pol = by["NetworkPolicy"]
    validate(pol)
    (rule,) = pol["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9478}]
    assert rule["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "monitoring",
        "obs",
    ]
    assert pol["spec"]["podSelector"] == by["DaemonSet"]["spec"]["selector"]


def test_certificates_renewed_and_rotated_through_the_command(tmp_path):
    """--renew-tls: new certificates, the same caBundle; --new-ca: the old CA stays in it."""
    d = tmp_path / "tls"

    def stream(*extra):
        r = cudatrace(
            checkout_env(), "manifests", "kubernetes", "--image", "x", "--tls-dir", d, *extra
        )
        assert r.returncode == 0, r.stderr
        by = {(x["kind"], x["metadata"]["name"]): x for x in documents(r.stdout)}
        bundle = by[("MutatingWebhookConfiguration", "cudatrace")]["webhooks"][0]["clientConfig"][
            "caBundle"
        ]
        crt = by[("Secret", "cudatrace-webhook-tls")]["data"]["tls.crt"]
        return base64.b64decode(bundle).decode(), crt

    bundle, crt = stream()
    assert stream() == (bundle, crt)  # kept
    bundle2, crt2 = stream("--renew-tls")
    assert bundle2 == bundle and crt2 != crt
    bundle3, _ = stream("--new-ca")
    assert bundle3.count("BEGIN CERTIFICATE") == 2 and bundle3.endswith(bundle)


def test_systemd_unit(tmp_path):
    r = cudatrace(checkout_env(), "manifests", "systemd", "--budget", "8GiB", "--cdi-dir",
                  "/etc/cdi", "--listen", "127.0.0.1:9478")  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    (start,) = [l for l in lines if l.startswith("ExecStart=")]
    assert " node " in start and "--budget 8GiB" in start and "--cdi-dir /etc/cdi" in start
    assert "[Install]" in lines and "WantedBy=multi-user.target" in lines
    unit = tmp_path / "cudatrace-node.service"
    unit.write_text(r.stdout)
    if shutil.which("systemd-analyze"):
        v = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert v.returncode == 0 and not v.stderr.strip(), v.stderr
