"""The option groups of `cudatrace sweep` (commands/sweep.py): when each run is stopped, what
the laws are held to and asked, where the sweep is."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from .options import option_group
from .params import Duration, F, OutputPath

if TYPE_CHECKING:
    from ..sweep.stop import StopRule


def _stop_rule(
    stop_after: float | None,
    until_url: str | None,
    settle: float,
    grace: float,
    url_timeout: float,
) -> StopRule:
    from ..sweep.stop import StopRule

    return StopRule(stop_after, until_url, settle, grace, url_timeout)


def stop_options() -> Callable[[F], F]:
    """When each run of a sweep is stopped (a server never ends by itself): --stop-after, or
    --until-url and --settle; --grace and --url-timeout bound the stopping. The command gets
    them as one sweep.stop.StopRule (imported when the command runs) under `stop`."""
    timing: dict[str, Any] = {"type": Duration(), "metavar": "TIME", "show_default": True}
    return option_group(
        "stop",
        _stop_rule,
        [
            click.option(
                "--stop-after",
                type=Duration(),
                metavar="TIME",
                help="Stop each run after TIME (30s, 2m), as for a server that never ends "
                "(default: each run ends by itself).",
            ),
            click.option(
                "--until-url",
                metavar="URL",
                help="Stop each run once URL answers and the traced live memory has settled "
                "(a server that is ready).",
            ),
            click.option(
                "--settle",
                default="2s",
                help="With --until-url: no change of live memory for this long.",
                **timing,
            ),
            click.option(
                "--grace",
                default="10s",
                help="Between SIGINT, SIGTERM and SIGKILL when stopping a run.",
                **timing,
            ),
            click.option(
                "--url-timeout",
                default="300s",
                help="With --until-url: give up on a run whose URL never answers.",
                **timing,
            ),
        ],
    )


class Fit(NamedTuple):
    """What the laws are held to and asked: --expect, --predict, --top."""

    expect: str | None = None
    predict: str | None = None
    top: int = 10

    @classmethod
    def options(cls) -> Callable[[F], F]:
        return option_group(
            "fit",
            cls,
            [
                click.option(
                    "--expect",
                    metavar="SLOPE",
                    help="How many bytes each site should grow per unit of the knob (1 for a "
                    "flag that is a size); the sites that grow faster are flagged.",
                ),
                click.option(
                    "--predict",
                    metavar="V",
                    help="Predict the peak and the top sites at the value V (a=4,b=8 on a grid), "
                    "with the budget to give a run there.",
                ),
                click.option(
                    "--top",
                    default=10,
                    show_default=True,
                    type=click.IntRange(1, None),
                    help="Sites whose laws are listed.",
                ),
            ],
        )


class Where(NamedTuple):
    """Where the sweep is: -o DIR (--force to replace an earlier one), or --from a recorded one."""

    out_dir: Path | None = None
    force: bool = False
    from_dir: Path | None = None

    @classmethod
    def options(cls) -> Callable[[F], F]:
        return option_group(
            "where",
            cls,
            [
                click.option(
                    "-o",
                    "--output",
                    "out_dir",
                    type=OutputPath(),
                    help="Directory of the sweep: sweep.json and one trace directory per run "
                    "(default: ./cudatrace-sweep-CMD-DATE-TIME, created).",
                ),
                click.option(
                    "--force", is_flag=True, help="Replace an earlier sweep in the directory."
                ),
                click.option(
                    "--from",
                    "from_dir",
                    type=click.Path(path_type=Path),
                    metavar="DIR",
                    help="Fit a recorded sweep again (other --expect, --predict, --depth); run "
                    "nothing.",
                ),
            ],
        )
