"""The Kubernetes API as the node agent and the DRA plugin use it: Events about pods, posted
over HTTPS with the pod's service account (or a token and CA given on the command line);
ResourceClaims read and ResourceSlices written (dra.py). The standard library's HTTP client,
nothing else: neither runs with the Kubernetes client library.

An Event says what happened to a pod's container (`involvedObject` the Pod, `fieldPath`
`spec.containers{NAME}`): `kubectl describe pod` and `kubectl get events` show it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import CudatraceError

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
COMPONENT = "cudatrace-node"
_UID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class KubeError(CudatraceError):
    """The API server cannot be reached or refused a request; the message says why, `code`
    the HTTP status when it answered (404: no such object), else 0."""

    def __init__(self, message: str = "", code: int = 0):
        super().__init__(message)
        self.code = code


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

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
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
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            raise KubeError(f"{method} {path}: HTTP {e.code} {e.read()[:300]!r}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise KubeError(f"{method} {path}: {getattr(e, 'reason', e)}") from None
        return json.loads(text) if text else {}

    def post_event(self, event: dict) -> dict:
        ns = event["metadata"]["namespace"]
        return self.request("POST", f"/api/v1/namespaces/{ns}/events", event)


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
) -> dict:
    """A core/v1 Event about a pod's container."""
    namespace, pod = who.namespace, who.pod
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod}
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
