"""The Kubernetes API as the node agent and the DRA plugin use it: Events about pods, posted
over HTTPS with the pod's service account (or a token and CA given on the command line);
ResourceClaims read and ResourceSlices written (dra.py); the token and access reviews that
authorize a scrape of the agent's metrics (Authorizer). The standard library's HTTP client,
nothing else: neither runs with the Kubernetes client library.

What the API server answers is read as something that may be anything: an answer that is not
a JSON object, or lacks a field read (need()), is a KubeError like a refusal, never a KeyError
or TypeError that would stop a daemon. Errors a later try may not meet (no answer, a timeout,
HTTP 429 and 5xx, an answer not as expected) are `retryable`: request(retry=Retry(...)) tries
again after growing pauses, saying each in the log; the daemons' loops pace their own passes
with Backoff.

An Event says what happened to a pod's container (`involvedObject` the Pod, `fieldPath`
`spec.containers{NAME}`): `kubectl describe pod` and `kubectl get events` show it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from ..errors import CudatraceError
from .objects import Event, ObjectReference

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
COMPONENT = "cudatrace-node"
_UID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
RETRY_CODES = frozenset({408, 429, 500, 502, 503, 504})
_T = TypeVar("_T")


class KubeError(CudatraceError):
    """The API server cannot be reached, refused a request or answered what cannot be read;
    the message says why, `code` the HTTP status when it answered (404: no such object), else
    0; `retryable` when a later try may succeed (no answer, a timeout, 429, 5xx, an answer
    not as expected)."""

    def __init__(self, message: str = "", code: int = 0, retryable: bool = False):
        super().__init__(message)
        self.code = code
        self.retryable = retryable


@overload
def need(obj: object, *path: str | int, what: str = "") -> str: ...
@overload
def need(obj: object, *path: str | int, typ: type[_T], what: str = "") -> _T: ...
@overload
def need(obj: object, *path: str | int, typ: tuple[type, ...], what: str = "") -> object: ...
def need(
    obj: object, *path: str | int, typ: type | tuple[type, ...] = str, what: str = ""
) -> object:
    """obj[path[0]][path[1]]..., which must be of typ (a string unless told); else a retryable
    KubeError naming the field (what: whose answer it is)."""
    cur, dotted = obj, ".".join(str(p) for p in path)
    for key in path:
        if isinstance(key, int) and isinstance(cur, list) and -len(cur) <= key < len(cur):
            cur = cur[key]
        elif isinstance(key, str) and isinstance(cur, dict) and key in cur:
            cur = cur[key]
        else:
            raise KubeError(f"{what or 'the answer'} has no {dotted}", retryable=True)
    if not isinstance(cur, typ):
        kind = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
        raise KubeError(f"{what or 'the answer'}: {dotted} is not a {kind}", retryable=True)
    return cur


@dataclass(frozen=True)
class Retry:
    """How request() tries again an error that is retryable: at most `attempts` tries, pausing
    `first` seconds, then twice as long each time up to `most`; each pause said to `say`."""

    attempts: int = 3
    first: float = 0.25
    most: float = 4.0
    say: Callable[[str], None] | None = None


class Backoff:
    """The pause before a daemon's next try of what failed: `first` seconds, doubled at each
    failure up to `most`, back to `first` after a success."""

    def __init__(self, first: float = 1.0, most: float = 60.0):
        self.first, self.most = first, most
        self.delay = 0.0
        self.failures = 0

    def failed(self) -> float:
        self.failures += 1
        self.delay = min(self.most, self.delay * 2 if self.delay else self.first)
        return self.delay

    def ok(self) -> None:
        self.failures, self.delay = 0, 0.0


@dataclass(frozen=True)
class Kube:
    """An API server: its URL, the bearer token's file (read at each request: projected tokens
    are rotated) and the CA that signed its certificate."""

    url: str
    token_file: Path
    ca_file: Path | None
    timeout: float = 5.0

    @classmethod
    def in_cluster(cls) -> Kube | None:
        """The API server of the pod this runs in (service account), None outside one."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not (SA_DIR / "token").is_file():
            return None
        host = f"[{host}]" if ":" in host else host
        ca = SA_DIR / "ca.crt"
        return cls(f"https://{host}:{port}", SA_DIR / "token", ca if ca.is_file() else None)

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        return ctx

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, object] | None = None,
        retry: Retry | None = None,
        check: Callable[[Mapping[str, object]], None] | None = None,
    ) -> dict[str, Any]:
        """The answer, a JSON object ({} when empty), which check (raising a retryable
        KubeError) finds as expected. Raises KubeError; with retry, a retryable one only once
        its tries are spent."""
        tries = retry.attempts if retry is not None else 1
        pause = retry.first if retry is not None else 0.0
        for n in range(1, tries + 1):
            try:
                answer = self._once(method, path, body)
                if check is not None:
                    check(answer)
                return answer
            except KubeError as e:
                if not e.retryable or n >= tries or retry is None:
                    raise
                if retry.say is not None:
                    retry.say(f"{e}; trying again in {pause:g} s ({n + 1}/{tries})")
                time.sleep(pause)
                pause = min(retry.most, pause * 2)
        raise AssertionError("unreachable")

    def _once(self, method: str, path: str, body: Mapping[str, object] | None) -> dict[str, Any]:
        try:
            token = self.token_file.read_text().strip()
        except OSError as e:
            raise KubeError(f"cannot read the token {self.token_file}: {e.strerror}") from None
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url.rstrip("/") + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        where = f"{method} {path}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as r:
                raw = r.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as e:
            code = e.code
            raise KubeError(
                f"{where}: HTTP {code} {_excerpt(e)!r}", code, code in RETRY_CODES
            ) from None
        except (urllib.error.URLError, OSError, socket.timeout) as e:
            raise KubeError(f"{where}: {getattr(e, 'reason', e)}", retryable=True) from None
        except Exception as e:  # http.client's own (a cut answer, a bad status line)
            raise KubeError(f"{where}: {type(e).__name__}: {e}", retryable=True) from None
        return _object(raw, where)

    def post_event(self, event: Event) -> dict[str, Any]:
        ns = event["metadata"]["namespace"]
        return self.request("POST", f"/api/v1/namespaces/{ns}/events", event)


MAX_ANSWER = 64 << 20  # no object cudatrace reads is near this


def _excerpt(e: urllib.error.HTTPError) -> bytes:
    try:
        return e.read(300)
    except Exception:  # the error's own body cut short
        return b""


def _object(raw: bytes, where: str) -> dict[str, Any]:
    """The answer as a JSON object; a retryable KubeError when it is not one."""
    if len(raw) > MAX_ANSWER:
        raise KubeError(f"{where}: an answer over {MAX_ANSWER} bytes", retryable=True)
    if not raw.strip():
        return {}
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise KubeError(f"{where}: the answer is not JSON ({e})", retryable=True) from None
    if not isinstance(obj, dict):
        raise KubeError(f"{where}: the answer is not a JSON object", retryable=True)
    return obj


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PodContainer:
    """A container of a pod, as an Event names it; uid: the pod's, when known (a UUID)."""

    namespace: str
    pod: str
    container: str
    uid: str = ""


def pod_event(
    who: PodContainer,
    reason: str,
    message: str,
    node: str,
    count: int = 1,
    warning: bool = True,
) -> Event:
    """A core/v1 Event about a pod's container."""
    namespace, pod = who.namespace, who.pod
    involved: ObjectReference = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": namespace,
        "name": pod,
    }
    if _UID_RE.fullmatch(who.uid or ""):
        involved["uid"] = who.uid
    if who.container:
        involved["fieldPath"] = f"spec.containers{{{who.container}}}"
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod}.cudatrace-"[:200], "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": "cudatrace.dev/node",
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": count,
    }


# ---- what a daemon posts while the API server may be away ------------------------------------


class EventQueue:
    """Events to post, kept while the API server cannot take them: a post that fails in a way
    a later try may not (no answer, 429, 5xx) is tried again at a later flush(), after a
    Backoff pause (1 s, doubled up to 60 s), the events in their order; at most `most` wait,
    the oldest dropped (and said) beyond. An event the API server refuses for good (403, 422)
    is dropped and said."""

    def __init__(self, kube: Kube, say: Callable[[str], None], most: int = 100):
        self.kube, self.say, self.most = kube, say, most
        self.waiting: list[Event] = []
        self.backoff = Backoff()
        self.next_try = 0.0
        self.dropped = 0

    def post(self, event: Event) -> None:
        self.waiting.append(event)
        if len(self.waiting) > self.most:
            self.waiting.pop(0)
            self.dropped += 1
            self.say(f"more than {self.most} events wait for the API server: the oldest dropped")
        self.flush()

    def flush(self) -> None:
        """Post what waits, unless the last failure's pause has not passed."""
        now = time.monotonic()
        if not self.waiting or now < self.next_try:
            return
        while self.waiting:
            try:
                self.kube.post_event(self.waiting[0])
            except KubeError as e:
                if not e.retryable:
                    self.waiting.pop(0)
                    self.say(f"cannot post the event: {e}")
                    continue
                pause = self.backoff.failed()
                self.next_try = now + pause
                self.say(f"cannot post the event: {e}; {len(self.waiting)} waiting, "
                         f"trying again in {pause:g} s")  # fmt: skip
                return
            self.waiting.pop(0)
            if self.backoff.failures:
                self.say("the API server takes events again")
            self.backoff.ok()


# ---- who may read the agent's metrics --------------------------------------------------------


class Authorizer:
    """Who may scrape the node agent's metrics (`--metrics-auth kubernetes`), as kube-rbac-proxy
    decides it: the request's bearer token, reviewed by the API server (TokenReview), must be a
    user allowed to `get` the path (a SubjectAccessReview of the non-resource URL, e.g. a
    ClusterRole with `nonResourceURLs: [/metrics]`). A decision is kept `ttl` seconds by the
    token's hash (10 s when it denies), at most `most` of them; the API server's own failures
    are not kept (503: it cannot say now)."""

    def __init__(self, kube: Kube, ttl: float = 60.0, most: int = 1024):
        self.kube, self.ttl, self.most = kube, ttl, most
        self._seen: dict[tuple[str, str], tuple[float, int, str]] = {}
        self._lock = threading.Lock()

    def check(self, authorization: str, path: str) -> tuple[int, str]:
        """(200, the user) or (401|403|503, why)."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "a bearer token is needed (Authorization: Bearer ...)"
        key = (hashlib.sha256(token.strip().encode()).hexdigest(), path)
        now = time.monotonic()
        with self._lock:
            hit = self._seen.get(key)
            if hit is not None and hit[0] > now:
                return hit[1], hit[2]
        code, why = self._review(token.strip(), path)
        if code != 503:
            with self._lock:
                self._seen[key] = (now + (self.ttl if code == 200 else 10.0), code, why)
                while len(self._seen) > self.most:
                    self._seen.pop(next(iter(self._seen)))
        return code, why

    def _review(self, token: str, path: str) -> tuple[int, str]:
        api = "/apis/authentication.k8s.io/v1/tokenreviews"
        try:
            tr = self.kube.request("POST", api, {"apiVersion": "authentication.k8s.io/v1",
                                                 "kind": "TokenReview", "spec": {"token": token}})  # fmt: skip
            status = need(tr, "status", typ=dict, what="the TokenReview")
            if status.get("authenticated") is not True:
                return 401, f"the token is not valid: {str(status.get('error') or 'unknown')[:200]}"
            user = need(status, "user", typ=dict, what="the TokenReview")
            name = need(user, "username", what="the TokenReview")
            spec: dict[str, Any] = {
                "user": name,
                "nonResourceAttributes": {"path": path, "verb": "get"},
            }
            for k, t in (("uid", str), ("groups", list), ("extra", dict)):
                if isinstance(user.get(k), t):
                    spec[k] = user[k]
            sar = self.kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                    {"apiVersion": "authorization.k8s.io/v1",
                                     "kind": "SubjectAccessReview", "spec": spec})  # fmt: skip
            allowed = need(sar, "status", "allowed", typ=bool, what="the SubjectAccessReview")
        except KubeError as e:
            return 503, f"the API server cannot say who may read {path}: {e}"
        if not allowed:
            why = str((sar.get("status") or {}).get("reason") or "no rule allows it")[:200]
            return 403, f"{name} may not get {path}: {why}"
        return 200, name
