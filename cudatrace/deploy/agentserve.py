"""What `cudatrace node` serves (agent.py does the passes): the agent's own series beside the
budgets' (present/metrics.py), the watch's stops and identities, and /metrics (to whom the API
server authorizes, with --metrics-auth kubernetes), /healthz (a pass finished lately: liveness)
and /readyz (the first pass is done: readiness) on the services' HTTP(S) server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

from .agent import Agent
from .httpserver import Limits, Request, Response, Route, Server, text
from .kube import Authorizer
from .tls import ServingCert

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry  # the metrics extra, imported where served


def node_collector(agent: Agent) -> Any:
    """The agent's own series: the install it serves, the processes running unfenced, the
    processes --enforce stopped, the identities it could verify."""
    from prometheus_client.core import GaugeMetricFamily

    class NodeCollector:
        def describe(self) -> list[GaugeMetricFamily]:
            return []

        def collect(self) -> Iterator[Any]:
            info = GaugeMetricFamily(
                "cudatrace_node_preload_info",
                "The preload library the node's specs point at",
                labels=["id"],
            )
            if agent.installed is not None:
                info.add_metric([agent.installed.ident], 1)
            unf = GaugeMetricFamily(
                "cudatrace_node_unfenced_processes",
                "Processes given a budget that use CUDA without the preload library",
                labels=["namespace", "pod", "container"],
            )
            counts: dict[tuple[str, str, str], int] = {}
            for p in agent.unfenced:
                ident = agent.identities.get(p.pid)
                lv = ident.labels() if ident is not None else p.labels()
                counts[lv] = counts.get(lv, 0) + 1
            for lv, n in sorted(counts.items()):
                unf.add_metric(list(lv), n)
            ctx = GaugeMetricFamily(
                "cudatrace_node_contexts_counted",
                "Context figures the agent set for members in other pid namespaces",
            )
            ctx.add_metric([], agent.contexts_counted)
            yield info
            yield unf
            yield ctx
            yield from _watch_families(agent)

    return NodeCollector()


def _watch_families(agent: Agent) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    stopped = CounterMetricFamily(
        "cudatrace_watch_stopped",
        "Processes --enforce stopped, by the watch's breach (0 without --enforce)",
        labels=["gpu", "UUID", "kind"],
    )
    for lv, n in sorted(agent.stops().items()):
        stopped.add_metric(list(lv), n)
    yield stopped
    ids = GaugeMetricFamily(
        "cudatrace_node_identities",
        "Processes by what the node could verify of them: verified (a pod the API server "
        "lists with that container), unverified, mismatch (the environment names another)",
        labels=["state"],
    )
    for k, n in agent.ids.counts().items():
        ids.add_metric([k], n)
    yield ids


def health(agent: Agent) -> tuple[int, str]:
    """/healthz: a pass finished within three intervals (30 s at least): else the agent is
    stuck (a liveness probe restarts it)."""
    if agent.pass_ended is None:
        return 503, "no pass has finished yet"
    late = time.monotonic() - agent.pass_ended
    most = max(3 * agent.cfg.interval, 30.0)
    if late > most:
        return 503, f"no pass finished for {late:.0f} s (at most {most:.0f})"
    return 200, "ok"


def routes(
    agent: Agent, registry: CollectorRegistry, authorizer: Authorizer | None = None
) -> dict[str, Route]:
    """/metrics (to whom authorizer allows, when one is given), /healthz, /readyz."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    def metrics(req: Request) -> Response:
        if authorizer is not None:
            code, why = authorizer.check(req.headers.get("authorization", ""), req.path)
            if code != 200:
                agent.say(f"a scrape from {req.peer} refused: {why}")
                extra = (("WWW-Authenticate", 'Bearer realm="cudatrace"'),) if code == 401 else ()
                return Response(code, (why + "\n").encode(), headers=extra)
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    def healthz(req: Request) -> Response:
        return text(*health(agent))

    def readyz(req: Request) -> Response:
        if agent.pass_ended is None or agent.installed is None:
            return text(503, "the first pass has not finished")
        return text(200, "ok")

    return {
        "/metrics": Route(metrics),
        "/healthz": Route(healthz, inline=True),
        "/readyz": Route(readyz, inline=True),
    }


def serve(
    agent: Agent,
    host: str,
    port: int,
    ready: Callable[[str], None],
    tls: ServingCert | None = None,
    authorizer: Authorizer | None = None,
) -> None:
    """Serve the metrics on host:port and run the agent until interrupted. tls: a
    tls.ServingCert (HTTPS); authorizer: a kube.Authorizer (who may read /metrics)."""
    from prometheus_client import CollectorRegistry

    from ..present.metrics import Collector, Gpus

    reg = CollectorRegistry(auto_describe=False)
    # a container's ordinals are its own: gpu and UUID come from where the watch saw its
    # members (NVML's lists), "" where it could not, never from this process's devices
    gpus = Gpus({}, "")
    reg.register(Collector(agent.published, gpus=gpus, member_labels=agent.member_labels))
    reg.register(node_collector(agent))
    agent.cycle()  # the first pass before the first scrape
    limits = Limits(connections=128, idle=120.0, workers=2)
    server = Server(host, port, routes(agent, reg, authorizer), limits, tls=tls, log=agent.say,
                    name="node-metrics")  # fmt: skip
    server.start()
    scheme = "https" if tls is not None else "http"
    ready(f"{scheme}://{host if ':' not in host else '[' + host + ']'}:{server.address[1]}/metrics")
    stop = threading.Event()
    try:
        agent.run(stop)
    finally:
        stop.set()
        server.stop()
