"""The DRA plugin's gRPC side (`cudatrace dra-plugin`): the kubelet's DRA service and its plugin
registration service, each on a unix socket, served from Python (grpcio; the messages built at
run time from deploy/dra.proto and deploy/pluginregistration.proto by cudatrace/protodesc.py,
no generated code), and a client of both (the tests talk to the plugin through it).

    <kubelet dir>/plugins_registry/<driver>-reg.sock   Registration: GetInfo says the plugin is
                                     a DRAPlugin named after the driver, at the DRA socket, with
                                     the services v1.DRAPlugin and v1beta1.DRAPlugin;
                                     NotifyRegistrationStatus is the kubelet's answer
    <kubelet dir>/plugins/<driver>/dra.sock   DRAPlugin: NodePrepareResources,
                                     NodeUnprepareResources (dra.py does the work)

The v1 and v1beta1 services have the same messages field for field; both names are served with
the v1 classes. The kubelet finds the plugin when the registration socket appears and forgets it
when the socket goes: the plugin makes it last and removes it first.
"""

from __future__ import annotations

import functools
import os
import signal
import stat
import threading
import time
from collections.abc import Mapping
from concurrent import futures
from pathlib import Path
from typing import Any, Callable

from ..errors import CudatraceError
from ..protodesc import Proto, load
from .dra import ClaimRef, DraError, Plugin, Prepared
from .httpserver import Limits, Request, Response, Route, text
from .httpserver import Server as HttpServer

PLUGIN_TYPE = "DRAPlugin"  # pluginregistration's type of a DRA plugin
SERVICES = {  # what the registration lists -> the gRPC service's full name
    "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
}
REGISTRATION = "pluginregistration.Registration"
_V1 = SERVICES["v1.DRAPlugin"]
_SOCKET_MAX = 107  # sun_path less its NUL
EXTRA = "pip install 'cudatrace[dra]'"


def grpc_module() -> Any:
    """grpcio, or an error saying how to get it."""
    try:
        import grpc
    except ImportError:
        raise CudatraceError(f"the DRA plugin needs grpcio and protobuf: {EXTRA}") from None
    return grpc


@functools.cache
def protos() -> tuple[Proto, Proto]:
    """(the DRA API, the registration API), their messages and services."""
    here = Path(__file__).parent
    try:
        return (
            load(here / "dra.proto", "cudatrace/deploy/dra.proto"),
            load(here / "pluginregistration.proto", "cudatrace/deploy/pluginregistration.proto"),
        )
    except ImportError:
        raise CudatraceError(f"the DRA plugin needs grpcio and protobuf: {EXTRA}") from None


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]


def _prepare_response(cls: Any, results: Mapping[str, Prepared | str]) -> Any:
    resp = cls()
    for uid, r in results.items():
        entry = resp.claims[uid]  # an entry for every claim, an empty one included
        if isinstance(r, str):
            entry.error = r
            continue
        entry.SetInParent()
        for names, pool, device, ids in r.devices:
            entry.devices.add(
                request_names=list(names), pool_name=pool, device_name=device,
                cdi_device_ids=list(ids),
            )  # fmt: skip
    return resp


def _unprepare_response(cls: Any, results: Mapping[str, str]) -> Any:
    resp = cls()
    for uid, error in results.items():
        entry = resp.claims[uid]
        entry.SetInParent()
        if error:
            entry.error = error
    return resp


def _handler(
    grpc: Any, name: str, methods: Mapping[str, tuple[Any, Any, Callable[..., Any]]]
) -> Any:
    return grpc.method_handlers_generic_handler(
        name,
        {
            m: grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
            )
            for m, (req, resp, fn) in methods.items()
        },
    )


def _unlink_socket(path: Path) -> None:
    """Remove a socket left by an earlier run; refuse to remove anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise DraError(f"{path} is there and is not a socket; refusing to replace it")
    os.unlink(path)


class Server:
    """The plugin's two gRPC servers."""

    def __init__(self, plugin: Plugin, say: Callable[[str], None]):
        self.plugin = plugin
        self.say = say
        self.servers: list[Any] = []

    def _dra_methods(self) -> dict[str, tuple[Any, Any, Callable[..., Any]]]:
        dra, _ = protos()
        svc = dra.services[_V1]
        (prep_in, prep_out), (unprep_in, unprep_out) = (
            svc["NodePrepareResources"],
            svc["NodeUnprepareResources"],
        )
        plugin = self.plugin
        return {
            "NodePrepareResources": (
                prep_in,
                prep_out,
                lambda req, ctx: _prepare_response(prep_out, plugin.prepare(_refs(req))),
            ),
            "NodeUnprepareResources": (
                unprep_in,
                unprep_out,
                lambda req, ctx: _unprepare_response(unprep_out, plugin.unprepare(_refs(req))),
            ),
        }

    def _registration_methods(self) -> dict[str, tuple[Any, Any, Callable[..., Any]]]:
        _, reg = protos()
        svc = reg.services[REGISTRATION]
        cfg = self.plugin.cfg

        def get_info(req: Any, ctx: Any) -> Any:
            return svc["GetInfo"][1](
                type=PLUGIN_TYPE, name=cfg.driver, endpoint=str(cfg.socket),
                supported_versions=list(SERVICES),
            )  # fmt: skip

        def notify(req: Any, ctx: Any) -> Any:
            if req.plugin_registered:
                self.plugin.registered = "registered"
                self.say(f"the kubelet registered the driver {cfg.driver}")
            else:
                self.plugin.registered = f"refused: {req.error}"
                self.say(f"the kubelet refused the driver {cfg.driver}: {req.error}")
            return svc["NotifyRegistrationStatus"][1]()

        return {
            "GetInfo": (svc["GetInfo"][0], svc["GetInfo"][1], get_info),
            "NotifyRegistrationStatus": (*svc["NotifyRegistrationStatus"], notify),
        }

    def _serve(self, path: Path, handlers: list[Any]) -> None:
        grpc = grpc_module()
        if len(str(path)) > _SOCKET_MAX:
            raise DraError(f"{path}: a unix socket's path is at most {_SOCKET_MAX} bytes")
        try:
            path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            _unlink_socket(path)
        except OSError as e:
            raise DraError(f"cannot make the socket {path}: {e.strerror}") from None
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers(handlers)
        try:
            bound = server.add_insecure_port(f"unix://{path}")
        except RuntimeError as e:
            raise DraError(f"cannot serve on {path}: {e}") from None
        if not bound:
            raise DraError(f"cannot serve on {path}")
        server.start()
        os.chmod(path, 0o600)  # the kubelet (root) alone
        self.servers.append((server, path))

    def start(self) -> None:
        """The DRA service first, then the registration the kubelet finds."""
        grpc = grpc_module()
        cfg = self.plugin.cfg
        dra = [_handler(grpc, name, self._dra_methods()) for name in SERVICES.values()]
        self._serve(cfg.socket, dra)
        reg = [_handler(grpc, REGISTRATION, self._registration_methods())]
        self._serve(cfg.registration_socket, reg)

    def stop(self) -> None:
        """The registration first (the kubelet forgets the plugin), then the DRA service."""
        for server, path in reversed(self.servers):
            server.stop(grace=2).wait()
            try:
                _unlink_socket(path)
            except (OSError, DraError):
                pass
        self.servers.clear()


def serve(
    plugin: Plugin,
    resync: float,
    ready: Callable[[str], None],
    health: tuple[str, int] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT: publish the ResourceSlice (again after a pause that
    grows while it cannot be), then every resync seconds sweep the claims' directories and make
    the slice again if the kubelet removed it. health: where to serve /healthz and /readyz."""
    server = Server(plugin, plugin.say)
    stop = threading.Event()
    old = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited ignored
    probes = None
    try:
        server.start()
        wait = plugin.keep_published(resync)
        if health is not None:
            probes = health_server(plugin, resync, *health)
        ready(f"serving {plugin.cfg.driver} on {plugin.cfg.socket}")
        while not stop.wait(wait):
            wait = one_pass(plugin, resync)
    except KeyboardInterrupt:
        pass
    finally:
        if probes is not None:
            probes.stop()
        server.stop()
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)


def one_pass(plugin: Plugin, resync: float) -> float:
    """A pass of the loop; the seconds until the next. What fails is said, never raised: the
    plugin goes on serving the kubelet."""
    plugin.last_pass = time.monotonic()
    try:
        plugin.sweep()
    except Exception as e:  # a pass that meets the unforeseen: said, tried at the next
        plugin.say(f"the pass over the claims' directories failed: {type(e).__name__}: {e}")
    try:
        return plugin.keep_published(resync)
    except Exception as e:
        plugin.say(f"the pass over the ResourceSlice failed: {type(e).__name__}: {e}")
        return resync


# ---- health -----------------------------------------------------------------------------------


def check_sockets(plugin: Plugin, timeout: float = 2.0) -> str:
    """'' when both sockets answer as the kubelet would call them, else why not."""
    grpc = grpc_module()
    cfg = plugin.cfg
    calls: tuple[tuple[Path, Callable[[Client], object]], ...] = (
        (cfg.registration_socket, lambda c: c.get_info()),
        (cfg.socket, lambda c: c.prepare([])),
    )
    for path, call in calls:
        client = Client(path, timeout=timeout)
        try:
            call(client)
        except grpc.RpcError as e:
            return f"{path} does not answer: {e.code().name}"
        finally:
            client.close()
    return ""


def health_routes(plugin: Plugin, resync: float) -> dict[str, Route]:
    """/healthz: the loop made a pass lately and both sockets answer (liveness: else the
    plugin is stuck, restart it); /readyz: the kubelet registered the plugin and its
    ResourceSlice is published (readiness)."""

    def healthz(req: Request) -> Response:
        late = time.monotonic() - plugin.last_pass
        if late > 2 * resync + 30:
            return text(503, f"the plugin's loop made no pass for {late:.0f} s")
        why = check_sockets(plugin)
        return text(503, why) if why else text(200, "ok")

    def readyz(req: Request) -> Response:
        if plugin.registered != "registered":
            return text(
                503, f"the kubelet has not registered the plugin ({plugin.registered or 'not yet'})"
            )
        if plugin.kube is not None and not plugin.published:
            return text(503, "the ResourceSlice is not published")
        return text(200, "ok")

    return {"/healthz": Route(healthz), "/readyz": Route(readyz, inline=True)}


def health_server(plugin: Plugin, resync: float, host: str, port: int) -> HttpServer:
    server = HttpServer(host, port, health_routes(plugin, resync), Limits(connections=64, workers=2),
                        log=plugin.say, name="dra-health")  # fmt: skip
    try:
        server.start()
    except OSError as e:
        raise DraError(f"cannot serve health on {host}:{port}: {e.strerror or e}") from None
    plugin.say(f"health on http://{host}:{server.address[1]}/healthz and /readyz")
    return server


class Client:
    """The plugin's services as the kubelet calls them, over a unix socket."""

    def __init__(self, socket: Path, timeout: float = 30.0):
        grpc = grpc_module()
        self.timeout = timeout
        self.channel = grpc.insecure_channel(f"unix://{Path(socket).absolute()}")

    def _call(self, service: str, method: str, proto: Proto, request: Any) -> Any:
        req_cls, resp_cls = proto.services[_V1 if service in SERVICES.values() else service][method]
        call = self.channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return call(request, timeout=self.timeout)

    def get_info(self) -> Any:
        _, reg = protos()
        return self._call(REGISTRATION, "GetInfo", reg, reg.messages["InfoRequest"]())

    def notify(self, registered: bool, error: str = "") -> Any:
        _, reg = protos()
        msg = reg.messages["RegistrationStatus"](plugin_registered=registered, error=error)
        return self._call(REGISTRATION, "NotifyRegistrationStatus", reg, msg)

    def _claims(self, method: str, cls: str, refs: list[ClaimRef], version: str) -> Any:
        dra, _ = protos()
        req = dra.messages[cls]()
        for r in refs:
            req.claims.add(namespace=r.namespace, uid=r.uid, name=r.name)
        return self._call(SERVICES[version], method, dra, req)

    def prepare(self, refs: list[ClaimRef], version: str = "v1.DRAPlugin") -> Any:
        return self._claims("NodePrepareResources", "NodePrepareResourcesRequest", refs, version)

    def unprepare(self, refs: list[ClaimRef], version: str = "v1.DRAPlugin") -> Any:
        return self._claims(
            "NodeUnprepareResources", "NodeUnprepareResourcesRequest", refs, version
        )

    def close(self) -> None:
        self.channel.close()
