"""`cudatrace doctor [CMD]`: what a run would see on this machine."""

from __future__ import annotations

import json

import click

from .options import Outputs
from .params import ledger_dir_option


@click.command(context_settings={"allow_interspersed_args": False})
@Outputs.options("")
@ledger_dir_option
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def doctor(outputs: Outputs, cmd: tuple[str, ...]) -> int:
    """What a run would see here: CUDA driver and NVML, integrated or discrete devices, the
    ledger directory, the container / PID namespace, and whether CMD can be entered."""
    from ..present.doctor import render_doctor
    from ..record.doctor import diagnose

    r = diagnose(list(cmd) or None)
    click.echo(json.dumps(r, indent=2) if outputs.as_json else render_doctor(r))
    command = r["command"]
    return 0 if command is None or command["ok"] else 1
