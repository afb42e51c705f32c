"""`cudatrace manifests kubernetes|systemd`: what a cluster or a host needs to run the node
agent, the webhook and the DRA plugin (docs/kubernetes.md, docs/containers.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import click

from ..errors import OptionError
from .node_options import NodeSetup
from .options import option_group


@click.group()
def manifests() -> None:
    """Print the Kubernetes manifests or the systemd unit of cudatrace's container pieces."""


class Route(NamedTuple):
    """Which of the two Kubernetes routes the stream holds: the webhook, DRA, or both."""

    dra: bool = False
    webhook: bool = True
    tls_dir: Path | None = None
    kubelet_dir: str = "/var/lib/kubelet"
    gpu_cdi: str = "nvidia.com/gpu={index}"


@manifests.command()
@click.option("--image", required=True, help="The image with cudatrace (node agent and webhook).")
@click.option("--namespace", default="cudatrace", show_default=True)
@click.option(
    "--tls-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The webhook's ca.crt, tls.crt and tls.key; made here (openssl) when missing. "
    "Required with the webhook.",
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
@click.option(
    "--dra",
    is_flag=True,
    help="Add the DRA driver: its DeviceClass and the kubelet plugin (`dra-plugin`) on each "
    "node, whose claims of GPU memory are budgets (Kubernetes 1.34+, consumable capacity).",
)
@click.option(
    "--webhook/--no-webhook",
    default=True,
    show_default=True,
    help="The admission webhook that fences pods annotated cudatrace.dev/budget.",
)
@click.option(
    "--kubelet-dir",
    default="/var/lib/kubelet",
    show_default=True,
    help="With --dra: the kubelet's directory on the nodes (its plugin sockets).",
)
@click.option(
    "--gpu-cdi",
    metavar="TEMPLATE",
    default="nvidia.com/gpu={index}",
    show_default=True,
    help="With --dra: the CDI device that gives a container an allocated GPU; '' for none.",
)
@option_group("route", Route, [])
def kubernetes(
    image: str,
    namespace: str,
    budgets: tuple[str, ...],
    groups: Path | None,
    runtime_class: str,
    replicas: int,
    node_selector: str,
    route: Route,
) -> None:
    """The node agent (DaemonSet), the webhook (Deployment, Service, Secret), RBAC and the
    MutatingWebhookConfiguration, and with --dra the DRA driver (DeviceClass, the kubelet
    plugin's DaemonSet and RBAC), as one YAML stream for `kubectl apply -f -`."""
    from ..deploy import manifests as m
    from ..deploy import plan
    from ..deploy.tls import make_tls
    from .dra import check_gpu_cdi

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
    if not route.webhook and not route.dra:
        raise OptionError("--no-webhook: give --dra (else the stream fences nothing)")
    tls = None
    if route.webhook:
        if route.tls_dir is None:
            raise OptionError(
                "--tls-dir: the webhook's certificates are kept there (or --no-webhook)"
            )
        svc = f"{m.APP}-webhook"
        tls = make_tls(route.tls_dir, [svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc"])
    cluster = m.Cluster(
        image=image,
        tls=tls,
        namespace=namespace,
        budgets=tuple(budgets),
        groups_text=groups.read_text() if groups is not None else None,
        runtime_class=runtime_class,
        replicas=replicas,
        node_selector=selector,
        dra=route.dra,
        kubelet_dir=route.kubelet_dir,
        gpu_cdi=check_gpu_cdi(route.gpu_cdi),
    )
    click.echo(m.yaml_stream(m.kubernetes(cluster)), nl=False)


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
