"""The option groups of the commands that set up a node for containers (`cdi`, `node`,
`dra-plugin`, `manifests systemd`): the budgets a node offers and where their pieces live
(`NodeSetup`); how the node's pieces reach the Kubernetes API server (`KubeAccess`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import click

from .. import settings
from .options import choice_option, on_exceed_option, option_group
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
    def options(
        cls, cdi_dir_default: str | None = "/etc/cdi", offers: bool = True
    ) -> Callable[[F], F]:
        """The options; offers False leaves out --budget and --groups (the DRA plugin's
        budgets are its claims')."""
        return option_group(
            "setup",
            cls,
            (_offers() if offers else []) + _places(cdi_dir_default) + _library(),
        )


def _offers() -> list[Callable[[F], F]]:
    """What the node offers containers: budgets of a size, named groups."""
    return [
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
    ]


def _places(cdi_dir_default: str | None) -> list[Callable[[F], F]]:
    """Where the node's pieces live: the library, the ledgers' directories, the CDI specs."""
    places = (
        ("--root", "/var/lib/cudatrace", "Where the preload library is installed (versioned)."),
        (
            "--state",
            "/run/cudatrace",
            "Where groups' and DRA claims' ledger directories live (a tmpfs: made at boot).",
        ),
        (
            "--cdi-dir",
            cdi_dir_default,
            "Where CDI specs are written (/etc/cdi or /var/run/cdi: where runtimes read them).",
        ),
    )
    path = click.Path(path_type=Path)
    return [
        click.option(flag, metavar="DIR", type=path, default=default, show_default=True, help=text)
        for flag, default, text in places
    ]


def _library() -> list[Callable[[F], F]]:
    """How containers get the library and what it does: the CDI vendor, the way it is
    loaded, over budget, which build."""
    return [
        click.option(
            "--vendor",
            default="cudatrace.dev",
            show_default=True,
            help="The CDI vendor: devices are VENDOR/budget=SIZE, VENDOR/group=NAME (and "
            "VENDOR/claim=UID-gpu-N for DRA claims).",
        ),
        choice_option(
            "--preload",
            ["file", "env"],
            "How containers load the library: file, through /etc/ld.so.preload "
            "(an application's own LD_PRELOAD stays); env, through LD_PRELOAD (for "
            "sandboxes that do not read /etc/ld.so.preload; replaces the "
            "application's).",
        ),
        on_exceed_option(
            "Over budget (groups may set their own): fail the allocation, warn, or abort the "
            "process."
        ),
        click.option(
            "--shim",
            metavar="FILE",
            type=click.Path(dir_okay=False, exists=True, path_type=Path),
            help="Install this build of the preload library instead of the "
            "package's (e.g. one with other CFLAGS: tools/cross-build-shim); refused if "
            "it needs a glibc newer than the package's floor (2.17).",
        ),
    ]


class KubeAccess(NamedTuple):
    """How `node` and `dra-plugin` reach the Kubernetes API server: the pod's service account
    (auto, when there is one), or a URL with a token (and CA) given here."""

    kubernetes: str = "auto"
    kube_api: str | None = None
    kube_token: Path | None = None
    kube_ca: Path | None = None

    @classmethod
    def options(cls, what: str) -> Callable[[F], F]:
        """what: what the command does with the API server (the --kubernetes help)."""
        file = click.Path(dir_okay=False, path_type=Path)
        return option_group(
            "access",
            cls,
            [
                choice_option(
                    "--kubernetes",
                    ["auto", "on", "off"],
                    f"{what}: auto when run in a pod with a service account.",
                ),
                click.option(
                    "--kube-api", metavar="URL", help="The API server (default: the pod's)."
                ),
                click.option(
                    "--kube-token",
                    metavar="FILE",
                    type=file,
                    help="Its bearer token's file (default: the service account's).",
                ),
                click.option(
                    "--kube-ca",
                    metavar="FILE",
                    type=file,
                    help="The CA of its certificate (default: the service account's).",
                ),
            ],
        )

    def resolve(self) -> Any:
        """The API server (a deploy.kube.Kube), or None where there is none to use."""
        from ..deploy.kube import Kube
        from ..errors import OptionError

        if self.kube_api and not self.kube_token:
            raise OptionError("--kube-api needs --kube-token")
        if self.kube_api:
            return Kube(self.kube_api, self.kube_token or Path("/dev/null"), self.kube_ca)
        if self.kubernetes == "off":
            return None
        kube = Kube.in_cluster()
        if kube is None and self.kubernetes == "on":
            raise OptionError(
                "--kubernetes on: not in a pod with a service account; give --kube-api"
            )
        return kube
