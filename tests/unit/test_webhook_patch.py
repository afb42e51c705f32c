"""The admission webhook's answer (cudatrace/deploy/webhook.py): which containers of a pod are
fenced and how, as an AdmissionReview response whose JSONPatch, applied as the API server
applies it (support/jsonpatch.py), gives a pod that Kubernetes' schema accepts."""

from __future__ import annotations

import base64
import copy
import json

import pytest

from cudatrace import fence_record
from cudatrace.deploy.webhook import ANN_BUDGET, ANN_FENCE, ANN_PATCHED, WebhookConfig, review
from support import jsonpatch
from support.kube import validate

CFG = WebhookConfig(root="/var/lib/cudatrace", ident="0.1.0-0123456789ab")


def pod(annotations=None, containers=None, init=None) -> dict:
    p = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "trainer-", "namespace": "team"},
        "spec": {
            "containers": containers
            or [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "env": [{"name": "LD_PRELOAD", "value": "/opt/libmine.so"}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                },
                {"name": "proxy", "image": "proxy:1"},
            ],
        },
    }
    if annotations is not None:
        p["metadata"]["annotations"] = annotations
    if init is not None:
        p["spec"]["initContainers"] = init
    return p


def admit(obj: dict, cfg: WebhookConfig = CFG) -> tuple[dict, dict]:
    """(response, the pod as admitted)."""
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team",
            "operation": "CREATE",
            "object": obj,
        },
    }
    out = review(json.loads(json.dumps(body)), cfg)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    resp = out["response"]
    assert resp["uid"] == body["request"]["uid"]
    if "patch" not in resp:
        return resp, obj
    assert resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    return resp, jsonpatch.apply(obj, ops)


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_gpu_container_fenced_others_untouched():
    sidecar = {"name": "log", "image": "log:1", "restartPolicy": "Always"}
    before = pod({ANN_BUDGET: "8GiB"}, init=[sidecar])
    resp, after = admit(before)
    assert resp["allowed"]
    main, proxy = after["spec"]["containers"]
    assert proxy == before["spec"]["containers"][1]
    assert after["spec"]["initContainers"] == [sidecar]
    env = env_of(main)
    assert env["CUDATRACE_BUDGET"] == str(8 << 30)
    # the pod's group: named at admission (the pod's uid is not known yet), its own ledgers
    assert env["CUDATRACE_GROUP"] == "pod-705ab4f5-6393-11e8-b7cc-42010a800002"
    assert env["CUDATRACE_K8S_POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["CUDATRACE_K8S_POD"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["CUDATRACE_K8S_NAMESPACE"] == "team"
    assert env["CUDATRACE_K8S_CONTAINER"] == "main"
    assert env["CUDATRACE_ON_FENCE_ERROR"] == "refuse"
    assert env["CUDATRACE_LEDGER_DIR"].startswith("/run/cudatrace/ledger/")
    assert env["LD_PRELOAD"] == "/opt/libmine.so"  # the application's own stays
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    shim_dir = "/var/lib/cudatrace/shim/0.1.0-0123456789ab"
    assert mounts[shim_dir]["readOnly"] and mounts["/etc/ld.so.preload"]["readOnly"]
    vols = {v["name"]: v for v in after["spec"]["volumes"]}
    assert vols["cudatrace-lib"]["hostPath"] == {"path": shim_dir, "type": "Directory"}
    assert vols["cudatrace-preload"]["hostPath"]["type"] == "File"
    assert vols["cudatrace-ledger"]["emptyDir"]["medium"] == "Memory"
    assert after["metadata"]["annotations"][ANN_PATCHED] == CFG.ident
    # the fence, sealed: the record is the pod's annotation, a read-only regular file (subPath)
    # at /etc/cudatrace/fence through the downward API; the environment says the same fence
    rec = fence_record.parse(after["metadata"]["annotations"][ANN_FENCE])
    assert rec.group == env["CUDATRACE_GROUP"] and rec.budget == str(8 << 30)
    assert rec.ledger_dir == env["CUDATRACE_LEDGER_DIR"] and rec.ledger_dir_make is True
    assert rec.on_fence_error == "refuse" and rec.on_exceed == "fail"
    m = mounts["/etc/cudatrace/fence"]
    assert m["readOnly"] and m["subPath"] == "fence"
    item = vols[m["name"]]["downwardAPI"]["items"][0]
    assert item == {
        "path": "fence",
        "fieldRef": {"fieldPath": f"metadata.annotations['{ANN_FENCE}']"},
    }
    validate(after)


def test_a_fence_annotation_of_the_pods_author_is_replaced():
    """A pod whose author wrote its own cudatrace.dev/fence (a larger budget): the webhook's
    record replaces it."""
    forged = "cudatrace-fence 1\ngroup=mine\nbudget=1TiB\nledger-dir=/tmp\n"
    _, after = admit(pod({ANN_BUDGET: "1GiB", ANN_FENCE: forged}))
    rec = fence_record.parse(after["metadata"]["annotations"][ANN_FENCE])
    assert rec.budget == str(1 << 30) and rec.group.startswith("pod-")


def test_pods_without_the_annotation_or_a_gpu_are_left_alone():
    resp, after = admit(pod())
    assert resp["allowed"] and "patch" not in resp and after == pod()
    no_gpu = pod({ANN_BUDGET: "8GiB"}, containers=[{"name": "web", "image": "web:1"}])
    resp, _ = admit(no_gpu)
    assert resp["allowed"] and "patch" not in resp
    assert "no container asks for a GPU" in resp["warnings"][0]
    resp, _ = admit(pod({ANN_BUDGET: "8GiB", ANN_PATCHED: "x"}))  # reinvoked: done already
    assert resp["allowed"] and "patch" not in resp


def test_named_containers_and_claims():
    c = [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}, {"name": "c", "image": "x"}]
    _, after = admit(pod({ANN_BUDGET: "1GiB", "cudatrace.dev/containers": "a, c"}, containers=c))
    fenced = [x["name"] for x in after["spec"]["containers"] if "env" in x]
    assert fenced == ["a", "c"]
    claim = [{"name": "d", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]
    _, after = admit(pod({ANN_BUDGET: "1GiB"}, containers=claim))
    assert env_of(after["spec"]["containers"][0])["CUDATRACE_BUDGET"] == str(1 << 30)
    mig = [{"name": "m", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]
    _, after = admit(pod({ANN_BUDGET: "1GiB"}, containers=mig))
    assert "CUDATRACE_GROUP" in env_of(after["spec"]["containers"][0])


@pytest.mark.parametrize(
    "ann, why",
    [
        ({ANN_BUDGET: "lots"}, "cudatrace.dev/budget 'lots'"),
        ({ANN_BUDGET: "60%"}, "give a size"),
        ({ANN_BUDGET: "8GiB", "cudatrace.dev/on-exceed": "explode"}, "on-exceed 'explode'"),
        ({ANN_BUDGET: "8GiB", "cudatrace.dev/containers": "nope"}, "no container named nope"),
    ],
)
def test_what_cannot_be_fenced_is_refused(ann, why):
    resp, _ = admit(pod(ann))
    assert not resp["allowed"] and resp["status"]["code"] == 400
    assert why in resp["status"]["message"], resp["status"]["message"]


def test_a_pod_in_the_way_is_refused():
    p = pod({ANN_BUDGET: "8GiB"})
    p["spec"]["volumes"] = [{"name": "cudatrace-ledger", "emptyDir": {}}]
    resp, _ = admit(p)
    assert not resp["allowed"] and "volume named cudatrace-ledger" in resp["status"]["message"]
    p = pod({ANN_BUDGET: "8GiB"})
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "x", "mountPath": "/etc/ld.so.preload"}]
    p["spec"]["volumes"] = [{"name": "x", "emptyDir": {}}]
    resp, _ = admit(p)
    assert not resp["allowed"] and "/etc/ld.so.preload" in resp["status"]["message"]


def test_a_containers_own_budget_variables_are_replaced():
    p = pod({ANN_BUDGET: "2GiB"})
    p["spec"]["containers"][0]["env"] += [
        {"name": "CUDATRACE_BUDGET", "value": "999TiB"},
        {"name": "CUDATRACE_ON_FENCE_ERROR", "value": "warn"},
    ]
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    p["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    _, after = admit(p)
    main = after["spec"]["containers"][0]
    names = [e["name"] for e in main["env"]]
    assert names.count("CUDATRACE_BUDGET") == 1 and names.count("CUDATRACE_ON_FENCE_ERROR") == 1
    assert env_of(main)["CUDATRACE_BUDGET"] == str(2 << 30)
    assert env_of(main)["CUDATRACE_ON_FENCE_ERROR"] == "refuse"
    assert main["volumeMounts"][0]["mountPath"] == "/data" and len(main["volumeMounts"]) == 5
    validate(after)


def test_sandbox_mode_preloads_before_the_applications_own():
    """LD_PRELOAD in the one order of every integration (fence_record.preload): the library
    first, whose dlsym a program then reaches first, the application's own after it."""
    cfg = WebhookConfig(root=CFG.root, ident=CFG.ident, preload="env")
    _, after = admit(pod({ANN_BUDGET: "8GiB"}), cfg)
    main = after["spec"]["containers"][0]
    assert env_of(main)["LD_PRELOAD"] == (
        "/var/lib/cudatrace/shim/0.1.0-0123456789ab/platform/$PLATFORM/libcudatrace.so "
        "/opt/libmine.so"
    )
    assert "/etc/ld.so.preload" not in [m["mountPath"] for m in main["volumeMounts"]]
    validate(after)


def test_other_objects_and_operations_pass():
    body = {
        "request": {
            "uid": "u",
            "kind": {"kind": "Pod"},
            "operation": "UPDATE",
            "object": pod({ANN_BUDGET: "8GiB"}),
        }  # fmt: skip
    }
    assert review(copy.deepcopy(body), CFG)["response"] == {"uid": "u", "allowed": True}
    body["request"]["kind"] = {"kind": "Deployment"}
    body["request"]["operation"] = "CREATE"
    assert review(body, CFG)["response"] == {"uid": "u", "allowed": True}
