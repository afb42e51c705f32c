"""`cudatrace manifests kubernetes|systemd`: what a cluster or a host needs to run the node
agent, the webhook and the DRA plugin (docs/kubernetes.md, docs/containers.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NamedTuple

import click

from ..errors import OptionError
from .node_options import NodeSetup
from .options import choice_option, listen_option, option_group


@click.group()
def manifests() -> None:
    """Print the Kubernetes manifests or the systemd unit of cudatrace's container pieces."""


class Route(NamedTuple):
    """Which of the two Kubernetes routes the stream holds: the webhook, DRA, or both."""

    dra: bool = False
    webhook: bool = True
    replicas: int = 2
    tls_dir: Path | None = None
    kubelet_dir: str = "/var/lib/kubelet"
    gpu_cdi: str = "nvidia.com/gpu={index}"


class Access(NamedTuple):
    """Who may reach the pieces, how certificates are renewed, what the webhook does with a
    review it cannot read (docs/kubernetes.md)."""

    metrics_auth: str = "kubernetes"
    scraper_namespaces: tuple[str, ...] = ()
    webhook_on_error: str = "refuse"
    renew_tls: bool = False
    new_ca: bool = False

    @classmethod
    def options(cls) -> list[Any]:
        return [
            choice_option(
                "--metrics-auth",
                ["kubernetes", "none"],
                "The node agents' metrics: kubernetes, over HTTPS to a bearer token the "
                "API server says may get /metrics (bind cudatrace-metrics-reader to the "
                "scraper); none, plain HTTP on the pod's IP (pair it with --scraper-namespace).",
            ),
            click.option(
                "--scraper-namespace",
                "scraper_namespaces",
                metavar="NS",
                multiple=True,
                help="A NetworkPolicy: the agents admit only pods of NS (repeatable; where the "
                "network plugin enforces policies).",
            ),
            choice_option(
                "--webhook-on-error",
                ["refuse", "allow"],
                "A pod the webhook cannot read or reach: refuse it (failurePolicy Fail), "
                "or admit it unfenced with a warning (failurePolicy Ignore).",
            ),
            click.option(
                "--renew-tls",
                is_flag=True,
                help="Sign new certificates now with the kept CA (the caBundle stays the same). "
                "Without it they are renewed within 30 days of their end.",
            ),
            click.option(
                "--new-ca",
                is_flag=True,
                help="Make a new CA and certificates; the old CA stays in the caBundle until it "
                "expires, so no pod is refused while the replicas take the new certificate.",
            ),
        ]


@manifests.command()
@click.option("--image", required=True, help="The image with cudatrace (node agent and webhook).")
@click.option("--namespace", default="cudatrace", show_default=True)
@click.option(
    "--tls-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The CA (ca.crt, ca.key) and the certificates of the webhook (tls.*) and of the "
    "agents' metrics (metrics.*); made here (openssl) when missing, renewed within 30 days of "
    "their end. Required with the webhook or --metrics-auth kubernetes.",
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
@option_group("access", Access, Access.options())
def kubernetes(
    image: str,
    namespace: str,
    budgets: tuple[str, ...],
    groups: Path | None,
    runtime_class: str,
    node_selector: str,
    route: Route,
    access: Access,
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
    tls = metrics_tls = None
    if route.tls_dir is None and (route.webhook or access.metrics_auth == "kubernetes"):
        raise OptionError(
            "--tls-dir: the certificates of the webhook and of the agents' metrics are kept "
            "there (or --no-webhook and --metrics-auth none)"
        )
    renew, new_ca = access.renew_tls, access.new_ca
    for part, wanted in (("webhook", route.webhook), ("node", access.metrics_auth != "none")):
        if not wanted or route.tls_dir is None:
            continue
        svc = f"{m.APP}-{part}"
        names = [svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc"]
        made = make_tls(route.tls_dir, names, name="tls" if part == "webhook" else "metrics",
                        renew=renew or new_ca, new_ca=new_ca)  # fmt: skip
        new_ca = False  # one new CA signs both
        if part == "webhook":
            tls = made
        else:
            metrics_tls = made
    cluster = m.Cluster(
        image=image,
        tls=tls,
        namespace=namespace,
        budgets=tuple(budgets),
        groups_text=groups.read_text() if groups is not None else None,
        runtime_class=runtime_class,
        replicas=route.replicas,
        node_selector=selector,
        dra=route.dra,
        kubelet_dir=route.kubelet_dir,
        gpu_cdi=check_gpu_cdi(route.gpu_cdi),
        metrics_auth=access.metrics_auth,
        metrics_tls=metrics_tls,
        scraper_namespaces=tuple(_namespace(n) for n in access.scraper_namespaces),
        webhook_on_error=access.webhook_on_error,
    )
    click.echo(m.yaml_stream(m.kubernetes(cluster)), nl=False)


def _namespace(name: str) -> str:
    import re

    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise OptionError(f"--scraper-namespace {name!r}: not a namespace's name")
    return name


@manifests.command()
@NodeSetup.options()
@listen_option("127.0.0.1:9478")
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
