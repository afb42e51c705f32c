"""`cudatrace top`: a live view of the GPU box (docs/budgets.md, "A live view of the box")."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import OptionError
from .options import choice_option, seconds_option, traces_option
from .params import ledger_dir_option

if TYPE_CHECKING:
    from ..present.top import View
    from ..record.top import Gatherer
    from ..record_types import TopSnapshot


@click.command()
@click.option("--once", is_flag=True, help="Print one view as text and exit (for scripts).")
@click.option("--json", "as_json", is_flag=True, help="With --once: the snapshot as JSON.")
@seconds_option("--interval", 1.0, "How often the view is read again.", 0.1)
@traces_option(
    "Also show the runs being traced in DIR (a trace directory, or a folder of them); "
    "repeatable. The runs of the processes on the GPUs and of the ledgers are found alone."
)
@click.option(
    "--sites", default=5, show_default=True, type=click.IntRange(1, 50), help="Sites per run."
)
@choice_option(
    "--sort",
    ["memory", "counted", "pid", "command"],
    "The processes' order at start (keys m, l, p, n change it).",
)
@click.option("--device", type=click.IntRange(0), help="Show one GPU (NVML index) at start.")
@click.option("--group", help="Show one budget group at start.")
@ledger_dir_option
def top(
    once: bool,
    as_json: bool,
    interval: float,
    traces: tuple[Path, ...],
    sites: int,
    sort: str,
    device: int | None,
    group: str | None,
) -> int:
    """A live view of the GPU box: every process on each GPU with NVML's memory, the budget
    groups (limit, in use, members, unfenced processes), the top call sites of the runs being
    traced, the latest denials with the code that asked; refreshed every second.

    Keys: m, l, p, n sort the processes (NVML's memory, the ledger's count, pid, name); r
    reverses; d and D (or the arrows) step through the GPUs, g and G through the groups; q
    quits. --once prints the same view once as text (--json: the snapshot's data).
    """
    from ..present.top import View

    if as_json and not once:
        raise OptionError("--json prints one snapshot: give --once with it")
    if not once and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise OptionError("top draws on a terminal; for a pipe or a script, use --once")
    view = View(sort=sort, device=device, group=group)
    gatherer = _gatherer(traces, sites)
    try:
        if once:
            _once(gatherer.snapshot, view, as_json)
        else:
            from ..present.top_screen import run_screen

            run_screen(gatherer.snapshot, view, interval)
    finally:
        gatherer.close()
    return 0


def _gatherer(traces: tuple[Path, ...], sites: int) -> Gatherer:
    from ..analyze.documents.live import Runs
    from ..analyze.sites.stacks import make_symbolizer
    from ..record.top import Gatherer

    runs = Runs(sites, make_symbolizer(progress=False))
    return Gatherer(runs.among, traces)


def _once(snapshot: Callable[[], TopSnapshot], view: View, as_json: bool) -> None:
    from ..analyze.sites.names import on_terminal
    from ..present.text import term_width
    from ..present.top import render

    snap = snapshot()
    if as_json:
        click.echo(json.dumps(snap, indent=2))
        return
    width = term_width() if on_terminal() else None
    click.echo("\n".join(render(snap, view, width)))
