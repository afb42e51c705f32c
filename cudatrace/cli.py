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
GROUPINGS = ("site", "api", "library", "process", "rank")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cudatrace")
def main():
    """See, explain and bound GPU memory in programs you did not write.

    \b
    cudatrace run -- CMD ...      trace every device allocation of CMD and its children
    cudatrace report DIR          who held the memory at the peak, by call site
    cudatrace diff A B            what changed between two runs
    cudatrace export DIR ...      the trace as pprof, flame graph, speedscope, memory_viz, Perfetto
    cudatrace sweep --values ...  how each site grows with a flag: laws, predictions
    cudatrace status [GROUP]      budgets in force and who uses them
    cudatrace doctor [CMD]        what a run would see on this machine
    cudatrace demo                the KV-pool sizing defect, traced, diffed and stopped
    """


FOLD_HELP = (
    "Fold functions matching REGEX (full or short name, or module) into the allocator layers, "
    "besides those recognized from the call graph. Repeatable."
)
NO_FOLD_HELP = "Do not fold allocator layers: the site is the innermost frame outside CUDA."
FULL_NAMES_HELP = "Show whole demangled signatures instead of shortened names."

BUDGET_HELP = (
    "Device-memory limit for the whole process tree: a size (8GiB, 512MiB, 1.5GiB; "
    "8G means 8 GiB = 8*2^30 bytes, 8GB means 8*10^9), a share of each device's total "
    "(60%), of its free memory at start (60%free), or per device (0=8GiB,1=4GiB)."
)


def _budget_options(f):
    """The options of a traced run about stacks and budgets: `run` and `sweep` share them."""
    opts = [
        click.option(
            "--stack-depth",
            default=64,
            show_default=True,
            type=click.IntRange(0, 256),
            help="Native frames kept per event; 0 disables stacks.",
        ),
        click.option("--budget", metavar="SPEC", help=BUDGET_HELP),
        click.option(
            "--group",
            metavar="NAME",
            help="Share the budget with other 'cudatrace run --group NAME' of this user "
            "(co-tenants). The first run naming a --budget sets the group's; a run without one "
            "joins under it (waiting up to $CUDATRACE_GROUP_WAIT s, default 30, for it to be "
            "set); a different budget is refused while the group is in use.",
        ),
        click.option(
            "--on-exceed",
            type=click.Choice(["fail", "warn", "abort"]),
            default="fail",
            show_default=True,
            help="Over budget: fail the allocation with out-of-memory; warn and allow it; or "
            "abort: stop the whole process tree with a non-zero status.",
        ),
        click.option(
            "--count-host",
            is_flag=True,
            help="Count pinned host memory against the budget (always on integrated devices).",
        ),
        click.option(
            "--no-virtualize",
            is_flag=True,
            help="Do not make cuMemGetInfo/NVML report the budget as the device's memory.",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _check_budget(budget) -> None:
    """A budget SPEC that does not parse: exit 2 before anything runs."""
    if budget is None:
        return
    from .record.budget import BudgetError, parse_budget  # only a run with a budget

    try:
        parse_budget(budget)
    except BudgetError as e:
        click.echo(f"cudatrace: --budget {budget}: {e}", err=True)
        sys.exit(2)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Trace directory (default: ./cudatrace-CMD-DATE-TIME, created).",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Print nothing of cudatrace's own (errors, and a note that changes the budget, excepted).",
)
@click.option("--force", is_flag=True, help="Replace a previous trace in the output directory.")
@_budget_options
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
@click.option(
    "--ledger-dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where budget ledgers live (default $CUDATRACE_LEDGER_DIR, else /dev/shm/cudatrace-UID): "
    "a directory containers share by a bind mount to share a --group (docs/budgets.md).",
)
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
    aggregate,
    no_trace,
    ledger_dir,
    outlive_launcher,
    sample_ms,
    cmd,
):
    """Run CMD with every device-memory allocation and free traced.

    The trace goes to one file per process in the output directory, written as events happen
    (a killed process leaves a readable file). When CMD ends, a summary is printed and
    cudatrace exits with CMD's status (128+N if it died of signal N).
    """
    from .record.launcher import LaunchError, RunOptions
    from .record.launcher import run as launch

    _use_ledger_dir(ledger_dir)

    if no_trace and (aggregate or budget is None and group is None or out_dir is not None):
        click.echo(
            "cudatrace: --no-trace enforces a budget and writes nothing: it needs --budget or "
            "--group, and takes neither --aggregate nor -o",
            err=True,
        )
        sys.exit(2)
    _check_budget(budget)
    on_denials = _denial_printer() if budget is not None or group is not None else None
    opts = RunOptions(
        on_denials=on_denials,
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
        mode="none" if no_trace else "aggregate" if aggregate else "full",
        outlive_launcher=outlive_launcher,
        sample_ms=sample_ms,
    )
    try:
        status, out = launch(opts)
    except LaunchError as e:
        click.echo(str(e), err=True)
        sys.exit(e.status)
    except RuntimeError as e:  # the native libraries could not be found or built
        click.echo(f"cudatrace: {e}", err=True)
        sys.exit(2)
    if not quiet and out is None:
        click.echo(f"cudatrace: exit status {status} (--no-trace: nothing recorded)", err=True)
    elif not quiet:
        from .present.summary import print_summary  # after the command has ended

        try:
            print_summary(out, status, sys.stderr)
        except Exception as exc:  # the summary must never hide the command's status
            why = str(exc)
            why = why[len("cudatrace: ") :] if why.startswith("cudatrace: ") else why
            sys.stderr.write(f"cudatrace: could not summarize the trace: {why}\n")
    sys.exit(status)


def _denial_printer():
    """The launcher's callback after a budget denial: loads the analysis only then."""
    held = []

    def call(out_dir):
        if not held:
            from .present.denials import DenialPrinter

            held.append(DenialPrinter())
        return held[0](out_dir)

    return call


@main.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--top", default=10, show_default=True, type=click.IntRange(1, None), help="Sites listed."
)
@click.option(
    "--by",
    type=click.Choice(GROUPINGS),
    default="site",
    show_default=True,
    help="Group allocations by call site, API, library, process or rank.",
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
@click.option("--fold", "fold_patterns", multiple=True, metavar="REGEX", help=FOLD_HELP)
@click.option("--no-fold", is_flag=True, help=NO_FOLD_HELP)
@click.option("--full-names", is_flag=True, help=FULL_NAMES_HELP)
@click.option("--tree", is_flag=True, help="Show the caller tree from the program's entry down.")
@click.option(
    "--svg",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write a timeline picture (SVG) to FILE.",
)
@click.option(
    "--html",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write one self-contained HTML page (timeline, flame graph, sites) to FILE.",
)
@click.option(
    "--watch",
    is_flag=True,
    help="Re-render the text report every second while the run is being traced.",
)
@click.option(
    "--python-only",
    "view",
    flag_value="python",
    help="Python programs: sites and stacks from Python frames alone.",
)
@click.option(
    "--native-only",
    "view",
    flag_value="native",
    help="Python programs: native frames alone (the eval loop not replaced).",
)
def report(
    path,
    top,
    by,
    at,
    device,
    depth,
    show_cuda_frames,
    as_json,
    fold_patterns,
    no_fold,
    full_names,
    tree,
    svg,
    html,
    watch,
    view,
):
    """Who held the device memory at the peak (or another moment), by call site.

    PATH is a trace directory written by `cudatrace run`, or one .ctrace file of it. Several
    PATHs (one per host or launch), or a folder of trace directories, are one run of many
    ranks (docs/ranks.md).
    """
    path = path[0] if len(path) == 1 else list(path)
    if watch:
        if isinstance(path, list):
            raise click.UsageError("--watch follows one trace directory")
        if as_json or svg or html:
            raise click.UsageError(
                "--watch shows the text report; leave out --json, --svg and --html"
            )
        from .present.watch import watch_report

        sys.exit(
            watch_report(
                path,
                top=top,
                by=by,
                at=at,
                device=device,
                depth=depth,
                show_cuda_frames=show_cuda_frames,
            )
        )
    from .present.commands import run_report

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
            html=html,
            view=view or "hybrid",
            fold=not no_fold,
            fold_patterns=fold_patterns,
            full_names=full_names,
            tree=tree,
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
@click.option(
    "--html",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write one self-contained HTML page (differential flame graph, site changes).",
)
@click.option("--fold", "fold_patterns", multiple=True, metavar="REGEX", help=FOLD_HELP)
@click.option("--no-fold", is_flag=True, help=NO_FOLD_HELP)
@click.option("--full-names", is_flag=True, help=FULL_NAMES_HELP)
def diff(a, b, top, depth, as_json, html, fold_patterns, no_fold, full_names):
    """What changed between two traces A and B: sites grown, shrunk, new and gone.

    A and B are trace directories (or .ctrace files), or folders of trace directories (a run
    of many ranks, docs/ranks.md). Sites are matched by function, file and module names, so
    two runs, or two builds with symbols, compare.
    """
    from .present.diff import run_diff

    sys.exit(
        run_diff(
            a,
            b,
            top=top,
            depth=depth,
            as_json=as_json,
            html=html,
            fold=not no_fold,
            fold_patterns=fold_patterns,
            full_names=full_names,
        )
    )


def _use_ledger_dir(ledger_dir):
    """--ledger-dir: the one setting the C of both sides reads (CUDATRACE_LEDGER_DIR)."""
    if ledger_dir is not None:
        import os

        os.environ["CUDATRACE_LEDGER_DIR"] = str(Path(ledger_dir).absolute())


@main.command()
@click.argument("group", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Re-render every second until Ctrl-C.")
@click.option(
    "--ledger-dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where budget ledgers live (default $CUDATRACE_LEDGER_DIR, else /dev/shm/cudatrace-UID): "
    "a directory containers share by a bind mount to share a --group (docs/budgets.md).",
)
@click.option(
    "--reset",
    is_flag=True,
    help="Remove GROUP's ledger (budget, peaks, denials) so its next run starts afresh; "
    "refused while a member is alive.",
)
def status(group, as_json, watch, ledger_dir, reset):
    """Budgets in force: limits, use per device and per member process, denials.

    Without GROUP: every budget ledger of this user (named groups and running `cudatrace run
    --budget` trees). Reads the ledgers through the same C code the preload library uses.
    """
    from .present.status import render_status
    from .record.ledger import LedgerError, reset_group, status_json

    _use_ledger_dir(ledger_dir)
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
    if watch:
        if as_json:
            raise click.UsageError("--watch shows text; leave out --json")
        from .present.watch import watch_status

        def status_text(g):
            try:
                return render_status(status_json(g))
            except LedgerError as e:
                return f"cudatrace: {e}\n"

        sys.exit(watch_status(status_text, group))
    try:
        st = status_json(group)
    except LedgerError as e:  # the same prefix and status as every other command's errors
        click.echo(f"cudatrace: {e}", err=True)
        sys.exit(2)
    from .record.denials import attach_last_denials

    attach_last_denials(st)
    click.echo(json.dumps(st, indent=2) if as_json else render_status(st))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--ledger-dir",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Check this ledger directory (as run --ledger-dir).",
)
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def doctor(as_json, ledger_dir, cmd):
    """What a run would see here: CUDA driver and NVML, integrated or discrete devices, the
    ledger directory, the container / PID namespace, and whether CMD can be entered."""
    from .present.doctor import render_doctor
    from .record.doctor import diagnose

    _use_ledger_dir(ledger_dir)
    r = diagnose(list(cmd) or None)
    click.echo(json.dumps(r, indent=2) if as_json else render_doctor(r))
    sys.exit(0 if not cmd or r["command"]["ok"] else 1)


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


@main.command()
@click.argument("path", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    required=True,
    metavar="FORMAT",
    help="folded, pprof, speedscope, memory-viz or perfetto (docs/exports.md).",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The file to write.",
)
@click.option(
    "--at",
    "at",
    default="peak",
    show_default=True,
    metavar="peak|end|TIME",
    help="The moment, as for report: the peak, the end, or TIME seconds since the start.",
)
@click.option("--device", type=int, default=None, metavar="N", help="Only device N.")
@click.option("--show-cuda-frames", is_flag=True, help="Keep the CUDA libraries' own frames.")
def export(path, fmt, output, at, device, show_cuda_frames):
    """Write the trace in PATH in a format other tools open (pprof, flame graphs, PyTorch's
    memory viewer, Perfetto), attributed as `report` attributes it. Several PATHs are one run
    of many ranks, as for report."""
    from .present.export.run import run_export

    path = path[0] if len(path) == 1 else list(path)
    sys.exit(run_export(path, fmt, output, at=at, device=device, show_cuda_frames=show_cuda_frames))


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--values",
    multiple=True,
    metavar="V1,V2,..|NAME=V1,V2,..",
    help="The values to run: 1,2,4 or 256MiB,1GiB for {} in CMD; NAME=... several "
    "times for a grid, with {NAME} in CMD.",
)
@click.option("--stop-after", metavar="TIME", help="Stop each run after TIME (30s, 2m).")
@click.option(
    "--until-url",
    metavar="URL",
    help="Stop each run once URL answers and the traced live memory has settled.",
)
@click.option(
    "--settle",
    default="2s",
    show_default=True,
    metavar="TIME",
    help="With --until-url: no change of live memory for this long.",
)
@click.option(
    "--grace",
    default="10s",
    show_default=True,
    metavar="TIME",
    help="Between SIGINT, SIGTERM and SIGKILL when stopping a run.",
)
@click.option(
    "--url-timeout",
    default="300s",
    show_default=True,
    metavar="TIME",
    help="With --until-url: give up on a run whose URL never answers.",
)
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Directory of the sweep, one trace directory per run.",
)
@click.option("--force", is_flag=True, help="Replace an earlier sweep in the directory.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema cudatrace.sweep/1).")
@click.option(
    "--html", metavar="FILE", help="Also write a self-contained page of the laws' charts."
)
@click.option(
    "--expect",
    metavar="SLOPE",
    help="Bytes per unit of the knob it should grow (1 for a size flag); flag faster.",
)
@click.option("--predict", metavar="V", help="Predict the peak and top sites at V (a=4,b=8).")
@click.option(
    "--from",
    "from_dir",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Fit a recorded sweep again (other --expect, --predict, --depth); run nothing.",
)
@click.option("--top", default=10, show_default=True, type=click.IntRange(1, None))
@click.option(
    "--depth",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Frames that make a site.",
)
@_budget_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def sweep(stack_depth, budget, group, on_exceed, count_host, no_virtualize, **kw):
    """Run CMD at each value of a knob ({} in CMD), traced; fit how the peak and each call site
    grow with it. Run options (--budget ...) apply to every run, as in `cudatrace run`."""
    from .sweep import main as sweep_main

    _check_budget(budget)
    sys.exit(
        sweep_main(
            run_options=dict(
                stack_depth=stack_depth,
                budget=budget,
                group=group,
                on_exceed=on_exceed,
                count_host=count_host,
                virtualize=not no_virtualize,
            ),
            **kw,
        )
    )


if __name__ == "__main__":
    main()
