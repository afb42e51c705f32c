"""`cudatrace export PATH --format F -o FILE`: the trace in a format other tools open, attributed
as `report` attributes it (present/export/ holds one module per format)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import CudatraceError
from .options import Attribution, Moment


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
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
@Moment.options()
@Attribution.options(depth=False)
def export(path, fmt, output, moment, attribution):
    """Write the trace in PATH in a format other tools open (pprof, flame graphs, PyTorch's
    memory viewer, Perfetto), attributed as `report` attributes it."""
    run_export(path, fmt, output, moment, attribution)
    return 0


def run_export(
    path,
    fmt: str,
    output,
    moment: Moment = Moment(),
    attribution: Attribution = Attribution(),
    symbolizer=None,
    quiet: bool = False,
) -> None:
    """Write the trace at PATH as FORMAT to OUTPUT (also callable from Python). The file
    appears whole or not at all. Raises CudatraceError."""
    from ..analyze.analysis import Analysis
    from ..present.export import get
    from ..present.export.view import View
    from ..progress import stderr_is_tty

    exporter = get(fmt)
    exporter.load()  # a missing extra is said before any work
    try:
        a = Analysis(
            path,
            symbolizer=symbolizer,
            progress=not quiet and stderr_is_tty(),
            **attribution.analysis_options(),
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
            f"cudatrace: wrote {out} ({exporter.name}): {format_bytes(view.total)} live "
            f"{view.moment_text()}{_details(summary)}; open it with {exporter.opens_with}",
            err=True,
        )


def _write(exporter, view, out: Path) -> dict:
    """Write through a temporary file renamed over OUTPUT: whole or not at all."""
    tmp = out.with_name(".%s.%d.tmp" % (out.name, os.getpid()))
    try:
        summary = exporter.write(view, tmp)
        os.replace(tmp, out)
    except OSError as e:
        _unlink(tmp)
        raise CudatraceError(f"cannot write {out}: {e.strerror or e}") from None
    except BaseException:
        _unlink(tmp)
        raise
    return summary


def _details(summary: dict) -> str:
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


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass
