"""The cudatrace command line."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cudatrace")
def main():
    """See, explain and bound GPU memory in programs you did not write.

    \b
    cudatrace run -- CMD ...      trace every device allocation of CMD and its children
    cudatrace report DIR          who held the memory at the peak, by call site
    cudatrace diff A B            what changed between two runs
    cudatrace status [GROUP]      budgets in force and who uses them
    cudatrace demo                the KV-pool sizing defect, traced, diffed and stopped
    """


BUDGET_HELP = ("Device-memory limit for the whole process tree: a size (8GiB, 512MiB, 1.5GiB; "
               "8G means 8 GiB = 8*2^30 bytes, 8GB means 8*10^9), a share of each device's total "
               "(60%), of its free memory at start (60%free), or per device (0=8GiB,1=4GiB).")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", "out_dir", type=click.Path(path_type=Path),
              help="Trace directory (default: ./cudatrace-CMD-DATE-TIME, created).")
@click.option("--stack-depth", default=64, show_default=True, type=click.IntRange(0, 256),
              help="Native frames kept per event; 0 disables stacks.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing of cudatrace's own.")
@click.option("--force", is_flag=True, help="Replace a previous trace in the output directory.")
@click.option("--budget", metavar="SPEC", help=BUDGET_HELP)
@click.option("--group", metavar="NAME",
              help="Share the budget with other 'cudatrace run --group NAME' of this user "
                   "(co-tenants). The first run of a group sets its budget.")
@click.option("--on-exceed", type=click.Choice(["fail", "warn", "abort"]), default="fail",
              show_default=True,
              help="Over budget: fail the allocation with out-of-memory; warn and allow it; or "
                   "abort: stop the whole process tree with a non-zero status.")
@click.option("--count-host", is_flag=True,
              help="Count pinned host memory against the budget (always on integrated devices).")
@click.option("--no-virtualize", is_flag=True,
              help="Do not make cuMemGetInfo/NVML report the budget as the device's memory.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(out_dir, stack_depth, quiet, force, budget, group, on_exceed, count_host, no_virtualize, cmd):
    """Run CMD with every device-memory allocation and free traced.

    The trace goes to one file per process in the output directory, written as events happen
    (a killed process leaves a readable file). When CMD ends, a summary is printed and
    cudatrace exits with CMD's status (128+N if it died of signal N).
    """
    from .launcher import LaunchError, RunOptions
    from .launcher import run as do_run
    if budget is not None:
        from .budget import BudgetError, parse_budget
        try:
            parse_budget(budget)
        except BudgetError as e:
            click.echo("cudatrace: --budget %s: %s" % (budget, e), err=True)
            sys.exit(2)
    opts = RunOptions(cmd=list(cmd), out_dir=out_dir, stack_depth=stack_depth, quiet=quiet,
                      force=force, budget=budget, group=group, on_exceed=on_exceed,
                      count_host=count_host, virtualize=not no_virtualize)
    try:
        status = do_run(opts)
    except LaunchError as e:
        click.echo(str(e), err=True)
        sys.exit(e.status)
    except RuntimeError as e:          # the native libraries could not be found or built
        click.echo("cudatrace: %s" % e, err=True)
        sys.exit(2)
    sys.exit(status)



@main.command()
@click.argument("group", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Re-render every second until Ctrl-C.")
def status(group, as_json, watch):
    """Budgets in force: limits, use per device and per member process, denials.

    Without GROUP: every budget ledger of this user (named groups and running `cudatrace run
    --budget` trees). Reads the ledgers through the same C code the preload library uses.
    """
    import json as _json

    from .ledger import LedgerError, status_json, status_text
    if watch:
        if as_json:
            raise click.UsageError("--watch shows text; leave out --json")
        from .present.watch import watch_status
        sys.exit(watch_status(group))
    try:
        if as_json:
            click.echo(_json.dumps(status_json(group), indent=2))
        else:
            click.echo(status_text(group))
    except LedgerError as e:
        raise click.ClickException(str(e))


from .demo import demo_command  # noqa: E402
from .diff import diff_command  # noqa: E402
from .report import report_command  # noqa: E402

main.add_command(report_command, "report")
main.add_command(diff_command, "diff")
main.add_command(demo_command, "demo")

if __name__ == "__main__":
    main()
