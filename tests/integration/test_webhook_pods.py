"""The admission webhook for real, without a control plane: `cudatrace webhook` serves HTTPS
(a CA of the test's own), answers AdmissionReview requests for a GPU pod and for others; the
patched pod passes kubernetes-validate and then runs with `podman kube play --network=none`
(tests/support/podman.py), where its GPU container is fenced (denied over the pod's budget,
with the attributed line) and its other container is untouched.

Needs root (rootful Podman); with CI=true a missing piece fails, elsewhere it skips."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

import pytest

from cudatrace.deploy import install
from cudatrace.deploy.tls import make_tls
from support import children, jsonpatch
from support.cli import checkout_env
from support.kube import validate
from support.podman import HOST_PROC, STATE, podman  # noqa: F401  (fixture)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def webhook(podman, tmp_path):  # noqa: F811
    tls = make_tls(tmp_path / "tls", ["localhost"], ("127.0.0.1",))
    root = tmp_path / "root"
    inst = install.install(root)
    port = free_port()
    p = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "webhook",
            "--cert",
            str(tls["tls.crt"]),
            "--key",
            str(tls["tls.key"]),
            "--listen",
            f"127.0.0.1:{port}",
            "--root",
            str(root),
        ],  # fmt: skip
        env=checkout_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    line = children.readline(p, p.stderr)
    assert "serving https://" in line and str(inst.dir) in line, line
    ctx = ssl.create_default_context(cafile=str(tls["ca.crt"]))
    yield {"url": f"https://127.0.0.1:{port}", "ctx": ctx, "inst": inst}
    p.terminate()
    p.wait(timeout=30)


def post_review(webhook, obj: dict) -> dict:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "b0e8d9a6-4f4e-4bd8-9a55-0c0f5a1e7e01",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team",
            "operation": "CREATE",
            "object": obj,
        },
    }
    req = urllib.request.Request(
        webhook["url"] + "/mutate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, context=webhook["ctx"], timeout=30) as r:
        return json.loads(r.read())["response"]


def gpu_pod(podman, state, name: str) -> dict:  # noqa: F811
    """A pod as its author writes it (the simulated GPU wired in as a GPU would be)."""
    sim_env = [{"name": "CUDASIM_STATE", "value": STATE},
               {"name": "CUDASIM_HOST_PROC", "value": HOST_PROC}]  # fmt: skip
    sim_mounts = [{"name": "sim", "mountPath": STATE},
                  {"name": "hostproc", "mountPath": HOST_PROC, "readOnly": True}]  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team",
            "annotations": {"cudatrace.dev/budget": "1GiB"},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": podman.image,
                    # the process tries to raise its budget: the sealed record holds it
                    "command": [
                        "sh",
                        "-c",
                        "CUDATRACE_BUDGET=8589934592 CUDATRACE_GROUP=mine "
                        "exec hold --exit-after-ms 10 --free 3 400m",
                    ],  # fmt: skip
                    "env": sim_env,
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                    "volumeMounts": sim_mounts,
                },
                {
                    "name": "proxy",
                    "image": podman.image,
                    "command": [
                        "sh",
                        "-c",
                        "env; echo preload:; cat /etc/ld.so.preload; "
                        "hold --exit-after-ms 10 --free 3 400m",
                    ],  # fmt: skip
                    "env": sim_env,
                    "volumeMounts": sim_mounts,
                },
            ],
            "volumes": [
                {"name": "sim", "hostPath": {"path": str(state), "type": "File"}},
                {"name": "hostproc", "hostPath": {"path": "/proc", "type": "Directory"}},
            ],
        },
    }
    return json.loads(json.dumps(pod))  # as the API server has it: no list shared by two


def as_kubelet_would(pod: dict, tmp_path) -> dict:
    """The patched pod as Podman can play it: the kubelet writes a downward API volume's files
    (the fence record: the pod's annotation) and mounts the subPath's file read-only; Podman
    4.3 has no downward API volumes, so the file is written here, root's 0644, and mounted as a
    hostPath file, read-only, at the same place (and the annotation goes: Podman refuses
    annotation values over 63 bytes, which Kubernetes takes)."""
    pod = json.loads(json.dumps(pod))
    for v in pod["spec"]["volumes"]:
        api = v.pop("downwardAPI", None)
        if api is None:
            continue
        (item,) = api["items"]
        key = item["fieldRef"]["fieldPath"].split("'")[1]
        f = tmp_path / f"downward-{v['name']}"
        f.write_text(pod["metadata"]["annotations"].pop(key))
        f.chmod(0o644)
        v["hostPath"] = {"path": str(f), "type": "File"}
        for c in pod["spec"]["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] == v["name"]:
                    assert m.pop("subPath") == item["path"] and m["readOnly"]
    return pod


def test_patched_gpu_pod_validates_and_runs_fenced(podman, webhook, sim, tmp_path):  # noqa: F811
    state = sim.new_state()
    state.touch(mode=0o666)
    name = f"trainer{time.monotonic_ns() % 10**8}"
    pod = gpu_pod(podman, state, name)
    other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "team"},
             "spec": {"containers": [{"name": "web", "image": podman.image}]}}  # fmt: skip
    resp = post_review(webhook, other)
    assert resp["allowed"] and "patch" not in resp
    resp = post_review(webhook, pod)
    assert resp["allowed"] and resp["patchType"] == "JSONPatch"
    patched = jsonpatch.apply(pod, json.loads(base64.b64decode(resp["patch"])))
    validate(patched)
    assert patched["spec"]["containers"][1] == pod["spec"]["containers"][1]
    f = tmp_path / "pod.yaml"
    f.write_text(json.dumps(as_kubelet_would(patched, tmp_path)))
    try:
        r = podman.podman("kube", "play", "--network=none", f, timeout=120)
        for c in ("main", "proxy"):
            podman.podman("wait", f"{name}-{c}", timeout=120)
        main = podman.podman("logs", f"{name}-main")
        proxy = podman.podman("logs", f"{name}-proxy")
    finally:
        podman.podman("kube", "down", f, check=False)
    allocs = [l.split()[4] for l in main.stdout.splitlines() if l.startswith("alloc ")]
    assert allocs == ["0", "0", "2"], (main.stdout, main.stderr, r.stderr)
    line = [l for l in main.stderr.splitlines() if "budget exceeded" in l]
    assert len(line) == 1 and "budget 1.00 GiB, in use 800.00 MiB" in line[0], main.stderr
    (sealed,) = [l for l in main.stderr.splitlines() if "the sealed fence" in l]
    assert "CUDATRACE_BUDGET='8589934592'" in sealed and "CUDATRACE_GROUP='mine'" in sealed
    assert "at hold_alloc" in line[0], line
    assert "CUDATRACE_" not in proxy.stdout, proxy.stdout
    assert str(webhook["inst"].dir) not in proxy.stdout + proxy.stderr
    assert [l.split()[4] for l in proxy.stdout.splitlines() if l.startswith("alloc ")] == [
        "0",
        "0",
        "0",
    ], proxy.stdout
