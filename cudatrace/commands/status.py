"""`cudatrace status [GROUP]`: budgets in force, use per device and member, denials."""

from __future__ import annotations

import json
import time
from typing import TextIO

import click

from ..errors import CudatraceError, OptionError
from .options import Outputs
from .params import ledger_dir_option


@click.command()
@click.argument("group", required=False)
@Outputs.options("")
@click.option("--watch", is_flag=True, help="Re-render every second until Ctrl-C.")
@ledger_dir_option
@click.option(
    "--reset",
    is_flag=True,
    help="Remove GROUP's ledger (budget, peaks, denials) so its next run starts afresh; "
    "refused while a member is alive.",
)
def status(group: str | None, outputs: Outputs, watch: bool, reset: bool) -> int:
    """Budgets in force: limits, use per device and per member process, denials.

    Without GROUP: every budget ledger of this user (named groups and running `cudatrace run
    --budget` trees), and the processes using a GPU that no ledger fences (NVML's list).
    Reads the ledgers through the same C code the preload library uses.
    """
    if reset:
        if not group:
            raise OptionError("status --reset needs a GROUP")
        from ..record.ledger_status import reset_group

        click.echo(f"cudatrace: removed {reset_group(group)}")
        return 0
    if watch:
        if outputs.as_json:
            raise click.UsageError("--watch shows text; leave out --json")
        watch_status(group)
        return 0
    from ..present.status import render_status
    from ..record.denials import attach_last_denials
    from ..record.fence import status_with_unfenced

    st = status_with_unfenced(group)
    attach_last_denials(st)
    click.echo(json.dumps(st, indent=2) if outputs.as_json else render_status(st))
    return 0


def status_text(group: str | None) -> str:
    """The text of `status` now, or the error that stands in its place."""
    from ..present.status import render_status
    from ..record.fence import status_with_unfenced

    try:
        return render_status(status_with_unfenced(group))
    except CudatraceError as e:
        return f"cudatrace: {e}\n"


def watch_status(group: str | None = None, interval: float = 1.0, out: TextIO | None = None) -> int:
    """The body of `cudatrace status --watch`: the status every `interval` seconds until
    Ctrl-C (present/watch.py); returns the number of renders."""
    from ..present.watch import loop

    def head(done: bool, why: str) -> str:
        return "cudatrace status --watch{}  {}  (every {:g} s; Ctrl-C stops)".format(
            " " + group if group else "",
            time.strftime("%H:%M:%S"),
            interval,
        )

    return loop(lambda: status_text(group), head, interval=interval, out=out)
