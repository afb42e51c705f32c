"""`cudatrace export PATH --format F -o FILE`: the trace in a format other tools open, attributed
as `report` attributes it (present/export/ holds one module per format)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..attribution import Attribution
from ..errors import CudatraceError
from ..outputs import describe
from .options import Moment, attribution_options
from .params import OutputPath

if TYPE_CHECKING:
    from ..present.export import Exporter
    from ..present.export.view import View
    from ..symbols import Symbolizer


@click.command()
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
    type=OutputPath(dir_okay=False),
    help="The file to write.",
)
@Moment.options()
@attribution_options(depth=False)
def export(
    path: tuple[Path, ...], fmt: str, output: Path, moment: Moment, attribution: Attribution
) -> int:
    """Write the trace in PATH in a format other tools open (pprof, flame graphs, PyTorch's
    memory viewer, Perfetto), attributed as `report` attributes it. Several PATHs are one run
    of many ranks, as for report."""
    run_export(path[0] if len(path) == 1 else list(path), fmt, output, moment, attribution)
    return 0


def run_export(
    path: Path | list[Path],
    fmt: str,
    output: str | Path,
    moment: Moment = Moment(),
    attribution: Attribution = Attribution(),
    symbolizer: Symbolizer | None = None,
    quiet: bool = False,
) -> None:
    """Write the trace at PATH as FORMAT to OUTPUT (also callable from Python). The file
    appears whole or not at all. Raises CudatraceError."""
    from ..analyze.documents.analysis import Analysis
    from ..present.export import get
    from ..present.export.view import View
    from ..progress import stderr_is_tty

    exporter = get(fmt)
    exporter.load()  # a missing extra is said before any work
    try:
        a = Analysis(
            path,
            attribution,
            symbolizer=symbolizer,
            progress=not quiet and stderr_is_tty(),
        )
    except CudatraceError:
        raise
    except ValueError as e:  # e.g. a bad --fold pattern
        raise CudatraceError(str(e)) from None
    view = View(a, moment.at, moment.device)
    out = Path(output)
    summary = _write(exporter, view, out)
    if not quiet:
        from ..units import format_bytes

        click.echo(
            f"cudatrace: wrote {describe(out)} ({exporter.name}): {format_bytes(view.total)} live "
            f"{view.moment_text()}{_details(summary)}; open it with {exporter.opens_with}",
            err=True,
        )


def _write(exporter: Exporter, view: View, out: Path) -> dict[str, Any]:
    """Write OUTPUT by the rules of outputs.py: whole or not at all, written through (never
    replaced) when it is a device or a FIFO, standard output for -."""
    from ..outputs import output_path

    with output_path(out) as tmp:
        return exporter.write(view, tmp)


def _details(summary: dict[str, Any]) -> str:
    parts = [
        "{} {}".format(f"{v:,}", _one(k) if v == 1 else k)
        for k, v in summary.items()
        if isinstance(v, int) and k != "bytes"
    ]
    return " ({})".format(", ".join(parts)) if parts else ""


def _one(noun: str) -> str:
    if noun.endswith("ies"):
        return noun[:-3] + "y"
    return noun[:-1] if noun.endswith("s") else noun
