"""`cudatrace node`: the node agent for containers and Kubernetes (docs/containers.md,
docs/kubernetes.md)."""

from __future__ import annotations

import os
import socket

import click

from ..errors import CudatraceError
from ..stopping import stop_on_signals
from .node_options import KubeAccess, NodeSetup


@click.command()
@NodeSetup.options()
@click.option(
    "--listen",
    metavar="HOST:PORT",
    default="127.0.0.1:9478",
    show_default=True,
    help="Where to serve /metrics (budgets name pids and containers: loopback by default).",
)
@click.option(
    "--interval",
    default=2.0,
    show_default=True,
    type=click.FloatRange(0.05),
    metavar="SECONDS",
    help="Seconds between two passes over the node's ledgers.",
)
@KubeAccess.options("Post denials as Pod Events")
@click.option(
    "--node-name", metavar="NAME", help="This node's name (default $NODE_NAME, else the host name)."
)
def node(
    setup: NodeSetup,
    listen: str,
    interval: float,
    access: KubeAccess,
    node_name: str | None,
) -> int:
    """The node agent: install the preload library, keep the groups' ledger directories and
    the CDI specs, count the CUDA contexts of members in other pid namespaces, report denials
    (Pod Events on Kubernetes) and serve the metrics with container labels.

    \b
    cudatrace node --budget 8GiB --groups /etc/cudatrace/groups.conf --listen 0.0.0.0:9478
    """
    from .metrics import parse_listen

    host, port = parse_listen(listen)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise CudatraceError(
            "node needs the Prometheus client: pip install 'cudatrace[metrics]'"
        ) from None
    from ..deploy.agent import Agent, Config, serve

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
    )
    agent = Agent(cfg)
    agent.prepare()
    try:
        with stop_on_signals():
            serve(
                agent,
                host,
                port,
                lambda url: click.echo(f"cudatrace: serving metrics on {url}", err=True),
            )
    except OSError as e:
        raise CudatraceError(f"cannot listen on {listen}: {e.strerror or e}") from None
    except KeyboardInterrupt:
        pass
    return 0
