"""`cudatrace slurm-prolog`, `slurm-epilog` and `slurm-taskprolog`: a Slurm job's share of its
GPU's memory as a budget, sealed where the job cannot write it (docs/slurm.md)."""

from __future__ import annotations

import click

from .. import choices, settings
from ..errors import OptionError
from .options import on_exceed_option


@click.command("slurm-prolog")
@click.option(
    "--ledger-dir",
    metavar="DIR",
    default="/run/cudatrace/slurm",
    show_default=True,
    help="The node's shared ledger directory for the GPUs' groups (made root's, mode 1777, "
    "when missing; docs/slurm.md).",
)
@click.option(
    "--shards-per-gpu", type=int, required=True, metavar="N", help="Shards gres.conf gives a GPU."
)
@click.option(
    "--gpu-memory",
    metavar="SIZE",
    help="A GPU's memory, shared by its shards (default: NVML's figure for the GPU).",
)
@on_exceed_option(
    "Over the job's share: fail the allocation with out-of-memory; warn and allow it; or "
    "abort: end the process that was denied."
)
@click.option(
    "--on-fence-error",
    type=click.Choice(choices.ON_FENCE_ERROR),
    default=settings.default_text("ON_FENCE_ERROR"),
    show_default=True,
    help="When a job that shares a GPU cannot be fenced (NVML unreadable, shards of several "
    "GPUs): refuse its CUDA, or warn and run it unfenced; a line says why either way "
    "(docs/budgets.md).",
)
def slurm_prolog(
    ledger_dir: str,
    shards_per_gpu: int,
    gpu_memory: str | None,
    on_exceed: str,
    on_fence_error: str,
) -> int:
    """Slurm's Prolog (root): write the job's fence record, its share of its GPU's memory,
    where the job cannot write it (/run/cudatrace/jobs/<job id>; docs/slurm.md). Never fails
    the job: what keeps it from a budget is written in the record, which refuses its CUDA."""
    import os
    import sys

    from ..deploy.slurm import prolog
    from ..record.budget import BudgetError, parse_size

    try:
        mem = parse_size(gpu_memory) if gpu_memory else None
    except BudgetError as e:
        raise OptionError(f"--gpu-memory: {e}") from None
    for note in prolog(dict(os.environ), ledger_dir, shards_per_gpu, mem, on_exceed,
                       on_fence_error):  # fmt: skip
        sys.stderr.write(f"cudatrace: {note}\n")
    return 0


@click.command("slurm-epilog")
def slurm_epilog() -> int:
    """Slurm's Epilog (root): remove the job's fence record (docs/slurm.md)."""
    import os
    import sys

    from ..deploy.slurm import epilog

    for note in epilog(dict(os.environ)):
        sys.stderr.write(f"cudatrace: {note}\n")
    return 0


@click.command("slurm-taskprolog")
def slurm_taskprolog() -> int:
    """Slurm's TaskProlog (the job's user): print the environment that loads the preload
    library into the task (`export NAME=value` lines); the library fences the task with the
    record the Prolog wrote (docs/slurm.md)."""
    import os

    from ..deploy.slurm import taskprolog
    from ..native import shim_path

    click.echo("\n".join(taskprolog(dict(os.environ), str(shim_path()))))
    return 0
