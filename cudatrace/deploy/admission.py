"""What `cudatrace webhook` serves over HTTPS (httpserver.py): POST /mutate, an AdmissionReview
read as something that may be anything, and GET /healthz.

A review is read in steps, each with its own answer when it fails:

1. the body: UTF-8 JSON nested at most MAX_DEPTH deep (measured before it is parsed: a body of
   100,000 brackets is refused, never recursed into), an object with a `request` whose `uid`
   is a string. A body that fails here has no uid to answer with: HTTP 400 and a Kubernetes
   Status saying why (the API server shows its message, then applies the configuration's
   failurePolicy);
2. the Pod of a CREATE, as far as the patch reads it (check_pod): its metadata, annotations,
   containers (each an object with a name), their env, mounts and resources, the volumes;
3. the review itself (webhook.review): a pod that cannot be fenced is refused with the reason.

A review that fails at 2, or whose handling fails in a way not foreseen, is answered with its
uid as the operator chose (`--on-error`): `refuse` (the default: the pod is refused, the reason
in the refusal, so no annotated pod is ever admitted unfenced) or `allow` (fail-open: the pod is
admitted unpatched, with a warning that says why, which kubectl prints). Either way the reason
is said in the webhook's log.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import cast

from ..errors import CudatraceError
from .httpserver import Request, Response, Route, text
from .objects import AdmissionRequest, AdmissionResponse, AdmissionReview
from .webhook import WebhookConfig, review

MAX_DEPTH = 100  # a Pod inside an AdmissionReview is about 20 deep, its managedFields included
ON_ERROR = ("refuse", "allow")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class Unreadable(CudatraceError):
    """A review the webhook cannot read; uid: the request's, when it was read that far."""

    def __init__(self, reason: str, uid: str = ""):
        super().__init__(reason)
        self.uid = uid


def json_depth(raw: bytes) -> int:
    """How deep the JSON text's arrays and objects nest (strings skipped), without parsing."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def read_review(raw: bytes) -> tuple[AdmissionReview, str]:
    """(the review, its request's uid). Raises Unreadable."""
    if not raw:
        raise Unreadable("no body: POST an AdmissionReview (admission.k8s.io/v1)")
    depth = json_depth(raw)
    if depth > MAX_DEPTH:
        raise Unreadable(f"the JSON nests {depth} deep; an AdmissionReview is read to {MAX_DEPTH}")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Unreadable(f"the body is not JSON: {e}") from None
    if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
        raise Unreadable("not an AdmissionReview: no request object")
    req = body["request"]
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise Unreadable("the AdmissionReview's request has no uid")
    # its request an object with a uid: what review() reads of the rest, check_pod checks
    return cast("AdmissionReview", body), uid


def _kind(req: AdmissionRequest) -> object:
    kind = req.get("kind")
    return kind.get("kind") if isinstance(kind, dict) else None


def _want(value: object, typ: type, where: str, what: str) -> None:
    if value is not None and not isinstance(value, typ):
        raise Unreadable(f"{where} is not {what}")


def _check_list(items: object, where: str, key: str, what: str) -> None:
    """items: None or a list of objects whose `key`, when there, is a string."""
    _want(items, list, where, "a list")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            raise Unreadable(f"{where}[{i}] is not an object")
        _want(item.get(key), str, f"{where}[{i}].{key}", what)


def _check_container(c: object, where: str) -> None:
    if not isinstance(c, dict):
        raise Unreadable(f"{where} is not an object")
    name = c.get("name")
    if not isinstance(name, str) or not name:
        raise Unreadable(f"{where} has no name")
    _check_list(c.get("env"), f"{where}.env", "name", "a string")
    for i, e in enumerate(c.get("env") or []):
        _want(e.get("value"), str, f"{where}.env[{i}].value", "a string")
    _check_list(c.get("volumeMounts"), f"{where}.volumeMounts", "mountPath", "a string")
    res = c.get("resources")
    _want(res, dict, f"{where}.resources", "an object")
    for key in ("limits", "requests"):
        _want((res or {}).get(key), dict, f"{where}.resources.{key}", "an object")
    _want((res or {}).get("claims"), list, f"{where}.resources.claims", "a list")


def check_pod(obj: object, namespace: object) -> None:
    """The Pod of a review, as far as the patch reads it. Raises Unreadable."""
    if not isinstance(obj, dict):
        raise Unreadable("request.object is not an object")
    _want(namespace, str, "request.namespace", "a string")
    meta = obj.get("metadata")
    _want(meta, dict, "metadata", "an object")
    ann = (meta or {}).get("annotations")
    _want(ann, dict, "metadata.annotations", "an object")
    for k, v in (ann or {}).items():
        _want(v, str, f"the annotation {k}", "a string")
    _want((meta or {}).get("namespace"), str, "metadata.namespace", "a string")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise Unreadable("the pod has no spec")
    containers = spec.get("containers")
    _want(containers, list, "spec.containers", "a list")
    for i, c in enumerate(containers or []):
        _check_container(c, f"spec.containers[{i}]")
    _check_list(spec.get("volumes"), "spec.volumes", "name", "a string")


def refused(uid: str, reason: str) -> AdmissionResponse:
    return {
        "uid": uid,
        "allowed": False,
        "status": {"code": 400, "message": f"cudatrace: {reason}"},
    }


def admitted_unfenced(uid: str, reason: str) -> AdmissionResponse:
    return {
        "uid": uid,
        "allowed": True,
        "warnings": [f"cudatrace: admitted unfenced (--on-error allow): {reason}"[:500]],
    }


def answer(raw: bytes, cfg: WebhookConfig, on_error: str, log: Callable[[str], None]) -> Response:
    """The answer to a POST /mutate body."""
    try:
        body, uid = read_review(raw)
    except Unreadable as e:
        log(f"cannot read a review: {e}")
        return status_response(400, f"cudatrace: cannot read the review: {e}")
    req = body["request"]
    try:
        if _kind(req) == "Pod" and req.get("operation", "CREATE") == "CREATE":
            check_pod(req.get("object"), req.get("namespace"))
        out = review(body, cfg)
    except Unreadable as e:
        resp = _on_error(uid, f"cannot read the pod: {e}", on_error, log)
    except Exception as e:  # a pod the patch did not foresee: answered, never a dropped call
        resp = _on_error(uid, f"cannot fence the pod: {type(e).__name__}: {e}", on_error, log)
    else:
        r = out["response"]
        if not r["allowed"] or "patch" in r:
            log(f"{r['uid']}: {'patched' if r['allowed'] else r['status']['message']}")
        return _json(200, out)
    return _json(
        200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}
    )


def _on_error(
    uid: str, reason: str, on_error: str, log: Callable[[str], None]
) -> AdmissionResponse:
    verb = "admitted unfenced" if on_error == "allow" else "refused"
    log(f"{uid}: {verb}: {reason}")
    return admitted_unfenced(uid, reason) if on_error == "allow" else refused(uid, reason)


def _json(status: int, obj: object) -> Response:
    return Response(status, json.dumps(obj).encode(), "application/json")


def status_response(code: int, message: str) -> Response:
    """A Kubernetes Status (what the API server reads of an error answer)."""
    reasons = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 408: "Timeout",
               413: "RequestEntityTooLarge", 500: "InternalError"}  # fmt: skip
    return _json(code, {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                        "message": message, "reason": reasons.get(code, ""), "code": code})  # fmt: skip


def routes(cfg: WebhookConfig, on_error: str, log: Callable[[str], None]) -> dict[str, Route]:
    """POST /mutate (a worker reads it), GET /healthz (the server's loop answers it)."""
    if on_error not in ON_ERROR:
        raise CudatraceError(f"--on-error {on_error!r}: give {' or '.join(ON_ERROR)}")

    def mutate(req: Request) -> Response:
        return answer(req.body, cfg, on_error, log)

    return {
        "/mutate": Route(mutate, ("POST",)),
        "/healthz": Route(lambda req: text(200, "ok"), ("GET",), inline=True),
    }
