"""The one HTTP(S) server of cudatrace's services: the admission webhook (`cudatrace webhook`),
the node agent's metrics and health (`cudatrace node`) and the DRA plugin's health
(`cudatrace dra-plugin`). It is built to stay up in front of clients that misbehave:

- one event loop (asyncio, in a thread of its own) accepts and reads every connection; the TLS
  handshake of each runs on it, never in the accepting step, so a connection that never starts
  TLS holds nothing but its own slot;
- every phase has a deadline (Limits): the handshake, a request's arrival whole (its headers
  and its body, counted from its first byte), the wait for the next request of a kept-alive
  connection, and the write of an answer; a connection past its deadline is closed (a request
  begun gets `408` first);
- connections are bounded: at the bound, the connection that has waited longest without a
  whole request (in its handshake, idle, or half-sent) is closed to make room; when every
  connection is at work the new one is closed;
- a request is read whole (Content-Length only: a body over `body_bytes` gets `413`, an
  unreadable length `400`, Transfer-Encoding `411`) before a handler sees it; handlers run in
  a small pool of threads, except the routes marked `inline` (health), which the loop answers
  itself: they are answered while every worker is busy;
- every request the server cannot read gets an HTTP answer saying why, then the connection
  is closed (its framing cannot be trusted); a handler that raises gets `500` with the reason,
  said in the log too.

What it closed, and why, is said in the log once a minute at most (never a line per
connection: a flood would flood the log too).
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from ..errors import CudatraceError

if TYPE_CHECKING:
    from .tls import ServingCert

WAITING = ("idle", "request")  # phases a connection may be closed in to make room
STATS_EVERY = 60.0  # seconds between two log lines of what was closed
MAX_HEADERS = 100
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_LENGTH = re.compile(r"[0-9]{1,19}")


class HttpError(CudatraceError):
    """A request the server cannot read: the status to answer with and why."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """Deadlines in seconds and bounds of the server (docs/kubernetes.md, "The webhook under
    load")."""

    connections: int = 512
    handshake: float = 5.0
    request: float = 10.0  # a request's headers and body, from its first byte
    idle: float = 60.0  # a kept-alive connection between two requests
    write: float = 10.0
    header_bytes: int = 64 << 10
    body_bytes: int = 8 << 20
    workers: int = 4


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    peer: str


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def text(status: int, message: str) -> Response:
    return Response(status, (message.rstrip("\n") + "\n").encode())


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Route:
    """A path's handler, the methods it takes, and whether the loop answers it itself (inline:
    cheap and never blocking, such as health) or a worker does."""

    handler: Handler
    methods: tuple[str, ...] = ("GET",)
    inline: bool = False


@dataclass(frozen=True)
class Head:
    """A request's line and headers, read."""

    method: str
    target: str
    headers: dict[str, str]
    length: int
    close: bool
    expect_continue: bool


def parse_head(raw: bytes, max_body: int) -> Head:
    """The request line and the headers (without the blank line). Raises HttpError."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1].startswith("/"):
        raise HttpError(400, f"not an HTTP request line: {lines[0][:80]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, f"{version[:20]!r}: HTTP/1.1 and HTTP/1.0 are served")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, f"{len(lines) - 1} header lines; at most {MAX_HEADERS} are read")
    headers: dict[str, str] = {}
    lengths: set[str] = set()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise HttpError(400, f"not a header line: {line[:80]!r}")
        value = value.strip(" \t")
        key = name.lower()
        if key == "content-length":
            lengths.update(v.strip(" \t") for v in value.split(","))
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if "transfer-encoding" in headers:
        raise HttpError(411, "a body is read with Content-Length only, not Transfer-Encoding")
    length = _content_length(lengths, max_body)
    expect = headers.get("expect", "").lower()
    if expect and expect != "100-continue":
        raise HttpError(417, f"Expect {expect[:40]!r} is not met")
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    close = version == "HTTP/1.0" or "close" in tokens
    return Head(method, target, headers, length, close, expect == "100-continue")


def _content_length(values: set[str], max_body: int) -> int:
    if not values:
        return 0
    if len(values) > 1:
        raise HttpError(400, f"Content-Length given twice, differently: {sorted(values)}")
    (value,) = values
    if not _LENGTH.fullmatch(value):
        raise HttpError(400, f"Content-Length {value[:40]!r} is not a number of bytes")
    n = int(value)
    if n > max_body:
        raise HttpError(413, f"a body of {n} bytes is over the limit of {max_body}")
    return n


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status"


def encode(resp: Response, close: bool) -> bytes:
    head = [
        f"HTTP/1.1 {resp.status} {_reason(resp.status)}",
        f"Content-Type: {resp.content_type}",
        f"Content-Length: {len(resp.body)}",
        *(f"{k}: {v}" for k, v in resp.headers),
    ]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + resp.body


class _Conn(asyncio.Protocol):
    """One connection, past its handshake: reads a request whole, hands it over, writes the
    answer, waits for the next one."""

    def __init__(self, server: Server, peer: str):
        self.server = server
        self.peer = peer
        self.transport: Any = None
        self.buf = bytearray()
        self.head: Head | None = None
        self.phase = "new"
        self.since = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False  # forgotten by the server: nothing more is read or answered
        self.lost = False  # asyncio says the connection is gone
        self.peer_done = False  # the peer sent its end: closed once answered
        self.requests = 0

    # ---- asyncio's side -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.server.conns.add(self)
        self._phase("idle", self.server.limits.request)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.phase == "working":
            self.buf += data  # pipelined: read once the answer is written
            return
        if self.phase == "idle":
            if not self.buf and data.strip(b"\r\n") == b"":
                return  # blank lines between requests
            self._phase("request", self.server.limits.request)
        self.buf += data
        self._parse()

    def eof_received(self) -> bool:
        # a plain connection half-closed while its request is at work: kept for the answer
        self.peer_done = True
        tls = self.transport.get_extra_info("sslcontext") is not None
        return self.phase == "working" and not tls

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._forget()

    # ---- the phases -----------------------------------------------------------------------

    def _phase(self, name: str, deadline: float | None) -> None:
        self.phase, self.since = name, time.monotonic()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if deadline is not None:
            self.timer = self.server.loop.call_later(deadline, self._expired, name)

    def _expired(self, phase: str) -> None:
        if self.closed or self.phase != phase:
            return
        if phase == "request":
            self.server.count("request")
            self._fail(
                408, f"the request did not arrive whole within {self.server.limits.request:g} s"
            )
        else:
            self.server.count("idle" if self.requests else "request")
            self.close(abort=True)

    def _parse(self) -> None:
        limits = self.server.limits
        if self.head is None:
            if self.buf.startswith(b"\r\n"):
                del self.buf[: len(self.buf) - len(self.buf.lstrip(b"\r\n"))]
            end = self.buf.find(b"\r\n\r\n")
            if end < 0 or end > limits.header_bytes:
                if len(self.buf) > limits.header_bytes:
                    self._fail(431, f"the headers are over {limits.header_bytes} bytes")
                return
            raw = bytes(self.buf[:end])
            del self.buf[: end + 4]
            try:
                self.head = parse_head(raw, limits.body_bytes)
            except HttpError as e:
                self.server.count("unreadable")
                self._fail(e.status, str(e))
                return
            if self.head.expect_continue and len(self.buf) < self.head.length:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if len(self.buf) < self.head.length:
            return
        head, body = self.head, bytes(self.buf[: self.head.length])
        del self.buf[: head.length]
        self.head = None
        self.requests += 1
        self._dispatch(head, body)

    def _dispatch(self, head: Head, body: bytes) -> None:
        self._phase("working", None)
        self.transport.pause_reading()
        path, _, query = head.target.partition("?")
        route = self.server.routes.get(path)
        if route is None:
            self.respond(text(404, f"nothing is served at {path[:200]}"), head.close)
            return
        if head.method not in route.methods:
            allow = ", ".join(route.methods)
            resp = text(405, f"{path} takes {allow}")
            self.respond(Response(resp.status, resp.body, headers=(("Allow", allow),)), head.close)
            return
        req = Request(head.method, path, query, head.headers, body, self.peer)
        if route.inline:
            self.respond(self.server.call(route, req), head.close)
            return
        fut = self.server.loop.run_in_executor(self.server.pool, self.server.call, route, req)
        fut.add_done_callback(lambda f: self._done(f, head.close))

    def _done(self, fut: asyncio.Future[Response], close: bool) -> None:
        if self.closed or fut.cancelled():
            return
        self.respond(fut.result(), close)

    def respond(self, resp: Response, close: bool) -> None:
        if self.closed:
            return
        close = close or self.peer_done
        self.transport.write(encode(resp, close))
        if self.transport.get_write_buffer_size():
            self.server.loop.call_later(self.server.limits.write, self._write_check, close)
        if close:
            self.close(abort=False)
            return
        self._phase("idle", self.server.limits.idle)
        self.transport.resume_reading()
        if self.buf:
            self._phase("request", self.server.limits.request)
            self._parse()

    def _write_check(self, closing: bool) -> None:
        """An answer not taken by the peer within the write deadline: the connection goes."""
        if self.lost or (not closing and self.closed):
            return
        pending = self.transport.get_write_buffer_size()
        if pending:
            self.server.count("write")
        if pending or closing:
            self.close(abort=True)

    def _fail(self, status: int, reason: str) -> None:
        self.buf.clear()
        self.respond(self.server.error(status, reason), close=True)

    def close(self, abort: bool) -> None:
        if self.closed:
            if abort and not self.lost and self.transport is not None:
                self.transport.abort()
            return
        self._forget()
        if self.transport is None:
            return
        if abort:
            self.transport.abort()
        else:
            self.transport.close()  # the answer is written first
            if not self.transport.get_write_buffer_size():
                # a TLS peer that never answers the close: not waited for long
                self.server.loop.call_later(self.server.limits.write, self._abort_if_open)

    def _abort_if_open(self) -> None:
        if not self.lost:
            self.transport.abort()

    def _forget(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.server.conns.discard(self)


class Server:
    """The server: start() binds (OSError when it cannot) and serves from a thread of its own;
    stop() closes everything. tls: a deploy.tls.ServingCert (its context is read at each
    handshake, so a renewed certificate is served without a restart), None for plain HTTP;
    error: the answer to a request that cannot be read or handled (status, reason)."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[str, Route],
        limits: Limits | None = None,
        tls: ServingCert | None = None,
        log: Callable[[str], None] = print,
        error: Callable[[int, str], Response] = text,
        name: str = "server",
    ):
        self.host, self.port, self.routes = host, port, routes
        self.limits = limits or Limits()
        self.tls, self.log, self.error, self.name = tls, log, error, name
        self.conns: set[_Conn] = set()
        self.handshaking: dict[socket.socket, float] = {}
        self.stats: dict[str, int] = {}
        self.loop = asyncio.new_event_loop()
        self.pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-")
        self._said: set[str] = set()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._ready: Future[None] = Future()

    @property
    def address(self) -> tuple[str, int]:
        assert self._sock is not None, "start() first"
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._sock = socket.create_server((self.host, self.port), family=family, backlog=128)
        self._sock.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._ready.result()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.set_exception_handler(self._loop_error)
        accept = self.loop.create_task(self._accept())
        stats = self.loop.create_task(self._say_stats())
        self.loop.call_soon(self._ready.set_result, None)
        try:
            self.loop.run_forever()
        finally:
            tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for t in (accept, stats, *tasks):
                t.cancel()
            self.loop.run_until_complete(
                asyncio.gather(accept, stats, *tasks, return_exceptions=True)
            )
            self.loop.close()

    def stop(self) -> None:
        if self._thread is None:
            return
        self.loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(timeout=10)
        self._thread = None
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _shutdown(self) -> None:
        if self._sock is not None:
            self._sock.close()
        for c in list(self.conns):
            c.close(abort=True)
        for s in list(self.handshaking):
            _shut(s)
        self.loop.stop()

    # ---- accepting --------------------------------------------------------------------------

    async def _accept(self) -> None:
        assert self._sock is not None
        while True:
            try:
                sock, addr = await self.loop.sock_accept(self._sock)
            except OSError as e:  # out of descriptors, or the like: said, then tried again
                self._say_once("accept", f"cannot accept a connection: {e.strerror or e}")
                await asyncio.sleep(0.1)
                continue
            if not self._admit():
                self.count("refused")
                _shut(sock)
                sock.close()
                continue
            self.handshaking[sock] = time.monotonic()
            self.loop.create_task(self._handshake(sock, _peer(addr)))

    async def _handshake(self, sock: socket.socket, peer: str) -> None:
        ctx = self.tls.context() if self.tls is not None else None
        try:
            await self.loop.connect_accepted_socket(
                lambda: _Conn(self, peer),
                sock,
                ssl=ctx,
                ssl_handshake_timeout=self.limits.handshake if ctx else None,
            )
        except Exception as e:  # noqa: BLE001
            # the handshake failed (OSError, ssl.SSLError), timed out or was cut to make room
            if sock in self.handshaking:
                self.count("handshake" if "longer than" in str(e) else "tls")
            sock.close()
        finally:
            self.handshaking.pop(sock, None)

    def _admit(self) -> bool:
        """Room for one more connection: at the bound, the one waiting longest without a
        whole request is closed. False when every connection is at work."""
        if len(self.conns) + len(self.handshaking) < self.limits.connections:
            return True
        oldest: tuple[float, Any] | None = None
        for s, since in self.handshaking.items():
            if oldest is None or since < oldest[0]:
                oldest = (since, s)
        for c in self.conns:
            if c.phase in WAITING and (oldest is None or c.since < oldest[0]):
                oldest = (c.since, c)
        if oldest is None:
            return False
        victim = oldest[1]
        self.count("evicted")
        if isinstance(victim, _Conn):
            victim.close(abort=True)
        else:
            del self.handshaking[victim]
            _shut(victim)
        return True

    # ---- handlers, errors, what is said ---------------------------------------------------------

    def call(self, route: Route, req: Request) -> Response:
        try:
            return route.handler(req)
        except Exception as e:  # a handler's bug: answered and said, the server goes on
            why = f"{type(e).__name__}: {e}"
            self.log(f"{req.method} {req.path}: internal error: {why}")
            return self.error(500, f"internal error: {why}")

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: Mapping[str, object]) -> None:
        """What asyncio would print (with a traceback): one line, once a minute at most."""
        exc = context.get("exception")
        what = f"{type(exc).__name__}: {exc}" if exc is not None else ""
        self._say_once(f"loop:{context.get('message')}", f"{context.get('message')} {what}".strip())

    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def _say_once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.log(line)

    async def _say_stats(self) -> None:
        said: dict[str, int] = {}
        while True:
            await asyncio.sleep(STATS_EVERY)
            self._said.clear()
            line = self.stats_line(said)
            said = dict(self.stats)
            if line:
                self.log(line)

    def stats_line(self, before: Mapping[str, int]) -> str:
        """What was closed since `before` (a copy of stats), as one line; '' when nothing."""
        lim = self.limits
        words = {
            "handshake": f"did not finish TLS within {lim.handshake:g} s",
            "tls": "failed their TLS handshake",
            "request": f"sent no whole request within {lim.request:g} s",
            "idle": f"stayed idle {lim.idle:g} s",
            "write": f"did not read their answer within {lim.write:g} s",
            "unreadable": "sent a request that could not be read",
            "evicted": f"were closed to make room (at most {lim.connections} connections)",
            "refused": "were refused, every connection being at work",
        }
        parts = []
        for key, what in words.items():
            n = self.stats.get(key, 0) - before.get(key, 0)
            if n:
                parts.append(f"{n} {what}")
        return f"connections closed in the last minute: {'; '.join(parts)}" if parts else ""


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _peer(addr: object) -> str:
    """A peer as asyncio names it: (host, port, ...) for TCP, else as it is."""
    if not isinstance(addr, tuple) or len(addr) < 2:
        return str(addr)
    host, port = addr[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
