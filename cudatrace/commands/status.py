"""`cudatrace status [GROUP]`: budgets in force, use per device and member, denials."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

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
@click.option(
    "--node",
    "node_state",
    is_flag=False,
    flag_value="/run/cudatrace",
    default=None,
    metavar="[STATE]",
    help="What the node agent saw at its last pass (every container's ledgers, the watch), "
    "from its --state directory (default /run/cudatrace).",
)
def status(
    group: str | None, outputs: Outputs, watch: bool, reset: bool, node_state: str | None
) -> int:
    """Budgets in force: limits, use per device and per member process, denials.

    Without GROUP: every budget ledger of this user (named groups and running `cudatrace run
    --budget` trees), and the processes using a GPU that no ledger fences (NVML's list).
    Reads the ledgers through the same C code the preload library uses.
    """
    if node_state is not None:
        if group or reset:
            raise OptionError("status --node shows the whole node: leave out GROUP and --reset")
        return _node(Path(node_state), outputs.as_json, watch)
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


def node_text(state: Path) -> str:
    """The text of `status --node`: the agent's last pass, with its age."""
    from ..present.status import render_status

    st, age = _node_status(state)
    when = time.strftime("%H:%M:%S", time.localtime(time.time() - age))
    return f"the node agent's last pass, at {when} ({age:.0f} s ago):\n\n{render_status(st)}"


def _node_status(state: Path) -> tuple[Any, float]:
    from ..deploy.agent import STATUS_FILE

    path = state / STATUS_FILE
    try:
        text, age = path.read_text(), time.time() - path.stat().st_mtime
        return json.loads(text), max(0.0, age)
    except FileNotFoundError:
        raise CudatraceError(
            f"no view of the node agent in {state} (is `cudatrace node --state {state}` running?)"
        ) from None
    except (OSError, ValueError) as e:
        raise CudatraceError(f"cannot read {path}: {e}") from None


def _node(state: Path, as_json: bool, watch: bool) -> int:
    if watch:
        from ..present.watch import loop

        def text() -> str:
            try:
                return node_text(state)
            except CudatraceError as e:
                return f"cudatrace: {e}\n"

        loop(text, lambda done, why: "cudatrace status --node --watch", interval=1.0)
        return 0
    if as_json:
        click.echo(json.dumps(_node_status(state)[0], indent=2))
    else:
        click.echo(node_text(state))
    return 0
