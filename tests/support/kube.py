"""Kubernetes without a control plane, for the tests: no kube-apiserver can run here, so what the
node agent posts goes to a tiny fake API server, over HTTPS with a CA of its own and a bearer
token, that records every request and answers 201 with the object (what a real one does for
a create). Nothing else of the API is imitated.

    validate(obj)         kubernetes-validate against K8S_VERSION's schemas, strict
    FakeApiServer(dir)    .url, .token_file, .ca_file, .requests [(method, path, headers, body)]
"""

from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

K8S_VERSION = "1.34.0"  # the oldest Kubernetes the manifests and patched pods must be valid for


def validate(obj: dict) -> None:
    """Raise kubernetes_validate.ValidationError when obj is not a valid object of its kind."""
    import kubernetes_validate

    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


class FakeApiServer:
    TOKEN = "test-token-0123456789"

    def __init__(self, work: Path):
        from cudatrace.deploy.tls import make_tls

        tls = make_tls(work / "apiserver-tls", ["localhost"], ("127.0.0.1",))
        self.ca_file = tls["ca.crt"]
        self.token_file = work / "token"
        self.token_file.write_text(self.TOKEN + "\n")
        self.requests: list[tuple[str, str, dict, dict]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                server.requests.append((self.command, self.path, dict(self.headers), body))
                if self.headers.get("Authorization") != f"Bearer {FakeApiServer.TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls["tls.crt"], tls["tls.key"])
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def events(self) -> list[dict]:
        return [b for m, p, _h, b in self.requests if m == "POST" and p.endswith("/events")]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
