"""`cudatrace diff A B`: what changed between two runs: sites grown, shrunk, new and gone."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import click

from ..attribution import Attribution
from ..errors import CudatraceError
from .options import Outputs, attribution_options

if TYPE_CHECKING:
    from ..symbols import Symbolizer

HELP = {"help_option_names": ["-h", "--help"]}


@click.command("diff", context_settings=HELP)
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option(
    "--top", default=20, show_default=True, type=click.IntRange(1, None), help="Sites listed."
)
@attribution_options()
@Outputs.options(
    "cudatrace.diff/1",
    html="Also write one self-contained HTML page (differential flame graph, site changes).",
)
def diff(a: Path, b: Path, top: int, attribution: Attribution, outputs: Outputs) -> int:
    """What changed between two traces A and B: sites grown, shrunk, new and gone.

    A and B are trace directories (or .ctrace files), or folders of trace directories (a run
    of many ranks, docs/ranks.md). Sites are matched by function, file and module names, so
    two runs, or two builds with symbols, compare.
    """
    run_diff(a, b, top, attribution, outputs)
    return 0


def run_diff(
    a_path: Path,
    b_path: Path,
    top: int = 20,
    attribution: Attribution = Attribution(),
    outputs: Outputs = Outputs(),
    out: TextIO | None = None,
    symbolizer: Symbolizer | None = None,
) -> None:
    """The body of `cudatrace diff` (also callable from Python). Raises CudatraceError."""
    from ..analyze.documents.analysis import Analysis
    from ..analyze.documents.diff import diff as diff_of
    from ..analyze.documents.diff import share_graph
    from ..present.diff import render_text
    from ..progress import stderr_is_tty

    out = out or sys.stdout
    progress = not outputs.as_json and stderr_is_tty()
    on_stdout = outputs.printed_on_stdout()  # --html -: the page is the output
    try:
        a = Analysis(a_path, attribution, symbolizer=symbolizer, progress=progress)
        # one call graph for both runs: a site is attributed the same way on both sides
        b = Analysis(
            b_path,
            attribution,
            symbolizer=symbolizer if symbolizer is not None else a.symbolizer,
            progress=progress,
            graph=a.stacks.graph,
        )
        share_graph(a, b)
    except CudatraceError:
        raise
    except ValueError as e:  # e.g. a bad --fold pattern
        raise CudatraceError(str(e)) from None
    depth = attribution.depth
    d = diff_of(a, b, depth=depth, top=top)
    if outputs.html:
        from ..present.html import render_diff_html, write_html

        try:
            write_html(
                outputs.html, render_diff_html(a, b, diff_of(a, b, depth=depth), depth=depth)
            )
        except OSError as e:
            raise CudatraceError(f"cannot write {outputs.html}: {e.strerror or e}") from None
    if on_stdout:
        return
    if outputs.as_json:
        out.write(json.dumps(d, indent=2) + "\n")
    else:
        out.write(render_text(d))
        if outputs.html:
            out.write(f"HTML diff written to {outputs.html}\n")
