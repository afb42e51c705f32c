"""`cudatrace slurm-taskprolog`: Slurm's TaskProlog, printing the environment that gives a job
its share of its GPU's memory as a budget (docs/slurm.md)."""

from __future__ import annotations

import click

from ..errors import OptionError


@click.command("slurm-taskprolog")
@click.option(
    "--ledger-dir",
    metavar="DIR",
    default="/run/cudatrace",
    show_default=True,
    help="The node's shared ledger directory (root's, mode 1777; docs/slurm.md).",
)
@click.option(
    "--shards-per-gpu", type=int, required=True, metavar="N", help="Shards gres.conf gives a GPU."
)
@click.option(
    "--gpu-memory",
    metavar="SIZE",
    help="A GPU's memory, shared by its shards (default: NVML's figure for the GPU).",
)
@click.option(
    "--on-exceed",
    type=click.Choice(["fail", "warn", "abort"]),
    default="fail",
    show_default=True,
    help="Over the job's share: fail the allocation with out-of-memory; warn and allow it; or "
    "abort: end the process that was denied.",
)
def slurm_taskprolog(ledger_dir, shards_per_gpu, gpu_memory, on_exceed):
    """Slurm's TaskProlog: print the environment that gives this task's job its share of the
    GPU's memory (`export NAME=value` lines; docs/slurm.md)."""
    import os

    from ..native import shim_path
    from ..record.slurm import taskprolog
    from ..units import UnitError, parse_size

    try:
        mem = parse_size(gpu_memory) if gpu_memory else None
    except UnitError as e:
        raise OptionError(f"--gpu-memory: {e}") from None
    lines = taskprolog(
        dict(os.environ), str(shim_path()), ledger_dir, shards_per_gpu, mem, on_exceed
    )
    click.echo("\n".join(lines))
    return 0
