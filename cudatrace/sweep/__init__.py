"""`cudatrace sweep`: run a command at several values of a knob and fit how each site grows.

    cudatrace sweep --values 256MiB,512MiB,1GiB -- ./server --kv-cache-memory {}

runs the command once per value with `{}` replaced (several knobs: `--values a=1,2 --values
b=8,16` with `{a}` and `{b}`, the runs are their product), each traced by the launcher of
`cudatrace run` into its own directory (budgets and every run option apply). Servers that do
not exit are stopped after a time (`--stop-after`) or once a URL answers and the traced live
memory has settled (`--until-url`, `--settle`): SIGINT, then SIGTERM, then SIGKILL, a grace
period apart. How each run ended is recorded; runs that failed (a non-zero exit of their own,
allocations denied by a budget, no trace) are reported and left out of the fits.

Then the peak and every call site, with the attribution of `report` (sites.group through
report.Analysis) matched across runs by their key as `diff` does, get the bytes live at each
run's peak and a law in the knob (analyze/documents/laws.py). `sweep_json` returns the whole result as
the dict of `--json` (schema cudatrace.sweep/1, docs/sweep-json.md); the text is rendered from
that dict (present/sweep.py). The dict is also written to DIR/sweep.json.
"""

from __future__ import annotations

from pathlib import Path

from ..analyze.documents.sweep_types import Sweep
from ..attribution import Attribution
from .fits import sweep_json
from .knobs import (
    SCHEMA,
    Knob,
    SweepError,
    bind_command,
    parse_expect,
    parse_knobs,
    parse_point,
)
from .runs import Plan, check_output, execute, load_recorded, measure

__all__ = [
    "SCHEMA",
    "Knob",
    "Plan",
    "SweepError",
    "bind_command",
    "check_output",
    "execute",
    "load_recorded",
    "measure",
    "parse_expect",
    "parse_knobs",
    "parse_point",
    "sweep_dict",
    "sweep_json",
]


def sweep_dict(
    path: str | Path,
    depth: int = 1,
    expect: str | None = None,
    predict: str | None = None,
    top: int = 10,
) -> Sweep:
    """The cudatrace.sweep/1 dict of a recorded sweep directory, fitted again from its traces
    (for reports that chart the laws). Raises SweepError on a directory that is not a sweep."""
    plan, runs = load_recorded(Path(path), Attribution(depth=depth))
    exp = parse_expect(expect, plan.knobs) if expect is not None else None
    point = parse_point(plan.knobs, predict) if predict is not None else None
    return sweep_json(plan, runs, exp, point, predict, top, expect)
