"""The services' HTTP(S) server (cudatrace/deploy/httpserver.py) in front of clients that
misbehave: requests it cannot read get an answer with the reason, half-sent and idle
connections are closed at their deadlines, a full house makes room, health is answered while
the workers are busy and while connections never start TLS. Plain sockets on 127.0.0.1, port 0."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest

from cudatrace.deploy.httpserver import (
    HttpError,
    Limits,
    Request,
    Response,
    Route,
    Server,
    parse_head,
    text,
)


@pytest.mark.parametrize(
    "head,status,why",
    [
        (b"POST /mutate HTTP/1.1\r\nContent-Length: abc", 400, "Content-Length 'abc' is not"),
        (b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6", 400, "given twice"),
        (b"POST /x HTTP/1.1\r\nContent-Length: 99999999", 413, "over the limit of 1000"),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked", 411, "Content-Length only"),
        (b"GET /x HTTP/2.0", 505, "HTTP/1.1 and HTTP/1.0"),
        (b"GET x HTTP/1.1", 400, "not an HTTP request line"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "not an HTTP request line"),
        (b"GET /x HTTP/1.1\r\n folded", 400, "not a header line"),
        (b"GET /x HTTP/1.1\r\nExpect: magic", 417, "is not met"),
        (b"GET /x HTTP/1.1" + b"\r\nA: b" * 101, 431, "at most 100"),
    ],
)
def test_heads_that_cannot_be_read(head, status, why):
    with pytest.raises(HttpError, match=why) as e:
        parse_head(head, 1000)
    assert e.value.status == status


def test_heads_read():
    h = parse_head(
        b"POST /mutate?timeout=5s HTTP/1.1\r\nContent-Length: 12\r\nX-A: 1\r\nx-a: 2", 100
    )
    assert (h.method, h.target, h.length, h.close) == ("POST", "/mutate?timeout=5s", 12, False)
    assert h.headers["x-a"] == "1, 2"
    assert parse_head(b"GET / HTTP/1.0", 10).close
    assert parse_head(b"GET / HTTP/1.1\r\nConnection: Keep-Alive, close", 10).close
    assert parse_head(b"POST / HTTP/1.1\r\nContent-Length: 4, 4", 10).length == 4


class Running:
    def __init__(self, limits: Limits, routes: dict[str, Route] | None = None):
        self.said: list[str] = []
        self.release = threading.Event()

        def slow(req: Request) -> Response:
            self.release.wait(10)
            return text(200, "slow")

        def boom(req: Request) -> Response:
            raise KeyError("name")

        base = {
            "/healthz": Route(lambda r: text(200, "ok"), inline=True),
            "/echo": Route(lambda r: Response(200, r.body), ("POST",)),
            "/slow": Route(slow),
            "/boom": Route(boom),
        }
        self.server = Server("127.0.0.1", 0, {**base, **(routes or {})}, limits,
                             log=self.said.append)  # fmt: skip
        self.server.start()
        self.port = self.server.address[1]

    def connect(self, timeout: float = 5) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def ask(self, raw: bytes, timeout: float = 5) -> bytes:
        with self.connect(timeout) as s:
            s.sendall(raw)
            return read_answer(s)


def read_answer(s: socket.socket) -> bytes:
    """One answer (headers and Content-Length body), nothing past it."""
    data = b""
    while not data.endswith(b"\r\n\r\n"):
        chunk = s.recv(1)
        if not chunk:
            return data
        data += chunk
    length = [l for l in data.split(b"\r\n") if l.lower().startswith(b"content-length:")]
    n = int(length[0].split(b":")[1])
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            break
        body += chunk
    return data + body


def closed_within(s: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing the connection; None if it is still open."""
    s.settimeout(seconds)
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
    except ConnectionResetError:
        return data
    except (TimeoutError, socket.timeout):
        return None


@pytest.fixture
def run():
    servers = []

    def start(limits: Limits | None = None, routes=None) -> Running:
        r = Running(limits or Limits(), routes)
        servers.append(r)
        return r

    yield start
    for r in servers:
        r.release.set()
        r.server.stop()


def test_every_request_it_cannot_read_gets_an_answer(run):
    r = run(Limits(body_bytes=1000))
    for raw, status, why in [
        (b"POST /echo HTTP/1.1\r\nContent-Length: abc\r\n\r\n", b"400", b"'abc' is not a number"),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", b"413", b"over the limit"),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"411", b"Content-Length"),
        (b"GARBAGE\r\n\r\n", b"400", b"not an HTTP request line"),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", b"404", b"nothing is served at /nowhere"),
        (b"GET /echo HTTP/1.1\r\n\r\n", b"405", b"/echo takes POST"),
        (b"GET /boom HTTP/1.1\r\n\r\n", b"500", b"internal error: KeyError: 'name'"),
    ]:
        out = r.ask(raw)
        assert out.startswith(b"HTTP/1.1 " + status) and why in out, out
    assert any("GET /boom: internal error: KeyError" in s for s in r.said), r.said
    h = r.ask(b"GET /x HTTP/1.1\r\n" + b"X: " + b"a" * 70000 + b"\r\n\r\n")
    assert h.startswith(b"HTTP/1.1 431"), h


def test_keep_alive_and_pipelining(run):
    r = run()
    with r.connect() as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
        assert read_answer(s).endswith(b"\r\n\r\nabc")
        s.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nxyPOST /echo HTTP/1.1\r\n"
                  b"Content-Length: 1\r\nConnection: close\r\n\r\nz")  # fmt: skip
        assert read_answer(s).endswith(b"\r\n\r\nxy")
        last = read_answer(s)
        assert b"Connection: close" in last and last.endswith(b"\r\n\r\nz")
        assert s.recv(10) == b""
    with r.connect() as s:  # a peer that sends its end with its request: answered, then closed
        s.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        r.release.set()
        assert read_answer(s).endswith(b"slow\n") and s.recv(10) == b""


def test_half_sent_and_idle_connections_are_closed_at_their_deadlines(run):
    r = run(Limits(request=0.5, idle=0.8))
    half = [r.connect() for _ in range(20)]
    for i, s in enumerate(half):
        s.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc" if i % 2 else b"PO")
    idle = r.connect()
    idle.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 1\r\n\r\na")
    assert read_answer(idle).endswith(b"a")
    t0 = time.monotonic()
    for s in half:
        out = closed_within(s, 5)
        assert out is not None and out.startswith(b"HTTP/1.1 408"), out
        assert b"did not arrive whole within 0.5 s" in out
    assert closed_within(idle, 5) == b""
    assert time.monotonic() - t0 < 4
    assert r.server.stats["request"] == 20 and r.server.stats["idle"] == 1
    line = r.server.stats_line({})
    assert "20 sent no whole request within 0.5 s" in line and "1 stayed idle 0.8 s" in line
    assert not r.server.conns


def test_a_full_house_makes_room_for_a_new_request(run):
    r = run(Limits(connections=10))
    held = [r.connect() for _ in range(30)]
    for s in held[::2]:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # half-sent
    for _ in range(5):
        assert r.ask(b"GET /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200")
    assert r.server.stats["evicted"] >= 20
    assert len(r.server.conns) + len(r.server.handshaking) <= 10
    for s in held:
        s.close()


def test_health_is_answered_while_every_worker_is_busy(run):
    r = run(Limits(workers=1))
    busy = [r.connect() for _ in range(3)]
    for s in busy:
        s.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
    time.sleep(0.2)
    t0 = time.monotonic()
    assert r.ask(b"GET /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200")
    assert time.monotonic() - t0 < 2
    r.release.set()
    for s in busy:
        assert read_answer(s).endswith(b"slow\n")


def test_connections_that_never_start_tls_do_not_stop_the_server(run, tmp_path):
    from cudatrace.deploy.tls import ServingCert, make_tls

    tls = make_tls(tmp_path / "tls", ["localhost"], ("127.0.0.1",))
    said: list[str] = []
    server = Server("127.0.0.1", 0, {"/healthz": Route(lambda r: text(200, "ok"), inline=True)},
                    Limits(handshake=0.5), ServingCert(tls["tls.crt"], tls["tls.key"], said.append),
                    log=said.append)  # fmt: skip
    server.start()
    try:
        port = server.address[1]
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        ctx = ssl.create_default_context(cafile=str(tls["ca.crt"]))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
                assert read_answer(s).startswith(b"HTTP/1.1 200")
        for s in idle:
            assert closed_within(s, 5) == b""
        deadline = time.monotonic() + 5  # counted once the handshake's task has its error
        while server.stats.get("handshake", 0) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.stats == {"handshake": 50}, server.stats
    finally:
        server.stop()
