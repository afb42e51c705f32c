"""Kubernetes without a control plane, for the tests: no kube-apiserver can run here, so what the
node agent and the DRA plugin ask goes to a tiny fake API server, over HTTPS with a CA of its
own and a bearer token, that records every request and keeps objects by path: a test puts
what the API would hold (a ResourceClaim, a Node, a Pod); GET answers an object or 404, and
the pods of a node (`/api/v1/pods?fieldSelector=spec.nodeName=NODE`, the node agent's list)
from the Pods put under `/api/v1/namespaces/*/pods/`; POST to a collection creates (201; 409
when the name is taken; an Event, named by generateName, is only answered), PUT replaces one
whose resourceVersion matches (409 else). A TokenReview is answered from .users (token ->
user), a SubjectAccessReview of a non-resource URL from .allowed ((user, path) pairs). A test
may have the next answers to a path be what it says (.answer: a status and raw bytes, any
number of times: a 503, an object without metadata, not JSON at all). Nothing else of the API
(other lists, watches, patches, defaults, validation) is imitated.

    validate(obj, version) kubernetes-validate against a version's schemas (K8S_VERSION), strict
    FakeApiServer(dir)     .url, .token_file, .ca_file, .requests [(method, path, headers, body)],
                           .objects {path: object}, .put(path, object), .put_pod(pod),
                           .answer(method, path, status, raw, times), .users, .allowed
    pod(ns, name, node, containers)  a Pod running on node, its containers {name: 64-hex id}
"""

from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

K8S_VERSION = "1.34.0"  # the oldest Kubernetes the manifests and patched pods must be valid for


DRA_VERSION = "1.36.0"  # consumable capacity (a claim's capacity.requests.memory) is beta


def validate(obj: dict, version: str = K8S_VERSION) -> None:
    """Raise kubernetes_validate.ValidationError when obj is not a valid object of its kind."""
    import kubernetes_validate  # type: ignore[import-untyped]  # no type information

    kubernetes_validate.validate(obj, version, strict=True)


def pod(namespace: str, name: str, node: str, containers: dict[str, str], uid: str = "") -> dict:
    """A Pod scheduled to `node` whose status lists its containers by id, as the kubelet
    reports them (`containerd://<id>`)."""
    import uuid as _uuid

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(_uuid.uuid4())},
        "spec": {"nodeName": node, "containers": [{"name": c, "image": "img"} for c in containers]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": c, "containerID": f"containerd://{cid}", "image": "img", "imageID": "",
                 "ready": True, "restartCount": 0}
                for c, cid in containers.items()
            ],
        },
    }  # fmt: skip


class FakeApiServer:
    TOKEN = "test-token-0123456789"

    def __init__(self, work: Path):
        from cudatrace.deploy.tls import make_tls

        tls = make_tls(work / "apiserver-tls", ["localhost"], ("127.0.0.1",))
        self.ca_file = tls["ca.crt"]
        self.token_file = work / "token"
        self.token_file.write_text(self.TOKEN + "\n")
        self.requests: list[tuple[str, str, dict, dict]] = []
        self.objects: dict[str, dict] = {}
        self.canned: list[list] = []  # [method, path, status, raw, times left]
        self.users: dict[str, dict] = {}  # token -> TokenReview status.user
        self.allowed: set[tuple[str, str]] = set()  # (username, non-resource path)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                server.requests.append((self.command, self.path, dict(self.headers), body))
                return body

            def _answer(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str) -> None:
                self._answer(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "reason": reason, "code": code})  # fmt: skip

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {FakeApiServer.TOKEN}":
                    self._status(401, "Unauthorized")
                    return False
                with server._lock:
                    for c in server.canned:
                        if c[0] == self.command and c[1] == self.path and c[4] > 0:
                            c[4] -= 1
                            self.send_response(c[2])
                            self.send_header("Content-Length", str(len(c[3])))
                            self.end_headers()
                            self.wfile.write(c[3])
                            return False
                return True

            def _review(self, body: dict) -> bool:
                """A TokenReview or a SubjectAccessReview, answered; False for other paths."""
                spec = body.get("spec") or {}
                if self.path.endswith("/tokenreviews"):
                    user = server.users.get(spec.get("token", ""))
                    status = {"authenticated": True, "user": user} if user else {
                        "authenticated": False, "error": "invalid bearer token"}  # fmt: skip
                elif self.path.endswith("/subjectaccessreviews"):
                    path = (spec.get("nonResourceAttributes") or {}).get("path")
                    ok = (spec.get("user"), path) in server.allowed
                    status = {"allowed": ok} if ok else {"allowed": False, "reason": "no rule"}
                else:
                    return False
                self._answer(201, {**body, "status": status})
                return True

            def do_GET(self) -> None:
                self._body()
                if not self._authorized():
                    return
                if self.path.startswith("/api/v1/pods?"):
                    self._answer(200, server.pods_of(self.path))
                    return
                obj = server.objects.get(self.path)
                self._answer(200, obj) if obj else self._status(404, "NotFound")

            def do_POST(self) -> None:
                body = self._body()
                if not self._authorized() or self._review(body):
                    return
                name = (body.get("metadata") or {}).get("name")
                if not name:  # generateName (an Event): answered, not kept
                    self._answer(201, body)
                    return
                with server._lock:
                    path = f"{self.path}/{name}"
                    if path in server.objects:
                        self._status(409, "AlreadyExists")
                        return
                    body["metadata"]["resourceVersion"] = "1"
                    server.objects[path] = body
                self._answer(201, body)

            def do_PUT(self) -> None:
                body = self._body()
                if not self._authorized():
                    return
                with server._lock:
                    cur = server.objects.get(self.path)
                    if cur is None:
                        self._status(404, "NotFound")
                        return
                    rv = cur["metadata"]["resourceVersion"]
                    if body.get("metadata", {}).get("resourceVersion") != rv:
                        self._status(409, "Conflict")
                        return
                    body["metadata"]["resourceVersion"] = str(int(rv) + 1)
                    server.objects[self.path] = body
                self._answer(200, body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls["tls.crt"], tls["tls.key"])
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, status: int, raw: bytes, times: int = 1) -> None:
        """The next `times` answers to METHOD path: status and raw, whatever they are."""
        with self._lock:
            self.canned.append([method, path, status, raw, times])

    def put(self, path: str, obj: dict) -> None:
        """Hold obj at path, as if the API server had it."""
        obj.setdefault("metadata", {}).setdefault("resourceVersion", "1")
        self.objects[path] = obj

    def put_pod(self, obj: dict) -> None:
        m = obj["metadata"]
        self.put(f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}", obj)

    def pods_of(self, path: str) -> dict:
        """The PodList a field selector on spec.nodeName asks for (every pod without one)."""
        from urllib.parse import parse_qs, urlsplit

        sel = parse_qs(urlsplit(path).query).get("fieldSelector", [""])[0]
        node = sel.partition("spec.nodeName=")[2] if sel.startswith("spec.nodeName=") else None
        items = [
            o
            for p, o in sorted(self.objects.items())
            if p.startswith("/api/v1/namespaces/") and "/pods/" in p
            and (node is None or o.get("spec", {}).get("nodeName") == node)
        ]  # fmt: skip
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}

    def events(self) -> list[dict]:
        return [b for m, p, _h, b in self.requests if m == "POST" and p.endswith("/events")]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
