"""`cudatrace slurm-taskprolog`: Slurm's TaskProlog, printing the environment that gives a job
its share of its GPU's memory as a budget (docs/slurm.md)."""

from __future__ import annotations

import click

from .. import choices, settings
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
    type=click.Choice(choices.ON_EXCEED),
    default=settings.default_text("ON_EXCEED"),
    show_default=True,
    help="Over the job's share: fail the allocation with out-of-memory; warn and allow it; or "
    "abort: end the process that was denied.",
)
@click.option(
    "--on-fence-error",
    type=click.Choice(choices.ON_FENCE_ERROR),
    default=settings.default_text("ON_FENCE_ERROR"),
    show_default=True,
    help="When a task that shares a GPU cannot be fenced (no ledger directory, a malformed "
    "setting): refuse its CUDA, or warn and run it unfenced; a line says why either way "
    "(docs/budgets.md).",
)
def slurm_taskprolog(
    ledger_dir: str,
    shards_per_gpu: int,
    gpu_memory: str | None,
    on_exceed: str,
    on_fence_error: str,
) -> int:
    """Slurm's TaskProlog: print the environment that gives this task's job its share of the
    GPU's memory (`export NAME=value` lines; docs/slurm.md)."""
    import os

    from ..native import shim_path
    from ..record.budget import BudgetError, parse_size
    from ..record.slurm import taskprolog

    try:
        mem = parse_size(gpu_memory) if gpu_memory else None
    except BudgetError as e:
        raise OptionError(f"--gpu-memory: {e}") from None
    lines = taskprolog(
        dict(os.environ),
        str(shim_path()),
        ledger_dir,
        shards_per_gpu,
        mem,
        on_exceed,
        on_fence_error,
    )
    click.echo("\n".join(lines))
    return 0
