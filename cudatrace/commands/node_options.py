"""The option group of the commands that set up a node for containers (`cdi`, `node`,
`manifests systemd`): the budgets a node offers and where their pieces live."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import click

from .. import choices, settings
from .options import option_group
from .params import F


class NodeSetup(NamedTuple):
    """The budgets a node offers containers and where their pieces live: `cdi` and `node`
    (docs/containers.md). The defaults are deploy/plan.py's, written out so that the command
    line loads without it."""

    budgets: tuple[str, ...] = ()
    groups: Path | None = None
    root: Path = Path("/var/lib/cudatrace")
    state: Path = Path("/run/cudatrace")
    cdi_dir: Path | None = Path("/etc/cdi")
    vendor: str = "cudatrace.dev"
    preload: str = "file"
    on_exceed: str = settings.default_text("ON_EXCEED")
    shim: Path | None = None

    @classmethod
    def options(cls, cdi_dir_default: str | None = "/etc/cdi") -> Callable[[F], F]:
        path = click.Path(path_type=Path)
        return option_group(
            "setup",
            cls,
            [
                click.option(
                    "--budget",
                    "budgets",
                    metavar="SIZE",
                    multiple=True,
                    help="Offer the device <vendor>/budget=SIZE: each container given it has "
                    "its own budget of SIZE (8GiB). Repeatable.",
                ),
                click.option(
                    "--groups",
                    metavar="FILE",
                    type=click.Path(dir_okay=False, path_type=Path),
                    help="Offer the named groups of FILE as <vendor>/group=NAME: the containers "
                    "given a group share its budget (INI: [NAME] budget = 40GiB).",
                ),
                click.option(
                    "--root",
                    metavar="DIR",
                    type=path,
                    default="/var/lib/cudatrace",
                    show_default=True,
                    help="Where the preload library is installed (versioned).",
                ),
                click.option(
                    "--state",
                    metavar="DIR",
                    type=path,
                    default="/run/cudatrace",
                    show_default=True,
                    help="Where named groups' ledger directories live (a tmpfs: made at boot).",
                ),
                click.option(
                    "--cdi-dir",
                    metavar="DIR",
                    type=path,
                    default=cdi_dir_default,
                    show_default=True,
                    help="Where CDI specs are written (/etc/cdi or /var/run/cdi: where runtimes "
                    "read them).",
                ),
                click.option(
                    "--vendor",
                    default="cudatrace.dev",
                    show_default=True,
                    help="The CDI vendor: devices are VENDOR/budget=SIZE and VENDOR/group=NAME.",
                ),
                click.option(
                    "--preload",
                    type=click.Choice(["file", "env"]),
                    default="file",
                    show_default=True,
                    help="How containers load the library: file, through /etc/ld.so.preload "
                    "(an application's own LD_PRELOAD stays); env, through LD_PRELOAD (for "
                    "sandboxes that do not read /etc/ld.so.preload; replaces the "
                    "application's).",
                ),
                click.option(
                    "--on-exceed",
                    type=click.Choice(choices.ON_EXCEED),
                    default=settings.default_text("ON_EXCEED"),
                    show_default=True,
                    help="Over budget (groups may set their own): fail the allocation, warn, "
                    "or abort the process.",
                ),
                click.option(
                    "--shim",
                    metavar="FILE",
                    type=click.Path(dir_okay=False, exists=True, path_type=Path),
                    help="Install this build of the preload library (e.g. one built for an "
                    "older glibc: tools/cross-build-shim) instead of the package's.",
                ),
            ],
        )
