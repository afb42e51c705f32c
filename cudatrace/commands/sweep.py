"""`cudatrace sweep --values ... -- CMD {}`: run CMD at each value of a knob, traced, and fit
how the peak and each call site grow with it (the runs and fits are in sweep/)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import click

from ..errors import OptionError
from ..outputs import OutputError, write_output
from ..units import lossless_data
from .options import (
    Attribution,
    Duration,
    OutputPath,
    Outputs,
    RunSettings,
    SizeWordCommand,
)

RUN_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": False}


@click.command(cls=SizeWordCommand, context_settings=RUN_CONTEXT)
@click.option(
    "--values",
    multiple=True,
    metavar="V1,V2,..|NAME=V1,V2,..",
    help="The values to run: 1,2,4 or 256MiB,1GiB for {} in CMD; NAME=... several "
    "times for a grid, with {NAME} in CMD.  [required, unless --from]",
)
@click.option(
    "--stop-after",
    type=Duration(),
    metavar="TIME",
    help="Stop each run after TIME (30s, 2m), as for a server that never ends (default: each "
    "run ends by itself).",
)
@click.option(
    "--until-url",
    metavar="URL",
    help="Stop each run once URL answers and the traced live memory has settled (a server "
    "that is ready).",
)
@click.option(
    "--settle",
    default="2s",
    show_default=True,
    type=Duration(),
    metavar="TIME",
    help="With --until-url: no change of live memory for this long.",
)
@click.option(
    "--grace",
    default="10s",
    show_default=True,
    type=Duration(),
    metavar="TIME",
    help="Between SIGINT, SIGTERM and SIGKILL when stopping a run.",
)
@click.option(
    "--url-timeout",
    default="300s",
    show_default=True,
    type=Duration(),
    metavar="TIME",
    help="With --until-url: give up on a run whose URL never answers.",
)
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=OutputPath(),
    help="Directory of the sweep: sweep.json and one trace directory per run (default: "
    "./cudatrace-sweep-CMD-DATE-TIME, created).",
)
@click.option("--force", is_flag=True, help="Replace an earlier sweep in the directory.")
@Outputs.options("cudatrace.sweep/1", html="Also write a self-contained page of the laws' charts.")
@click.option(
    "--expect",
    metavar="SLOPE",
    help="How many bytes each site should grow per unit of the knob (1 for a flag that is a "
    "size); the sites that grow faster are flagged.",
)
@click.option(
    "--predict",
    metavar="V",
    help="Predict the peak and the top sites at the value V (a=4,b=8 on a grid), with the "
    "budget to give a run there.",
)
@click.option(
    "--from",
    "from_dir",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Fit a recorded sweep again (other --expect, --predict, --depth); run nothing.",
)
@click.option(
    "--top",
    default=10,
    show_default=True,
    type=click.IntRange(1, None),
    help="Sites whose laws are listed.",
)
@Attribution.options()
@RunSettings.options()
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def sweep(**kw):
    """Run CMD at each value of a knob ({} in CMD), traced, and fit how the peak and each call
    site grow with it.

    Each run is a `cudatrace run` (--budget, --simulated and the other run options apply to
    every run); the laws are printed, and written to sweep.json in the sweep's directory
    (docs/sweep-json.md). `cudatrace sweep --from DIR` fits a recorded sweep again.
    """
    return run_sweep(**kw)


def run_sweep(
    values,
    cmd,
    out_dir=None,
    force=False,
    outputs: Outputs = Outputs(),
    stop_after: float | None = None,
    until_url=None,
    settle: float = 2.0,
    grace: float = 10.0,
    url_timeout: float = 300.0,
    expect=None,
    predict=None,
    top=10,
    attribution: Attribution = Attribution(),
    settings: RunSettings = RunSettings(),
    from_dir=None,
    out=None,
    err=None,
) -> int:
    """The body of `cudatrace sweep`; returns the exit status: 0, 1 when fewer than two runs
    could be fitted. Bad input (nothing run) raises CudatraceError (status 2)."""
    from ..present import sweep as text
    from ..sweep import Plan, bind_command, execute, parse_knobs, sweep_json
    from ..sweep.knobs import _text_of
    from ..sweep.stop import StopRule

    out = out or sys.stdout
    err = err or sys.stderr
    cmd = list(cmd)
    outputs.printed_on_stdout()  # refused before anything runs: two outputs on one stdout
    if from_dir is not None:
        return _run_from(
            Path(from_dir), values, cmd, outputs, expect, predict, top, attribution, out, err
        )
    knobs = parse_knobs(values)
    bind_command(knobs, cmd)
    if stop_after is not None and until_url is not None:
        raise OptionError("--stop-after and --until-url: give one")
    rule = StopRule(stop_after, until_url, settle, grace, url_timeout)
    if until_url is not None:
        _check_url(until_url)
    exp = _expect(expect, knobs)
    point = _point(predict, knobs)
    plan = Plan(
        knobs,
        cmd,
        (
            Path(out_dir) if out_dir else default_out(cmd[0].replace("{", "").replace("}", ""))
        ).resolve(),
        rule,
        settings.as_dict(),
        force,
        attribution.depth,
        attribution.analysis_options(),
    )
    _check_plan(plan, outputs.html)

    total = len(plan.runs())
    err.write(
        "cudatrace sweep: %d run%s of %s -> %s\n"
        % (total, "" if total == 1 else "s", " ".join(cmd), plan.out)
    )
    err.flush()

    def progress(n, total, rec):
        m = rec["measured"]
        err.write(
            "  %d/%d  %s: %s%s%s\n"
            % (
                n,
                total,
                _text_of(knobs, rec["combo"]),
                text.ended_text(rec["ended"]),
                ", peak {}".format(text.readable(m["peak_bytes"])) if m and rec["included"] else "",
                "" if rec["included"] else " (left out of the laws)",
            )
        )
        err.flush()

    try:
        runs = execute(plan, progress)
    except KeyboardInterrupt:
        err.write("cudatrace sweep: interrupted\n")
        return 130
    doc = lossless_data(sweep_json(plan, runs, exp, point, predict, top, expect))
    try:
        write_output(plan.out / "sweep.json", json.dumps(doc, indent=2) + "\n")
    except OutputError as e:
        err.write("cudatrace sweep: could not write {}: {}\n".format(plan.out / "sweep.json", e))
    return _show(doc, runs, outputs, out, err)


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


def _expect(expect, knobs):
    """--expect SLOPE read against the knobs (None without it)."""
    if expect is None:
        return None
    from ..sweep import SweepError, parse_expect

    try:
        return parse_expect(expect, knobs)
    except SweepError as e:
        raise OptionError(f"--expect {expect}: {e}") from None


def _point(predict, knobs):
    from ..sweep import parse_point

    return parse_point(knobs, predict) if predict is not None else None


def _check_plan(plan, html) -> None:
    """Refuse before running anything: an output in the way, an --html FILE that cannot be
    written, a command that cannot be entered."""
    from ..sweep import check_output

    check_output(plan)
    _check_html(html)
    if not any(k.placeholder in plan.cmd[0] for k in plan.knobs):
        from ..record.launcher import check_enterable, resolve_command

        check_enterable(resolve_command(plan.cmd[0]))


def _show(doc: dict, runs: list, outputs: Outputs, out, err) -> int:
    """Print the sweep (text or JSON), write --html; the exit status."""
    from ..present import sweep as text

    if not outputs.printed_on_stdout():  # --html -: the page is the output
        out.write(json.dumps(doc, indent=2) + "\n" if outputs.as_json else text.render(doc))
        out.flush()
    rc = 0 if sum(1 for r in runs if r["included"]) >= 2 else 1
    return _write_html(outputs.html, doc, err) or rc


def default_out(cmd0: str) -> Path:
    base = "cudatrace-sweep-{}-{}".format(Path(cmd0).name or "run", time.strftime("%Y%m%d-%H%M%S"))
    p = Path.cwd() / base
    n = 1
    while p.exists():
        n += 1
        p = Path.cwd() / ("%s-%d" % (base, n))
    return p


def _check_html(html) -> None:
    """--html FILE: refuse before running anything when FILE cannot be written there."""
    if html is not None and not Path(html).resolve().parent.is_dir():
        raise OptionError(f"--html {html}: no such directory")


def _write_html(html, doc: dict, err) -> int:
    """Write the page of --html (present/sweep_html.py); 1 with the reason when it cannot be."""
    if html is None:
        return 0
    from ..present import sweep_html

    try:
        write_output(html, sweep_html.render(doc))
    except OutputError as e:
        err.write(f"cudatrace sweep: could not write {html}: {e}\n")
        return 1
    err.write(f"cudatrace sweep: charts in {html}\n")
    return 0


def _run_from(path: Path, values, cmd, outputs, expect, predict, top, attribution, out, err):
    """`cudatrace sweep --from DIR`: the recorded sweep's laws again, nothing run."""
    from ..sweep import load_recorded, sweep_json

    if values or cmd:
        raise OptionError("--from replays a recorded sweep: give no --values and no command")
    plan, runs = load_recorded(path, attribution.depth, attribution.analysis_options())
    exp = _expect(expect, plan.knobs)
    point = _point(predict, plan.knobs)
    _check_html(outputs.html)
    doc = lossless_data(sweep_json(plan, runs, exp, point, predict, top, expect))
    return _show(doc, runs, outputs, out, err)
