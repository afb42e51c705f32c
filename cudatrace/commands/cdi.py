"""`cudatrace cdi`: CDI specs whose devices are budgets, for any CDI-capable runtime
(docs/containers.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from .node_options import NodeSetup

if TYPE_CHECKING:
    from ..deploy.objects import CdiSpec


@click.command()
@NodeSetup.options()
@click.option(
    "--print", "show", is_flag=True, help="Print the specs (JSON, by kind) instead of writing them."
)
def cdi(setup: NodeSetup, show: bool) -> None:
    """Write CDI specs whose devices are GPU memory budgets, after installing the preload
    library they point at and making the named groups' ledger directories.

    \b
    cudatrace cdi --budget 8GiB --budget 16GiB --groups /etc/cudatrace/groups.conf
    podman run --device cudatrace.dev/budget=8GiB ...     # its own 8 GiB
    podman run --device cudatrace.dev/group=team-a ...    # shares team-a's budget
    """
    run_cdi(setup, show)


def run_cdi(setup: NodeSetup, show: bool = False) -> dict[str, CdiSpec]:
    from ..deploy import cdi as cdi_mod
    from ..deploy import plan

    offered = plan.fences(setup.budgets, setup.groups, setup.on_exceed)
    plan.check_vendor(setup.vendor)
    inst, specs, written = cdi_mod.prepare(
        offered,
        setup.root,
        setup.state,
        None if show else setup.cdi_dir,
        setup.vendor,
        setup.preload,
        setup.shim,
    )
    if show:
        click.echo(json.dumps(specs, indent=2))
        return specs
    from ..deploy.install import glibc_floor

    click.echo(
        f"cudatrace: preload library {inst.lib} (images with glibc {glibc_floor()} or later; "
        "musl and static programs run unfenced)",
        err=True,
    )
    for p in written:
        click.echo(f"cudatrace: wrote {p}", err=True)
    for f in offered:
        click.echo(f"--device {setup.vendor}/{f.kind}={f.name}")
    return specs
