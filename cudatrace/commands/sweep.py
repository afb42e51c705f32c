"""`cudatrace sweep --values ... -- CMD {}`: run CMD at each value of a knob, traced, and fit
how the peak and each call site grow with it (the runs and fits are in sweep/)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .. import tracedir
from ..attribution import Attribution
from ..errors import OptionError
from ..outputs import OutputError, write_output
from ..units import lossless_data
from .options import Outputs, RunSettings, attribution_options
from .params import SizeWordCommand
from .sweep_options import Fit, Where, stop_options

if TYPE_CHECKING:
    from ..analyze.documents.sweep_types import Sweep
    from ..sweep.knobs import Knob
    from ..sweep.records import Run
    from ..sweep.runs import Plan
    from ..sweep.stop import StopRule

# CMD starts at the first word that is not an option (or after --), and whatever follows is
# its own; an unknown option before it is a typo of ours (--simulatd, --budjet), said with
# click's "did you mean", never run as the command
RUN_CONTEXT = {"allow_interspersed_args": False}


@click.command(cls=SizeWordCommand, context_settings=RUN_CONTEXT)
@click.option(
    "--values",
    multiple=True,
    metavar="V1,V2,..|NAME=V1,V2,..",
    help="The values to run: 1,2,4 or 256MiB,1GiB for {} in CMD; NAME=... several "
    "times for a grid, with {NAME} in CMD.  [required, unless --from]",
)
@stop_options()
@Where.options()
@Outputs.options("cudatrace.sweep/1", html="Also write a self-contained page of the laws' charts.")
@Fit.options()
@attribution_options()
@RunSettings.options()
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def sweep(**kw: Any) -> int:
    """Run CMD at each value of a knob ({} in CMD), traced, and fit how the peak and each call
    site grow with it.

    Each run is a `cudatrace run` (--budget, --simulated and the other run options apply to
    every run); the laws are printed, and written to sweep.json in the sweep's directory
    (docs/sweep-json.md). `cudatrace sweep --from DIR` fits a recorded sweep again.
    """
    return run_sweep(**kw)


def run_sweep(
    values: Sequence[str],
    cmd: Sequence[str],
    where: Where = Where(),
    stop: StopRule | None = None,
    fit: Fit = Fit(),
    outputs: Outputs = Outputs(),
    attribution: Attribution = Attribution(),
    settings: RunSettings = RunSettings(),
) -> int:
    """The body of `cudatrace sweep`; returns the exit status: 0, 1 when fewer than two runs
    could be fitted. Bad input (nothing run) raises CudatraceError (status 2)."""
    from ..sweep import Plan, bind_command, execute, parse_knobs, sweep_json
    from ..sweep.stop import StopRule

    stop = stop or StopRule()
    cmd = list(cmd)
    outputs.printed_on_stdout()  # refused before anything runs: two outputs on one stdout
    if where.from_dir is not None:
        return _run_from(Path(where.from_dir), values, cmd, fit, outputs, attribution)
    knobs = parse_knobs(values)
    bind_command(knobs, cmd)
    if stop.stop_after is not None and stop.url is not None:
        raise OptionError("--stop-after and --until-url: give one")
    if stop.url is not None:
        _check_url(stop.url)
    exp = _expect(fit.expect, knobs)
    point = _point(fit.predict, knobs)
    out = (
        Path(where.out_dir)
        if where.out_dir
        else tracedir.fresh(cmd[0].replace("{", "").replace("}", ""), "sweep")
    )
    plan = Plan(
        knobs,
        cmd,
        out.resolve(),
        stop,
        settings.as_dict(),
        where.force,
        attribution,
    )
    _check_plan(plan, outputs.html)
    total = len(plan.runs())
    sys.stderr.write(
        f"cudatrace sweep: {total} run{'' if total == 1 else 's'} of {' '.join(cmd)} -> {plan.out}\n"
    )
    sys.stderr.flush()
    try:
        runs = execute(plan, _progress(plan))
    except KeyboardInterrupt:
        sys.stderr.write("cudatrace sweep: interrupted\n")
        return 130
    doc = lossless_data(sweep_json(plan, runs, exp, point, fit.predict, fit.top, fit.expect))
    try:
        write_output(plan.out / "sweep.json", json.dumps(doc, indent=2) + "\n")
    except OutputError as e:
        sys.stderr.write(f"cudatrace sweep: could not write {plan.out / 'sweep.json'}: {e}\n")
    return _show(doc, runs, outputs)


def _progress(plan: Plan) -> Callable[[int, int, Run], None]:
    """The line said as each run ends: its value, how it ended, its peak."""
    from ..analyze.documents import sweep_sentences as sentences
    from ..sweep.knobs import text_of

    def progress(n: int, total: int, rec: Run) -> None:
        m = rec["measured"]
        peak = f", peak {sentences.readable(m['peak_bytes'])}" if m and rec["included"] else ""
        left_out = "" if rec["included"] else " (left out of the laws)"
        sys.stderr.write(
            f"  {n}/{total}  {text_of(plan.knobs, rec['combo'])}: "
            f"{sentences.ended_text(rec['ended'])}{peak}{left_out}\n"
        )
        sys.stderr.flush()

    return progress


def _check_url(url: str) -> None:
    """--until-url: a URL that can answer at all (scheme, host, a port that exists), refused
    at once rather than waited on for the whole timeout."""
    from urllib.parse import urlsplit

    if not re.match(r"^https?://", url):
        raise OptionError(f"--until-url {url}: an http:// or https:// URL")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port out of 0..65535
    except ValueError as e:
        raise OptionError(f"--until-url {url}: not a URL ({e})") from None
    if not parts.hostname:
        raise OptionError(f"--until-url {url}: no host")
    if port == 0:
        raise OptionError(f"--until-url {url}: port 0 is no port to connect to")


def _expect(expect: str | None, knobs: list[Knob]) -> float | dict[str, float] | None:
    """--expect SLOPE read against the knobs (None without it)."""
    if expect is None:
        return None
    from ..sweep import SweepError, parse_expect

    try:
        return parse_expect(expect, knobs)
    except SweepError as e:
        raise OptionError(f"--expect {expect}: {e}") from None


def _point(predict: str | None, knobs: list[Knob]) -> tuple[float, ...] | None:
    from ..sweep import parse_point

    return parse_point(knobs, predict) if predict is not None else None


def _check_plan(plan: Plan, html: Path | None) -> None:
    """Refuse before running anything: an output in the way, an --html FILE that cannot be
    written, a command that cannot be entered."""
    from ..sweep import check_output

    check_output(plan)
    _check_html(html)
    if not any(k.placeholder in plan.cmd[0] for k in plan.knobs):
        from ..record.launcher import check_enterable, resolve_command

        check_enterable(resolve_command(plan.cmd[0]))


def _show(doc: Sweep, runs: list[Run], outputs: Outputs) -> int:
    """Print the sweep (text or JSON), write --html; the exit status."""
    from ..present import sweep as text

    if not outputs.printed_on_stdout():  # --html -: the page is the output
        sys.stdout.write(json.dumps(doc, indent=2) + "\n" if outputs.as_json else text.render(doc))
        sys.stdout.flush()
    rc = 0 if sum(1 for r in runs if r["included"]) >= 2 else 1
    return _write_html(outputs.html, doc) or rc


def _check_html(html: Path | None) -> None:
    """--html FILE: refuse before running anything when FILE cannot be written there."""
    if html is not None and not Path(html).resolve().parent.is_dir():
        raise OptionError(f"--html {html}: no such directory")


def _write_html(html: Path | None, doc: Sweep) -> int:
    """Write the page of --html (present/sweep_html.py); 1 with the reason when it cannot be."""
    if html is None:
        return 0
    from ..present import sweep_html

    try:
        write_output(html, sweep_html.render(doc))
    except OutputError as e:
        sys.stderr.write(f"cudatrace sweep: could not write {html}: {e}\n")
        return 1
    sys.stderr.write(f"cudatrace sweep: charts in {html}\n")
    return 0


def _run_from(
    path: Path,
    values: Sequence[str],
    cmd: list[str],
    fit: Fit,
    outputs: Outputs,
    attribution: Attribution,
) -> int:
    """`cudatrace sweep --from DIR`: the recorded sweep's laws again, nothing run."""
    from ..sweep import load_recorded, sweep_json

    if values or cmd:
        raise OptionError("--from replays a recorded sweep: give no --values and no command")
    plan, runs = load_recorded(path, attribution)
    exp = _expect(fit.expect, plan.knobs)
    point = _point(fit.predict, plan.knobs)
    _check_html(outputs.html)
    doc = lossless_data(sweep_json(plan, runs, exp, point, fit.predict, fit.top, fit.expect))
    return _show(doc, runs, outputs)
