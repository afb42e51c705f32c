"""How the webhook reads a review that may be anything (cudatrace/deploy/admission.py): every
body it cannot read is answered with the reason, a pod it cannot read is refused (or, with
--on-error allow, admitted with a warning), and nothing of it raises past the answer."""

from __future__ import annotations

import base64
import json

import pytest

from cudatrace.deploy import admission
from cudatrace.deploy.admission import MAX_DEPTH, answer, json_depth, read_review
from cudatrace.deploy.webhook import ANN_BUDGET, WebhookConfig

CFG = WebhookConfig(root="/var/lib/cudatrace", ident="0.1.0-0123456789ab")
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


def review(obj, **request) -> dict:
    req = {"uid": UID, "kind": {"group": "", "version": "v1", "kind": "Pod"},
           "namespace": "team", "operation": "CREATE", "object": obj, **request}  # fmt: skip
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def gpu_pod(**container) -> dict:
    c = {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}, **container}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "annotations": {ANN_BUDGET: "1GiB"}},
            "spec": {"containers": [c]}}  # fmt: skip


def call(body, on_error="refuse") -> tuple[int, dict, list[str]]:
    said: list[str] = []
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = answer(raw, CFG, on_error, said.append)
    return resp.status, json.loads(resp.body), said


def test_depth_is_measured_without_parsing():
    assert json_depth(b'{"a": [1, {"b": "[[[[{{"}], "c": "\\"]]"}') == 3
    assert json_depth(b"[" * 100000 + b"]" * 100000) == 100000
    assert json_depth(b'"just a string"') == 0


@pytest.mark.parametrize(
    "raw,why",
    [
        (b"", "no body"),
        (b"[" * 100000 + b"]" * 100000, "nests 100000 deep"),
        (b'{"request": ' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), "nests 101 deep"),
        (b"\xff\xfe{", "not JSON"),
        (b'{"request": {"uid": "x"', "not JSON"),
        (b"[]", "no request object"),
        (b'{"request": []}', "no request object"),
        (b'{"request": {"uid": 7}}', "has no uid"),
        (b'{"request": {"uid": "' + b"9" * 5000 + b'", "x": ' + b"9" * 5000 + b"}}", "not JSON"),
    ],
)
def test_bodies_it_cannot_read_are_a_bad_request_with_the_reason(raw, why):
    with pytest.raises(admission.Unreadable, match=why):
        read_review(raw)
    status, out, said = call(raw)
    assert status == 400 and out["kind"] == "Status" and out["code"] == 400
    assert why in out["message"] and out["message"].startswith("cudatrace: cannot read")
    assert len(said) == 1 and why in said[0]


PODS = [
    (gpu_pod(name=None), "spec.containers[0] has no name"),
    (gpu_pod(name=""), "spec.containers[0] has no name"),
    (gpu_pod(env={"A": "1"}), "spec.containers[0].env is not a list"),
    (gpu_pod(env=[{"name": "A", "value": 1}]), "env[0].value is not a string"),
    (gpu_pod(env=["A=1"]), "env[0] is not an object"),
    (gpu_pod(volumeMounts=[{"mountPath": 5}]), "volumeMounts[0].mountPath is not a string"),
    (gpu_pod(resources={"limits": ["nvidia.com/gpu"]}), "resources.limits is not an object"),
    (gpu_pod(resources="lots"), "resources is not an object"),
    ({"metadata": {"annotations": {ANN_BUDGET: 8}}, "spec": {"containers": []}},
     f"the annotation {ANN_BUDGET} is not a string"),
    ({"metadata": {"annotations": ["x"]}, "spec": {}}, "metadata.annotations is not an object"),
    ({"metadata": {}}, "the pod has no spec"),
    ({"metadata": {}, "spec": {"containers": {"name": "x"}}}, "spec.containers is not a list"),
    ({"spec": {"containers": [], "volumes": [{"name": ["x"]}]}}, "volumes[0].name is not a"),
    ("a pod", "request.object is not an object"),
]  # fmt: skip


@pytest.mark.parametrize("pod,why", PODS)
def test_pods_it_cannot_read_are_refused_with_the_reason(pod, why):
    status, out, said = call(review(pod))
    r = out["response"]
    assert status == 200 and out["kind"] == "AdmissionReview" and r["uid"] == UID
    assert r["allowed"] is False and r["status"]["code"] == 400
    assert why in r["status"]["message"] and "patch" not in r
    assert r["status"]["message"] == f"cudatrace: cannot read the pod: {why}" or why in said[0]
    assert said == [f"{UID}: refused: {r['status']['message'].removeprefix('cudatrace: ')}"]


@pytest.mark.parametrize("pod,why", PODS[:3])
def test_fail_open_admits_them_unfenced_saying_why(pod, why):
    status, out, said = call(review(pod), on_error="allow")
    r = out["response"]
    assert status == 200 and r["allowed"] is True and "patch" not in r
    assert why in r["warnings"][0] and "admitted unfenced (--on-error allow)" in r["warnings"][0]
    assert "admitted unfenced" in said[0]


def test_an_error_the_patch_did_not_foresee_is_answered(monkeypatch):
    def broken(body, cfg):
        raise KeyError("spec")

    monkeypatch.setattr(admission, "review", broken)
    status, out, said = call(review(gpu_pod()))
    assert status == 200 and out["response"]["allowed"] is False
    assert "cannot fence the pod: KeyError: 'spec'" in out["response"]["status"]["message"]
    status, out, _ = call(review(gpu_pod()), on_error="allow")
    assert out["response"]["allowed"] is True and "KeyError" in out["response"]["warnings"][0]


def test_readable_reviews_are_answered_as_before():
    status, out, said = call(review(gpu_pod()))
    r = out["response"]
    assert status == 200 and r["allowed"] and r["patchType"] == "JSONPatch"
    assert any(
        op["path"] == "/spec/containers/0/env" for op in json.loads(base64.b64decode(r["patch"]))
    )
    assert said == [f"{UID}: patched"]
    # other kinds and operations are not read as pods: passed as they are
    status, out, _ = call(review("not a pod", operation="DELETE"))
    assert out["response"] == {"uid": UID, "allowed": True}
