"""The body of `cudatrace report`: analyse a trace and write the chosen outputs (text, JSON,
SVG timeline, HTML page). Apart from report.py because the HTML page is built from the text
report's pieces (html.py imports report.py)."""

from __future__ import annotations

import json
import sys

import click

from ..analyze.analysis import Analysis, ReportError, build_report, parse_moment
from .plot import write_svg
from .report import render_text


def run_report(
    path,
    top=10,
    by="site",
    at="peak",
    device=None,
    depth=1,
    show_cuda_frames=False,
    as_json=False,
    svg=None,
    out=None,
    symbolizer=None,
    html=None,
    view="hybrid",
    fold=True,
    fold_patterns=(),
    full_names=False,
    tree=False,
) -> int:
    """The body of `cudatrace report` (also callable from Python). Returns the exit status."""
    out = out or sys.stdout
    try:
        parse_moment(at)
    except ValueError as e:
        click.echo(f"cudatrace: --at {e}", err=True)
        return 2
    try:
        a = Analysis(
            path,
            show_cuda_frames=show_cuda_frames,
            symbolizer=symbolizer,
            progress=not as_json and _tty(),
            view=view,
            fold_layers=fold,
            fold_patterns=fold_patterns,
            full_names=full_names,
        )
        r = build_report(a, at=at, by=by, depth=depth, top=top, device=device)
        if tree:
            from ..analyze.tree import build_tree

            r["tree"] = build_tree(a, at=at, device=device)
    except ReportError as e:
        click.echo(str(e), err=True)
        return e.status
    except ValueError as e:  # e.g. a bad --fold pattern; never blamed on --at (checked above)
        click.echo(f"cudatrace: {e}", err=True)
        return 2
    if svg:
        try:
            write_svg(a, svg, device=device, report=r)
        except OSError as e:
            click.echo(f"cudatrace: cannot write {svg}: {e.strerror or e}", err=True)
            return 2
    if html:
        from ..progress import bar
        from .html import render_report_html, write_html

        try:
            write_html(
                html, render_report_html(a, r, depth=depth, progress=bar if _tty() else None)
            )
        except OSError as e:
            click.echo(f"cudatrace: cannot write {html}: {e.strerror or e}", err=True)
            return 2
    if as_json:
        out.write(json.dumps(r, indent=2, sort_keys=False) + "\n")
    elif tree:
        from .tree import render_tree

        out.write(render_tree(r["tree"], full=full_names))
    else:
        out.write(render_text(r))
        if svg:
            out.write(f"timeline written to {svg}\n")
        if html:
            out.write(f"HTML report written to {html}\n")
    return 0


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:
        return False
