"""The body of `cudatrace export` (also callable from Python)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ...analyze.analysis import Analysis, ReportError
from ...units import format_bytes, parse_time
from . import ExportError, get


def run_export(
    path,
    fmt: str,
    output,
    at: str = "peak",
    device: int | None = None,
    show_cuda_frames: bool = False,
    symbolizer=None,
    quiet: bool = False,
) -> int:
    """Write the trace at PATH as FORMAT to OUTPUT; returns the exit status (0, or 2 with a
    message on stderr). The file appears whole or not at all."""
    try:
        exporter = get(fmt)
        exporter.load()  # a missing extra is said before any work
        if at not in ("peak", "end"):
            parse_time(at)
        a = Analysis(
            path,
            show_cuda_frames=show_cuda_frames,
            symbolizer=symbolizer,
            progress=not quiet and _tty(),
        )
        from .view import View

        view = View(a, at, device)
    except (ExportError, ReportError) as e:
        click.echo(str(e), err=True)
        return e.status
    except ValueError as e:
        click.echo(f"cudatrace: --at {e}", err=True)
        return 2
    out = Path(output)
    tmp = out.with_name(".%s.%d.tmp" % (out.name, os.getpid()))
    try:
        summary = exporter.write(view, tmp)
        os.replace(tmp, out)
    except OSError as e:
        _unlink(tmp)
        click.echo(f"cudatrace: cannot write {out}: {e.strerror or e}", err=True)
        return 2
    except BaseException:
        _unlink(tmp)
        raise
    if not quiet:
        click.echo(
            f"cudatrace: wrote {out} ({exporter.name}): {format_bytes(view.total)} live {view.moment_text()}{_details(summary)}; open it with {exporter.opens_with}",
            err=True,
        )
    return 0


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


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:
        return False
