"""`cudatrace run -- CMD`: trace CMD and its children; exit with CMD's status."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import click

from ..errors import OptionError
from .options import RunSettings, option_group
from .params import OutputPath, SizeWordCommand, ledger_dir_option

if TYPE_CHECKING:
    from ..present.denials import DenialPrinter
    from ..record.run_budget import DenialCallback
    from ..record_types import DeniedGroup


class Recording(NamedTuple):
    """What a run records: every event (the default), bounded totals (--aggregate) or nothing
    (--no-trace: the budget alone), and how often the observed figures are sampled."""

    aggregate: bool = False
    no_trace: bool = False
    sample_ms: int = 100

    @property
    def mode(self) -> str:
        """The launcher's (and the shim's CUDATRACE_MODE) word for it."""
        return "none" if self.no_trace else "aggregate" if self.aggregate else "full"


# CMD starts at the first word that is not an option (or after --), and whatever follows is
# its own; an unknown option before it is a typo of ours (--simulatd, --budjet), said with
# click's "did you mean", never run as the command
RUN_CONTEXT = {"allow_interspersed_args": False}


@click.command(cls=SizeWordCommand, context_settings=RUN_CONTEXT)
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=OutputPath(),
    help="Trace directory (default: ./cudatrace-CMD-DATE-TIME, created).",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Print nothing of cudatrace's own (errors, and a note that changes the budget, excepted).",
)
@click.option("--force", is_flag=True, help="Replace a previous trace in the output directory.")
@RunSettings.options()
@click.option(
    "--aggregate",
    is_flag=True,
    help="Bounded disk use for long runs: per-site totals, the live set at each new peak and "
    "at the end, failures and denials; no per-event history (docs/aggregate.md).",
)
@click.option(
    "--no-trace",
    is_flag=True,
    help="Enforce --budget/--group (and virtualize) only; write no trace.",
)
@ledger_dir_option
@click.option(
    "--outlive-launcher",
    is_flag=True,
    help="Let CMD run on if cudatrace itself is killed (by default the kernel sends CMD "
    "SIGTERM then).",
)
@click.option(
    "--sample-ms",
    type=click.IntRange(1, 3_600_000),
    default=100,
    show_default=True,
    metavar="MS",
    help="How often the observed figures (NVML, MemAvailable, the tree's RSS) are sampled.",
)
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
@option_group("recording", Recording, [])
def run(
    out_dir: Path | None,
    quiet: bool,
    force: bool,
    settings: RunSettings,
    recording: Recording,
    outlive_launcher: bool,
    cmd: tuple[str, ...],
) -> int:
    """Run CMD with every device-memory allocation and free traced.

    The trace goes to one file per process in the output directory, written as events happen
    (a killed process leaves a readable file). When CMD ends, a summary is printed and
    cudatrace exits with CMD's status (128+N if it died of signal N); its own errors exit 125,
    and 126 or 127 when CMD cannot be executed or is not found (docs/exit-codes.md). Without a
    GPU, --simulated runs CMD on cudatrace's simulated CUDA driver.
    """
    budgeted = settings.budget is not None or settings.group is not None
    fenced = budgeted or _in_a_fence()  # an integration's fence (CUDATRACE_GROUP)
    if recording.no_trace and (recording.aggregate or not budgeted or out_dir is not None):
        raise OptionError(
            "--no-trace enforces a budget and writes nothing: it needs --budget or "
            "--group, and takes neither --aggregate nor -o"
        )
    from ..record.launcher import RunOptions
    from ..record.launcher import run as launch

    opts = RunOptions(
        on_denials=_denial_printer() if fenced else None,
        cmd=list(cmd),
        out_dir=out_dir,
        quiet=quiet,
        force=force,
        mode=recording.mode,
        outlive_launcher=outlive_launcher,
        sample_ms=recording.sample_ms,
        on_end=None if quiet else _summarize,
        **settings.as_dict(),
    )
    status, _ = launch(opts)
    return status


def _in_a_fence() -> bool:
    """Whether an integration fenced this process already (its group in the environment)."""
    from .. import settings

    return settings.value("GROUP") is not None


def _summarize(status: int, out: Path | None) -> None:
    """What `run` prints at the end, while the run still holds its trace directory (no other
    run can have replaced it); it never hides the command's status."""
    if out is None:
        click.echo(f"cudatrace: exit status {status} (--no-trace: nothing recorded)", err=True)
        return
    from ..present.summary import print_summary  # after the command has ended
    from ..record.cudadrv import driver_library

    try:
        print_summary(out, status, sys.stderr, driver=driver_library)
    except KeyboardInterrupt:  # Ctrl-C or SIGINT after CMD ended: the summary alone is cut
        sys.stderr.write(f"\ncudatrace: summary interrupted; trace in {out}\n")
    except Exception as exc:
        sys.stderr.write(f"cudatrace: could not summarize the trace: {exc}\n")


def _denial_printer() -> DenialCallback:
    """The launcher's callback after a budget denial: loads the analysis only then."""
    held: list[DenialPrinter] = []

    def call(out_dir: Path, ledger_denials: int | None = None) -> list[DeniedGroup]:
        if not held:
            from ..present.denials import DenialPrinter

            held.append(DenialPrinter())
        return held[0](out_dir, ledger_denials)

    return call
