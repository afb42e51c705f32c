"""The cudatrace command line: every command is thin (options -> one call -> exit status).

Start-up: this module imports only click. Each command imports the floor it calls inside its
function, so `cudatrace run` loads the launcher (record/) and nothing of the analysis until the
command has ended; these deferred imports are there for start-up time, not to dodge a cycle
(tests/unit/test_imports.py checks that there is none).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import __version__

# = analyze.sites.GROUPINGS, written out so that the command line loads without the analysis
# (tests/unit/test_imports.py checks that the two agree)
GROUPINGS = ("site", "api", "library", "process")


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


BUDGET_HELP = (
    "Device-memory limit for the whole process tree: a size (8GiB, 512MiB, 1.5GiB; "
    "8G means 8 GiB = 8*2^30 bytes, 8GB means 8*10^9), a share of each device's total "
    "(60%), of its free memory at start (60%free), or per device (0=8GiB,1=4GiB)."
)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Trace directory (default: ./cudatrace-CMD-DATE-TIME, created).",
)
@click.option(
    "--stack-depth",
    default=64,
    show_default=True,
    type=click.IntRange(0, 256),
    help="Native frames kept per event; 0 disables stacks.",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Print nothing of cudatrace's own (errors, and a note that changes the budget, "
    "excepted).",
)
@click.option("--force", is_flag=True, help="Replace a previous trace in the output directory.")
@click.option("--budget", metavar="SPEC", help=BUDGET_HELP)
@click.option(
    "--group",
    metavar="NAME",
    help="Share the budget with other 'cudatrace run --group NAME' of this user "
    "(co-tenants). The first run naming a --budget sets the group's; a run without one "
    "joins under it (waiting up to $CUDATRACE_GROUP_WAIT s, default 30, for it to be set); "
    "a different budget is refused while the group is in use.",
)
@click.option(
    "--on-exceed",
    type=click.Choice(["fail", "warn", "abort"]),
    default="fail",
    show_default=True,
    help="Over budget: fail the allocation with out-of-memory; warn and allow it; or "
    "abort: stop the whole process tree with a non-zero status.",
)
@click.option(
    "--count-host",
    is_flag=True,
    help="Count pinned host memory against the budget (always on integrated devices).",
)
@click.option(
    "--no-virtualize",
    is_flag=True,
    help="Do not make cuMemGetInfo/NVML report the budget as the device's memory.",
)
@click.option(
    "--outlive-launcher",
    is_flag=True,
    help="Let CMD run on if cudatrace itself is killed (by default the kernel sends CMD "
    "SIGTERM then).",
)
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    out_dir,
    stack_depth,
    quiet,
    force,
    budget,
    group,
    on_exceed,
    count_host,
    no_virtualize,
    outlive_launcher,
    cmd,
):
    """Run CMD with every device-memory allocation and free traced.

    The trace goes to one file per process in the output directory, written as events happen
    (a killed process leaves a readable file). When CMD ends, a summary is printed and
    cudatrace exits with CMD's status (128+N if it died of signal N).
    """
    from .record.launcher import LaunchError, RunOptions
    from .record.launcher import run as launch

    if budget is not None:
        from .record.budget import BudgetError, parse_budget  # only a run with a budget

        try:
            parse_budget(budget)
        except BudgetError as e:
            click.echo(f"cudatrace: --budget {budget}: {e}", err=True)
            sys.exit(2)
    opts = RunOptions(
        cmd=list(cmd),
        out_dir=out_dir,
        stack_depth=stack_depth,
        quiet=quiet,
        force=force,
        budget=budget,
        group=group,
        on_exceed=on_exceed,
        count_host=count_host,
        virtualize=not no_virtualize,
        outlive_launcher=outlive_launcher,
    )
    try:
        status, out = launch(opts)
    except LaunchError as e:
        click.echo(str(e), err=True)
        sys.exit(e.status)
    except RuntimeError as e:  # the native libraries could not be found or built
        click.echo(f"cudatrace: {e}", err=True)
        sys.exit(2)
    if not quiet:
        from .present.summary import print_summary  # after the command has ended

        try:
            print_summary(out, status, sys.stderr)
        except Exception as exc:  # the summary must never hide the command's status
            why = str(exc)
            why = why[len("cudatrace: ") :] if why.startswith("cudatrace: ") else why
            sys.stderr.write(f"cudatrace: could not summarize the trace: {why}\n")
    sys.exit(status)


@main.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--top", default=10, show_default=True, type=click.IntRange(1, None), help="Sites listed."
)
@click.option(
    "--by",
    type=click.Choice(GROUPINGS),
    default="site",
    show_default=True,
    help="Group allocations by call site, API, library or process.",
)
@click.option(
    "--at",
    "at",
    default="peak",
    show_default=True,
    metavar="peak|end|TIME",
    help="The moment: the peak, the end, or TIME seconds since the start (2.5s, 2.5).",
)
@click.option(
    "--device",
    type=int,
    default=None,
    metavar="N",
    help="Only device N (its own peak with --at peak).",
)
@click.option(
    "--depth",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Frames that make a site (a deeper site splits a shared helper by caller).",
)
@click.option(
    "--show-cuda-frames",
    is_flag=True,
    help="Keep the CUDA libraries' own frames (folded by default).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema cudatrace.report/1).")
@click.option(
    "--svg",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write a timeline picture (SVG) to FILE.",
)
def report(path, top, by, at, device, depth, show_cuda_frames, as_json, svg):
    """Who held the device memory at the peak (or another moment), by call site.

    PATH is a trace directory written by `cudatrace run`, or one .ctrace file of it.
    """
    from .present.report import run_report

    sys.exit(
        run_report(
            path,
            top=top,
            by=by,
            at=at,
            device=device,
            depth=depth,
            show_cuda_frames=show_cuda_frames,
            as_json=as_json,
            svg=svg,
        )
    )


@main.command("diff", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option(
    "--top", default=20, show_default=True, type=click.IntRange(1, None), help="Sites listed."
)
@click.option(
    "--depth",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Frames that make a site.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema cudatrace.diff/1).")
def diff(a, b, top, depth, as_json):
    """What changed between two traces A and B: sites grown, shrunk, new and gone.

    A and B are trace directories (or .ctrace files). Sites are matched by function, file and
    module names, so two runs, or two builds with symbols, compare.
    """
    from .present.diff import run_diff

    sys.exit(run_diff(a, b, top=top, depth=depth, as_json=as_json))


@main.command()
@click.argument("group", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--reset",
    is_flag=True,
    help="Remove GROUP's ledger (budget, peaks, denials) so its next run starts afresh; "
    "refused while a member is alive.",
)
def status(group, as_json, reset):
    """Budgets in force: limits, use per device and per member process, denials.

    Without GROUP: every budget ledger of this user (named groups and running `cudatrace run
    --budget` trees). Reads the ledgers through the same C code the preload library uses.
    """
    from .present.status import render_status
    from .record.ledger import LedgerError, reset_group, status_json

    if reset:
        if not group:
            click.echo("cudatrace: status --reset needs a GROUP", err=True)
            sys.exit(2)
        try:
            click.echo(f"cudatrace: removed {reset_group(group)}")
        except LedgerError as e:
            click.echo(f"cudatrace: {e}", err=True)
            sys.exit(2)
        return
    try:
        st = status_json(group)
    except LedgerError as e:  # the same prefix and status as every other command's errors
        click.echo(f"cudatrace: {e}", err=True)
        sys.exit(2)
    click.echo(json.dumps(st, indent=2) if as_json else render_status(st))


@main.command("demo")
@click.option(
    "--simulated",
    "mode",
    flag_value="simulated",
    help="Run on the simulated CUDA driver even if there is a GPU.",
)
@click.option("--gpu", "mode", flag_value="gpu", help="Run on the GPU (an error if there is none).")
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Folder for the build and the traces (kept). Default: a temporary folder, "
    "removed at the end unless --keep.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary folder with the traces.")
def demo(mode, out_dir, keep):
    """Replay the KV-pool sizing defect cudatrace was built for: trace, report, diff, budget.

    Builds the example server (examples/kv-pool) and traces it with --kv-cache-memory 1GiB
    (28 layers x 1 GiB), --num-blocks 64 and the 256-block fallback; reports the first run,
    diffs it against the second, and stops the oversized pool with --budget 12GiB. Without a
    GPU it runs on the test suite's simulated driver (a 122 GiB Jetson-like device), and every
    line says [simulated].
    """
    from .demo import run_demo

    sys.exit(run_demo(mode, out_dir, keep))


if __name__ == "__main__":
    main()
