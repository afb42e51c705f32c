"""`cudatrace node`: the node agent for containers and Kubernetes (docs/containers.md,
docs/kubernetes.md)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, NamedTuple

import click

from ..errors import CudatraceError, OptionError
from ..stopping import stop_on_signals
from .node_options import KubeAccess, NodeSetup
from .options import choice_option, listen_option, option_group, seconds_option
from .params import DeviceSize


class Watching(NamedTuple):
    """What the node's watch does with what it finds (docs/containers.md, "The node's watch")."""

    enforce: bool = False
    grace: float = 5.0
    margin: int = 64 << 20
    once: bool = False
    as_json: bool = False

    @classmethod
    def options(cls) -> list[Any]:
        return [
            click.option(
                "--enforce",
                is_flag=True,
                help="Stop a process the watch finds holding GPU memory its ledger does not "
                "count, running without a fence on a fenced GPU, or taking its group over its "
                "budget by NVML's count: SIGTERM, then SIGKILL after --grace (off: said and "
                "counted only).",
            ),
            seconds_option("--grace", 5.0, "With --enforce: seconds between SIGTERM and SIGKILL."),
            click.option(
                "--margin",
                default="64MiB",
                show_default=True,
                type=DeviceSize(),
                metavar="SIZE",
                help="What a member whose CUDA context is counted may hold by NVML beyond its "
                "ledger's figure (docs/budgets.md's stated margin; one without a context: "
                "NVML's 2 MiB granularity).",
            ),
            click.option(
                "--once",
                is_flag=True,
                help="One pass, read-only (no install, no specs, no directory removed): print "
                "what the agent sees (the ledgers, the watch) and exit.",
            ),
            click.option("--json", "as_json", is_flag=True, help="With --once: as JSON."),
        ]


class MetricsAccess(NamedTuple):
    """Who may read the agent's metrics, and over what (docs/kubernetes.md, "Metrics and who
    may read them")."""

    listen: str = "127.0.0.1:9478"
    metrics_auth: str = "none"
    metrics_cert: Path | None = None
    metrics_key: Path | None = None

    @classmethod
    def options(cls) -> list[Any]:
        file = click.Path(dir_okay=False, exists=True, path_type=Path)
        return [
            listen_option(
                "127.0.0.1:9478",
                "Where to serve /metrics, /healthz and /readyz (budgets name pids and "
                "containers: loopback by default; the pod's IP in the DaemonSet).",
            ),
            choice_option(
                "--metrics-auth",
                ["none", "kubernetes"],
                "kubernetes: a scrape's bearer token must be one the API server says may "
                "get /metrics (TokenReview, SubjectAccessReview: as kube-rbac-proxy); needs "
                "--metrics-cert. /healthz and /readyz stay open.",
            ),
            click.option(
                "--metrics-cert",
                metavar="FILE",
                type=file,
                help="Serve over HTTPS with this certificate (PEM; read again when it changes).",
            ),
            click.option("--metrics-key", metavar="FILE", type=file, help="Its key (PEM)."),
        ]

    def resolve(self, kube: Any, say: Any) -> tuple[Any, Any]:
        """(the served certificate or None, the authorizer or None)."""
        from ..deploy.kube import Authorizer
        from ..deploy.tls import ServingCert

        if (self.metrics_cert is None) != (self.metrics_key is None):
            raise OptionError("--metrics-cert and --metrics-key go together")
        if self.metrics_auth == "kubernetes":
            if self.metrics_cert is None:
                raise OptionError(
                    "--metrics-auth kubernetes: give --metrics-cert and --metrics-key (a bearer "
                    "token is never read over plain HTTP)"
                )
            if kube is None:
                raise OptionError("--metrics-auth kubernetes: no API server (--kubernetes)")
        tls = None
        if self.metrics_cert is not None and self.metrics_key is not None:
            tls = ServingCert(self.metrics_cert, self.metrics_key, say)
        return tls, Authorizer(kube) if self.metrics_auth == "kubernetes" else None


@click.command()
@NodeSetup.options()
@option_group("metrics", MetricsAccess, MetricsAccess.options())
@seconds_option("--interval", 2.0, "Seconds between two passes over the node's ledgers.", 0.05)
@KubeAccess.options("Post denials as Pod Events")
@option_group("watching", Watching, Watching.options())
@click.option(
    "--node-name", metavar="NAME", help="This node's name (default $NODE_NAME, else the host name)."
)
def node(
    setup: NodeSetup,
    metrics: MetricsAccess,
    interval: float,
    access: KubeAccess,
    watching: Watching,
    node_name: str | None,
) -> int:
    """The node agent: install the preload library, keep the groups' ledger directories and
    the CDI specs, count the CUDA contexts of members in other pid namespaces, report denials
    (Pod Events on Kubernetes), watch the GPUs through NVML against the ledgers (--enforce
    stops what breaches them) and serve the metrics with container labels.

    \b
    cudatrace node --budget 8GiB --groups /etc/cudatrace/groups.conf --listen 0.0.0.0:9478
    """
    from .metrics import parse_listen

    if watching.as_json and not watching.once:
        raise click.UsageError("--json goes with --once")
    listen = metrics.listen
    host, port = parse_listen(listen)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise CudatraceError(
            "node needs the Prometheus client: pip install 'cudatrace[metrics]'"
        ) from None
    from ..deploy.agent import Agent, Config
    from ..deploy.agentserve import serve

    kube = access.resolve()
    cfg = Config(
        budgets=setup.budgets,
        groups=setup.groups,
        on_exceed=setup.on_exceed,
        root=setup.root,
        state=setup.state,
        cdi_dir=setup.cdi_dir,
        vendor=setup.vendor,
        preload=setup.preload,
        shim=setup.shim,
        interval=interval,
        node=node_name or os.environ.get("NODE_NAME") or socket.gethostname(),
        kube=kube,
        enforce=watching.enforce,
        grace=watching.grace,
        margin=watching.margin,
        once=watching.once,
    )
    agent = Agent(cfg)
    if watching.once:
        return _once(agent, watching.as_json)
    tls, authorizer = metrics.resolve(kube, agent.say)
    agent.prepare()
    try:
        with stop_on_signals():
            serve(
                agent,
                host,
                port,
                lambda url: click.echo(f"cudatrace: serving metrics on {url}", err=True),
                tls,
                authorizer,
            )
    except OSError as e:
        raise CudatraceError(f"cannot listen on {listen}: {e.strerror or e}") from None
    except KeyboardInterrupt:
        pass
    return 0


def _once(agent: Any, as_json: bool) -> int:
    """`cudatrace node --once`: one pass, its view printed; stops under way are waited for."""
    import json

    from ..present.status import render_status

    agent.cycle()
    agent.finish()
    st = agent.published()
    click.echo(json.dumps(st, indent=2) if as_json else render_status(st))
    return 0
