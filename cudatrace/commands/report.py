"""`cudatrace report PATH`: who held the device memory at a moment, by call site; the text,
JSON, tree, SVG timeline and HTML page of it, and `--watch`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TextIO

import click

from ..attribution import Attribution
from ..choices import GROUPINGS
from ..errors import CudatraceError, OptionError
from .options import Moment, Outputs, attribution_options, choice_option, option_group

if TYPE_CHECKING:
    from ..analyze.documents.analysis import Analysis
    from ..analyze.documents.report_types import Report
    from ..symbols import Symbolizer


class Query(NamedTuple):
    """What the report lists: the top sites, grouped by, or the caller tree (--tree)."""

    top: int = 10
    by: str = "site"
    tree: bool = False


HELP = {"help_option_names": ["-h", "--help"]}
LOST_STATUS = 3  # the report was written, but part of a trace is lost (docs/reliability.md)


@click.command("report", context_settings=HELP)
@click.argument("path", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--top", default=10, show_default=True, type=click.IntRange(1, None), help="Sites listed."
)
@choice_option("--by", GROUPINGS, "Group allocations by call site, API, library, process or rank.")
@Moment.options()
@attribution_options()
@Outputs.options(
    "cudatrace.report/1",
    svg="Also write a timeline picture (SVG) to FILE.",
    html="Also write one self-contained HTML page (timeline, flame graph, sites) to FILE.",
)
@click.option("--tree", is_flag=True, help="Show the caller tree from the program's entry down.")
@click.option(
    "--watch",
    is_flag=True,
    help="Re-render the text report every second while the run is being traced.",
)
@option_group("query", Query, [])
def report(
    path: tuple[Path, ...],
    query: Query,
    moment: Moment,
    attribution: Attribution,
    outputs: Outputs,
    watch: bool,
) -> int:
    """Who held the device memory at the peak (or another moment), by call site.

    PATH is a trace directory written by `cudatrace run`, or one .ctrace file of it. Several
    PATHs (one per host or launch), or a folder of trace directories, are one run of many
    ranks (docs/ranks.md).
    """
    where: Path | list[Path] = path[0] if len(path) == 1 else list(path)
    if watch:
        if isinstance(where, list):
            raise click.UsageError("--watch follows one trace directory")
        if outputs.as_json or outputs.svg or outputs.html:
            raise click.UsageError(
                "--watch shows the text report; leave out --json, --svg and --html"
            )
        watch_report(where, query, moment, attribution)
        return 0
    return run_report(where, query, moment, attribution, outputs)


def run_report(
    path: Path | list[Path],
    query: Query = Query(),
    moment: Moment = Moment(),
    attribution: Attribution = Attribution(),
    outputs: Outputs = Outputs(),
    out: TextIO | None = None,
    symbolizer: Symbolizer | None = None,
) -> int:
    """The body of `cudatrace report` (also callable from Python): writes the chosen outputs;
    the exit status: 0, or LOST_STATUS when part of a trace is lost (sealed chunks in neither
    the trace nor its sidecar: the report lacks their events, and says so on stderr too).
    Raises CudatraceError (a trace that cannot be read, a file that cannot be written)."""
    from ..analyze.documents.analysis import Analysis
    from ..progress import stderr_is_tty

    if outputs.printed_on_stdout() and query.tree:
        raise OptionError("--tree prints to standard output: give --html and --svg a FILE")
    try:
        a = Analysis(
            path,
            attribution,
            symbolizer=symbolizer,
            progress=not outputs.as_json and stderr_is_tty(),
        )
        r = _report(a, attribution, moment, query)
        if query.tree:
            from ..analyze.documents.tree import build_tree

            r["tree"] = build_tree(a, at=moment.at, device=moment.device)
    except CudatraceError:
        raise
    except ValueError as e:  # e.g. a bad --fold pattern
        raise CudatraceError(str(e)) from None
    _write_files(a, r, moment, attribution, outputs)
    _print(r, outputs, query.tree, attribution.full_names, out or sys.stdout)
    if r.get("lost_chunks"):
        n = sum(len(x["chunks"]) for x in r["lost_chunks"])
        click.echo(
            f"cudatrace: {n} sealed chunk(s) of {len(r['lost_chunks'])} trace file(s) could not "
            "be read back (the compressed sidecar is damaged or missing): the report lacks "
            "their events",
            err=True,
        )
        return LOST_STATUS
    return 0


def _report(a: Analysis, attribution: Attribution, moment: Moment, query: Query) -> Report:
    """The report of the moment and grouping asked (report's and --watch's)."""
    from ..analyze.documents.report import build_report

    return build_report(
        a,
        at=moment.at,
        by=query.by,
        depth=attribution.depth,
        top=query.top,
        device=moment.device,
    )


def _write_files(
    a: Analysis, r: Report, moment: Moment, attribution: Attribution, outputs: Outputs
) -> None:
    """--svg and --html: written before the text, so that a failure is said first."""
    if outputs.svg:
        from ..present.plot import write_svg

        try:
            write_svg(a, outputs.svg, device=moment.device, report=r)
        except OSError as e:
            raise CudatraceError(f"cannot write {outputs.svg}: {e.strerror or e}") from None
    if outputs.html:
        from ..present.html import render_report_html, write_html
        from ..progress import bar, stderr_is_tty

        page = render_report_html(
            a, r, depth=attribution.depth, progress=bar if stderr_is_tty() else None
        )
        try:
            write_html(outputs.html, page)
        except OSError as e:
            raise CudatraceError(f"cannot write {outputs.html}: {e.strerror or e}") from None


def _print(r: Report, outputs: Outputs, tree: bool, full_names: bool, out: TextIO) -> None:
    if outputs.printed_on_stdout():  # --html - (or --svg -): the page is the output
        return
    if outputs.as_json:
        out.write(json.dumps(r, indent=2, sort_keys=False) + "\n")
    elif tree:
        from ..present.tree import render_tree

        out.write(render_tree(r["tree"], full=full_names))
    else:
        from ..present.report import render_text
        from ..present.text import use_colour

        out.write(render_text(r, colour=use_colour(out)))
        if outputs.svg:
            out.write(f"timeline written to {outputs.svg}\n")
        if outputs.html:
            out.write(f"HTML report written to {outputs.html}\n")


def watch_report(
    path: Path,
    query: Query = Query(),
    moment: Moment = Moment(),
    attribution: Attribution = Attribution(),
    interval: float = 1.0,
    out: TextIO | None = None,
) -> int:
    """The body of `cudatrace report --watch` (returns the number of renders): the text report every `interval` seconds until
    Ctrl-C or the run's end (present/watch.py)."""
    from ..analyze.documents.analysis import Analysis
    from ..analyze.sites.stacks import make_symbolizer
    from ..present.report import render_text
    from ..present.text import use_colour
    from ..present.watch import loop, run_ended

    sym = make_symbolizer()
    colour = use_colour(out or sys.stdout)

    def render() -> str:
        try:
            a = Analysis(path, attribution, symbolizer=sym)
            return render_text(_report(a, attribution, moment, query), colour=colour)
        except CudatraceError as e:
            return f"cudatrace: {e}\n(waiting: the trace may not have been written yet)\n"
        except ValueError as e:
            return f"cudatrace: {e}\n"

    def head(done: bool, why: str) -> str:
        return "cudatrace report --watch {}  {}  {}".format(
            path,
            time.strftime("%H:%M:%S"),
            f"{why}: last render" if done else f"{why} (every {interval:g} s; Ctrl-C stops)",
        )

    waited_since: float | None = None  # when the wait for the directory began

    def ended() -> tuple[bool, str]:
        nonlocal waited_since
        if Path(path).exists():
            return run_ended(path)
        # a directory a run has not created yet is waited for, a while, never forever
        waited_since = waited_since or time.monotonic()
        if time.monotonic() - waited_since >= MISSING_WAIT_S:
            return True, f"{path} did not appear in {MISSING_WAIT_S:g} s"
        return False, f"waiting for {path} to appear"

    rc = loop(render, head, ended, interval, out)
    if not Path(path).exists():
        raise CudatraceError(f"{path}: no such trace directory")
    return rc


# how long `report --watch` waits for a trace directory that is not there yet
MISSING_WAIT_S = 30.0
