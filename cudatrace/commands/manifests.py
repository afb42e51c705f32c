"""`cudatrace manifests kubernetes|systemd`: what a cluster or a host needs to run the node
agent and the webhook (docs/kubernetes.md, docs/containers.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import OptionError
from .node_options import NodeSetup


@click.group()
def manifests() -> None:
    """Print the Kubernetes manifests or the systemd unit of cudatrace's container pieces."""


@manifests.command()
@click.option("--image", required=True, help="The image with cudatrace (node agent and webhook).")
@click.option("--namespace", default="cudatrace", show_default=True)
@click.option(
    "--tls-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The webhook's ca.crt, tls.crt and tls.key; made here (openssl) when missing.",
)
@click.option(
    "--budget",
    "budgets",
    metavar="SIZE",
    multiple=True,
    help="CDI budget devices the nodes offer (containerd, CRI-O).",
)
@click.option(
    "--groups",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A groups config the nodes offer as CDI devices (a ConfigMap).",
)
@click.option(
    "--runtime-class",
    default="nvidia",
    show_default=True,
    help="The node agent's runtime class (NVML inside it); '' for none.",
)
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(1, 10))
@click.option(
    "--node-selector",
    metavar="KEY=VALUE",
    default="nvidia.com/gpu.present=true",
    show_default=True,
    help="The nodes the agent runs on (the GPU operator's label); '' for every node.",
)
def kubernetes(
    image: str,
    namespace: str,
    tls_dir: Path,
    budgets: tuple[str, ...],
    groups: Path | None,
    runtime_class: str,
    replicas: int,
    node_selector: str,
) -> None:
    """The node agent (DaemonSet), the webhook (Deployment, Service, Secret), RBAC and the
    MutatingWebhookConfiguration, as one YAML stream for `kubectl apply -f -`."""
    from ..deploy import manifests as m
    from ..deploy import plan
    from ..deploy.tls import make_tls

    selector = {}
    if node_selector:
        key, eq, value = node_selector.partition("=")
        if not eq or not key:
            raise OptionError(f"--node-selector {node_selector!r}: give KEY=VALUE")
        selector[key] = value
    for b in budgets:
        plan.size_fence(b)
    if groups is not None:
        plan.read_groups(groups)
    svc = f"{m.APP}-webhook"
    tls = make_tls(tls_dir, [svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc"])
    docs = m.kubernetes(
        image,
        tls,
        namespace,
        tuple(budgets),
        groups.read_text() if groups is not None else None,
        runtime_class,
        replicas,
        selector,
    )
    click.echo(m.yaml_stream(docs), nl=False)


@manifests.command()
@NodeSetup.options()
@click.option("--listen", metavar="HOST:PORT", default="127.0.0.1:9478", show_default=True)
@click.option(
    "--exe",
    metavar="PATH",
    help="The cudatrace command the unit runs (default: this one's, as `python -m cudatrace`).",
)
def systemd(setup: NodeSetup, listen: str, exe: str | None) -> None:
    """A systemd unit running `cudatrace node` with these settings (write it to
    /etc/systemd/system/cudatrace-node.service)."""
    from ..deploy import manifests as m
    from ..deploy import plan

    plan.fences(setup.budgets, setup.groups, setup.on_exceed)
    argv = [exe] if exe else [sys.executable, "-m", "cudatrace"]
    argv += ["node", "--root", str(setup.root.absolute()), "--state", str(setup.state.absolute())]
    argv += ["--cdi-dir", str(setup.cdi_dir.absolute())] if setup.cdi_dir else []
    argv += ["--vendor", setup.vendor, "--preload", setup.preload, "--on-exceed", setup.on_exceed]
    for b in setup.budgets:
        argv += ["--budget", b]
    if setup.groups:
        argv += ["--groups", str(setup.groups.absolute())]
    if setup.shim:
        argv += ["--shim", str(setup.shim.absolute())]
    argv += ["--listen", listen]
    click.echo(m.systemd_unit(argv), nl=False)
