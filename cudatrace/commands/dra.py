"""`cudatrace dra-plugin`: the kubelet plugin of cudatrace's Dynamic Resource Allocation driver,
whose claims of GPU memory are budgets (docs/kubernetes.md, "Dynamic Resource Allocation")."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import click

from ..errors import OptionError
from .node_options import KubeAccess, NodeSetup
from .options import option_group, seconds_option
from .params import DeviceSize

if TYPE_CHECKING:
    from ..deploy.dra import Gpu, PluginConfig


class DraSettings(NamedTuple):
    """The plugin's own options: this node, the driver, how a GPU reaches a container."""

    node_name: str | None = None
    driver: str = "gpu.cudatrace.dev"
    gpu_cdi: str = "nvidia.com/gpu={index}"
    reserve: int | None = None
    kubelet_dir: Path = Path("/var/lib/kubelet")
    resync: float = 30.0
    health_listen: str | None = None


@click.command()
@NodeSetup.options(cdi_dir_default="/var/run/cdi", offers=False)
@KubeAccess.options("Read the claims and publish the ResourceSlice through the API server")
@click.option(
    "--node-name", metavar="NAME", help="This node's name (default $NODE_NAME, else the host name)."
)
@click.option(
    "--driver",
    default="gpu.cudatrace.dev",
    show_default=True,
    help="The DRA driver's name (the DeviceClass selects its devices).",
)
@click.option(
    "--gpu-cdi",
    metavar="TEMPLATE",
    default="nvidia.com/gpu={index}",
    show_default=True,
    help="The CDI device that gives a container an allocated GPU ({index}: NVML's index, "
    "{uuid}: its UUID), as `nvidia-ctk cdi generate` names them; '' when the GPUs reach "
    "containers another way.",
)
@click.option(
    "--reserve",
    type=DeviceSize(),
    metavar="SIZE",
    help="Memory of each GPU held back from the claims (offered: NVML's total less SIZE).",
)
@click.option(
    "--kubelet-dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default="/var/lib/kubelet",
    show_default=True,
    help="The kubelet's directory: the sockets go to DIR/plugins_registry and DIR/plugins.",
)
@seconds_option(
    "--resync",
    30.0,
    "Seconds between two passes over the claims' ledger directories and the slice.",
    0.05,
)
@click.option(
    "--health-listen",
    metavar="HOST:PORT",
    help="Serve /healthz (the loop and both sockets answer: for a liveness probe) and /readyz "
    "(registered, the slice published) over HTTP here. Default: not served.",
)
@option_group("dra", DraSettings, [])
@click.option(
    "--print",
    "show",
    is_flag=True,
    help="Print the node's ResourceSlice (JSON) and exit, serving nothing.",
)
def dra_plugin(setup: NodeSetup, access: KubeAccess, dra: DraSettings, show: bool) -> int:
    """Serve the kubelet plugin of the DRA driver whose devices are the node's GPUs and whose
    claims of their memory are budgets: publish the ResourceSlice (each GPU's memory as
    consumable capacity), write a CDI spec per claim prepared on this node, fenced at the
    memory the claim consumes, and remove it when the claim is unprepared.

    \b
    cudatrace dra-plugin --node-name gpu-node-1
    """
    from ..deploy import dra as dra_mod
    from ..deploy import plan
    from ..nvml import Nvml

    if setup.cdi_dir is None:
        raise OptionError("--cdi-dir: give the directory the runtimes read (/var/run/cdi)")
    cfg = dra_mod.PluginConfig(
        node=dra.node_name or os.environ.get("NODE_NAME") or socket.gethostname(),
        driver=plan.check_vendor(dra.driver),
        vendor=plan.check_vendor(setup.vendor),
        root=setup.root,
        state=setup.state,
        cdi_dir=setup.cdi_dir,
        preload=setup.preload,
        on_exceed=setup.on_exceed,
        shim=setup.shim,
        gpu_cdi=check_gpu_cdi(dra.gpu_cdi),
        reserve=int(dra.reserve or 0),
        kubelet_dir=dra.kubelet_dir.absolute(),
    )
    nvml = Nvml()
    try:
        gpus = dra_mod.node_gpus(nvml, cfg.reserve)
    finally:
        nvml.shutdown()
    if show:
        click.echo(json.dumps(dra_mod.resource_slice(cfg, gpus), indent=2))
        return 0
    health = None
    if dra.health_listen:
        from .metrics import parse_listen

        health = parse_listen(dra.health_listen)
    return run_plugin(cfg, gpus, access, dra.resync, health)


def check_gpu_cdi(template: str) -> str:
    """--gpu-cdi: '' or VENDOR/CLASS=NAME where NAME may say {index} and {uuid}."""
    if not template:
        return ""
    kind, eq, name = template.partition("=")
    if not eq or "/" not in kind or not name:
        raise OptionError(
            f"--gpu-cdi {template!r}: give VENDOR/CLASS=NAME, e.g. nvidia.com/gpu={{index}}"
        )
    try:
        template.format(index=0, uuid="GPU-0")
    except (KeyError, IndexError, ValueError) as e:
        raise OptionError(
            f"--gpu-cdi {template!r}: only {{index}} and {{uuid}} are known ({e})"
        ) from None
    return template


def run_plugin(
    cfg: PluginConfig,
    gpus: list[Gpu],
    access: KubeAccess,
    resync: float,
    health: tuple[str, int] | None = None,
) -> int:
    """Set up, serve until stopped (publishing the slice as soon as the API server takes it)."""
    from ..deploy import dra
    from ..deploy.dra_grpc import grpc_module, protos, serve

    grpc_module()
    protos()
    say: Callable[[str], None] = lambda line: click.echo(f"cudatrace dra-plugin: {line}", err=True)
    plugin = dra.Plugin(cfg, gpus, access.resolve(), say)
    inst = plugin.setup()
    offered = ", ".join(f"{g.device} ({g.memory} bytes)" for g in gpus)
    say(f"node {cfg.node}: offering {offered}; preload library {inst.lib}")
    if plugin.kube is None:
        say("no API server (--kubernetes): the ResourceSlice is not published (--print shows it)")
    serve(plugin, resync, say, health)
    return 0
