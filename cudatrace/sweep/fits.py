"""The fits of a sweep: a law per series (the peak, each site) in the knob, or a plane over a
grid; the expectation check, the prediction and the budget suggestion; the whole result as the
cudatrace.sweep/1 dict (docs/sweep-json.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, cast

from ..analyze.documents import laws
from ..analyze.documents import sweep_sentences as sentences
from ..analyze.documents.sweep_types import Sweep, SweepPredictionSite, SweepSeries
from ..analyze.read.runfacts import no_driver_sentence
from .knobs import (
    EXPECT_TOLERANCE,
    MARGIN,
    SCHEMA,
    Knob,
    combos,
    text_of,
    value_of,
)
from .records import Measurement, Run
from .runs import Plan

# a series' law: in one knob, classified; over a grid, a plane (None: too few runs)
_AnyLaw = Union[laws.Law, laws.GridLaw, None]


@dataclass
class _Series:
    """One series fitted: its part of the document, and the law it predicts from."""

    doc: SweepSeries  # a SweepSite where it is a site's (its counts)
    law: _AnyLaw


def _series(
    knobs: list[Knob],
    runs: list[Run],
    ys_by_run: list[int | None],
    label: str,
    key: str | None,
    expect: float | Mapping[str, float] | None,
    counts: list[int | None] | None = None,
) -> _Series:
    """One law: the peak or a site. ys_by_run: bytes per run (None: run left out)."""
    inc = [(r, y) for r, y in zip(runs, ys_by_run) if y is not None]
    d: dict[str, Any] = {"label": label, "key": key, "bytes": ys_by_run}
    fitted: _AnyLaw
    # (knob, its slope, where on the grid: "other=value,..." or None)
    growth: list[tuple[Knob, float, str | None]]
    if counts is not None:
        d["count"] = counts
    if len(knobs) == 1:
        k = knobs[0]
        law = laws.classify([k.numbers[r["combo"][0]] for r, _ in inc], [y for _, y in inc])
        d["fit"] = law.affine.as_json() if law.affine is not None else None
        d["law"] = {
            "kind": law.kind,
            "tested": law.tested,
            "detail": law.detail,
            "points": [[x, y] for x, y in law.points],
        }
        if law.power is not None:
            d["law"]["power"] = {
                "coefficient": law.power.coef,
                "exponent": law.power.exponent,
                "r2": law.power.r2,
            }
        d["law"]["text"] = sentences.law_text(d, k.as_json())
        slope = law.affine.slope if law.affine is not None and law.kind != "flat" else 0.0
        fitted = law
        growth = [(k, slope, None)]
    else:
        pts = [tuple(k.numbers[i] for k, i in zip(knobs, r["combo"])) for r, _ in inc]
        g = laws.fit_grid(pts, [y for _, y in inc], [k.key for k in knobs]) if inc else None
        d["fit"] = g.as_json() if g is not None else None
        ys = [y for _, y in inc]
        flat = bool(ys) and (
            max(ys) == min(ys)
            or (
                max(ys) - min(ys) <= laws.REL_TOL * max(abs(y) for y in ys)
                and (g is None or g.r2 < 0.9)
            )
        )
        d["law"] = {
            "kind": "flat" if flat else (g.model if g else "none"),
            "tested": bool(g and g.lsq.dof > 0),
            "points": [list(p) + [y] for p, (_, y) in zip(pts, inc)],
        }
        d["law"]["text"] = sentences.grid_law_text(d, [k.as_json() for k in knobs])
        fitted = g
        growth = []
        if g is not None and not flat:
            for i, k in enumerate(knobs):
                s, at = max((g.partial_slope(i, p), p) for p in pts)
                others = ",".join(
                    f"{o.key}={_show(o, v)}" for j, (o, v) in enumerate(zip(knobs, at)) if j != i
                )
                growth.append((k, s, others))
    d["contradicts_expectation"] = False
    d["expectation"] = None
    worst = None
    for k, s, where in growth:
        e = expect.get(k.key) if isinstance(expect, Mapping) else expect
        if e is None or s <= 0 or s <= e * (1 + EXPECT_TOLERANCE):
            continue
        ratio = s / e if e > 0 else math.inf
        if worst is None or ratio > worst[0]:
            worst = (ratio, k, s, e, where)
    if worst is not None:
        _, k, s, e, where = worst
        d["contradicts_expectation"] = True
        d["expectation"] = sentences.expectation_sentence(label, s, e, k.as_json(), where)
    return _Series(cast(SweepSeries, d), fitted)


def _show(k: Knob, v: float) -> str:
    """A knob's value as the user wrote it, when it is one of the values run."""
    return k.texts[k.numbers.index(v)] if v in k.numbers else f"{v:g}"


def sweep_json(
    plan: Plan,
    runs: list[Run],
    expect: float | Mapping[str, float] | None = None,
    predict: tuple[float, ...] | None = None,
    predict_text: str | None = None,
    top: int = 10,
    expect_text: str | None = None,
) -> Sweep:
    """The sweep: the --json output (docs/sweep-json.md, cudatrace.sweep/1); its type is the
    schema's (analyze/documents/sweep_types.py; tests/unit/test_schemas.py validates what this
    builds). The peak's law and each site's, the runs, the notes, the prediction."""
    knobs = plan.knobs
    included = [r for r in runs if r["included"]]
    peaks = [m["peak_bytes"] if r["included"] and (m := r["measured"]) else None for r in runs]
    peak = _series(knobs, runs, peaks, "peak", None, expect)
    sites = _site_series(knobs, runs, expect)
    shown = [s.doc for i, s in enumerate(sites) if i < top or s.doc["contradicts_expectation"]]
    doc: dict[str, object] = {
        "schema": SCHEMA,
        "cudatrace_version": __import__("cudatrace").__version__,
        "command": list(plan.cmd),
        "directory": str(plan.out),
        "knobs": [k.as_json() for k in knobs],
        "values": [value_of(knobs, r["combo"]) for r in runs],
        "runs": [_run_json(knobs, r) for r in runs],
        "stop": {
            "after": plan.rule.stop_after,
            "url": plan.rule.url,
            "settle": plan.rule.settle if plan.rule.url else None,
            "grace": plan.rule.grace,
        },
        "expect": expect,
        "expect_text": expect_text,
        # a verdict needs a law: with fewer than two runs in the laws there is none
        "expect_checked": None if expect is None else len(included) >= 2,
        "peak": peak.doc,
        "sites": shown,
        "more_sites": len(sites) - len(shown),
        "prediction": None,
        "notes": _notes(knobs, runs),
    }
    if predict is not None:
        doc["prediction"] = _prediction(knobs, included, peak, sites, predict, predict_text)
    return cast(Sweep, doc)


def _site_series(
    knobs: list[Knob], runs: list[Run], expect: float | Mapping[str, float] | None
) -> list[_Series]:
    """Each site's series over the runs (its bytes and count in each, its law), the sites that
    held the most in any run first."""
    keys: dict[tuple[object, ...], _SiteKey] = {}
    measured = [m if r["included"] else None for r in runs for m in [r["measured"]]]
    for m in measured:
        if m is None:
            continue
        for key, s in m["sites"].items():
            e = keys.setdefault(key, _SiteKey(s["label"], s["key"], 0))
            e.max = max(e.max, s["bytes"])
    order = sorted(keys.items(), key=lambda kv: (-kv[1].max, kv[1].label))
    sites = []
    for key, e in order:
        ys = [_site_figure(m, key, "bytes") for m in measured]
        cs = [_site_figure(m, key, "count") for m in measured]
        sites.append(_series(knobs, runs, ys, e.label, e.key, expect, cs))
    return sites


@dataclass
class _SiteKey:
    """A site met in the runs: its names, the most it held in any."""

    label: str
    key: str
    max: int


def _site_figure(
    m: Measurement | None, key: tuple[object, ...], what: Literal["bytes", "count"]
) -> int | None:
    """A site's bytes or count in one run (0: not live at its peak; None: the run is left
    out)."""
    if m is None:
        return None
    s = m["sites"].get(key)
    return s[what] if s is not None else 0


def _run_json(knobs: list[Knob], r: Run) -> dict[str, object]:
    """One run of the sweep: its value, command, how it ended, what it measured."""
    m = r["measured"]
    return {
        "value": value_of(knobs, r["combo"]),
        "text": text_of(knobs, r["combo"]),
        "command": r["command"],
        "directory": r["directory"],
        "output": r["output"],
        "ended": dict(r["ended"], text=sentences.ended_text(r["ended"])),
        "included": r["included"],
        "seconds": r.get("seconds"),
        "peak_bytes": m["peak_bytes"] if m else None,
        "peak_time": m["peak_time"] if m else None,
        "allocs": m["allocs"] if m else None,
        "denied": m["denied"] if m else None,
    }


def _notes(knobs: list[Knob], runs: list[Run]) -> list[str]:
    """What the sweep could not say: runs not done, none that used the driver, no law."""
    included = [r for r in runs if r["included"]]
    notes = []
    planned = len(combos(knobs))
    if len(runs) < planned:
        notes.append("interrupted: %d of %d runs done" % (len(runs), planned))
    unused = _no_driver_note(runs)
    if unused:
        notes.append(unused)
    if len(included) < 2:
        notes.append("fewer than two runs finished well: no law")
    elif not any(m["allocs"] for r in included if (m := r["measured"])) and not unused:
        notes.append(
            "no run allocated device memory through the CUDA driver: did the command use the GPU?"
        )
    return notes


def _no_driver_note(runs: list[Run]) -> str | None:
    """The note of a sweep no run of which used the CUDA driver (None when one did, or none
    could be measured)."""
    measured = [m for r in runs if (m := r.get("measured"))]
    if not measured or any(m.get("driver_used", True) for m in measured):
        return None
    simulated = any(m.get("simulated") for m in measured)
    found = None
    if not simulated:
        from ..record.cudadrv import driver_library

        found = driver_library()
    return no_driver_sentence(found, simulated, "no run", "add --simulated to the sweep")


def _prediction(
    knobs: list[Knob],
    included: list[Run],
    peak: _Series,
    sites: list[_Series],
    point: tuple[float, ...],
    point_text: str | None,
) -> dict[str, object]:
    """--predict: the peak and the top sites at `point`, and a budget with room for it."""
    notes = []
    outside = _outside(knobs, included, point)
    if outside:
        notes.append("extrapolated beyond the values run")
    py, pse, phow = _peak_guess(knobs, peak, sites, point)
    if py is None:
        return {
            "at": point_text,
            "peak": None,
            "sites": [],
            "budget": None,
            "notes": notes + ["no law to predict from"],
        }
    n = len(included)
    if pse is None:
        notes.append(
            "only %d points: a law through them has no uncertainty to give" % n
            if n <= 2
            else "the law has as many terms as points, or is not affine: no uncertainty to give"
        )
    ps: list[SweepPredictionSite] = []
    for s in sites:
        y, se, how = _guess(knobs, s, point)
        key = s.doc["key"]
        if y is None or key is None:  # (a site's series always has its key)
            continue
        ps.append(
            {
                "label": s.doc["label"],
                "key": key,
                "bytes": max(0, round(y)),
                "stderr": se,
                "how": how,
            }
        )
    ps.sort(key=lambda s: -s["bytes"])
    peak_b = max(0, round(py))
    budget = _budget(peak_b, pse, n, included)
    if budget is None:
        notes.append("the prediction is beyond any budget cudatrace takes: no advice")
    return {
        "at": point_text,
        "value": point[0] if len(knobs) == 1 else {k.key: v for k, v in zip(knobs, point)},
        "extrapolated": outside,
        "peak": {"bytes": peak_b, "stderr": pse, "how": phow},
        "sites": ps[:5],
        "budget": budget,
        "notes": notes,
    }


def _outside(knobs: list[Knob], included: list[Run], point: tuple[float, ...]) -> bool:
    """Whether the point lies beyond the values run (an extrapolation)."""
    if len(knobs) == 1:
        xs = [knobs[0].numbers[r["combo"][0]] for r in included]
        return bool(xs) and (point[0] < min(xs) or point[0] > max(xs))
    return any(not (min(k.numbers) <= v <= max(k.numbers)) for k, v in zip(knobs, point))


def _guess(
    knobs: list[Knob], s: _Series, point: tuple[float, ...]
) -> tuple[float | None, float | None, str]:
    """(bytes, standard error or None, how) of one series at the point, from its law (one
    knob's classified law, or a grid's plane)."""
    law = s.law
    if law is None:
        return None, None, "no law"
    if isinstance(law, laws.Law):
        y, se, how = law.predict(point[0])
        if law.kind in ("steps", "powers_of_two"):
            how += " (the law is {}: the estimate may miss a step)".format(
                law.kind.replace("_", " ")
            )
        elif law.kind == "irregular":
            how += " (no simple law: a rough estimate)"
        return y, se, how
    y, se = law.predict(point)
    return y, se, f"{law.model} fit"


def _peak_guess(
    knobs: list[Knob], peak: _Series, sites: list[_Series], point: tuple[float, ...]
) -> tuple[float | None, float | None, str]:
    """The peak at the point: its own law, or, when it has no simple one, the sum of the
    sites' laws (the sites partition the peak)."""
    py, pse, phow = _guess(knobs, peak, point)
    law = peak.law
    if len(knobs) == 1 and isinstance(law, laws.Law) and not law.is_affine and sites:
        got = [_guess(knobs, s, point) for s in sites]
        ys = [y for y, _, _ in got if y is not None]
        if len(ys) == len(got):
            py = sum(max(0.0, y) for y in ys)
            ses = [se for _, se, _ in got if se is not None]
            pse = math.sqrt(sum(se * se for se in ses)) if len(ses) == len(got) else None
            phow = "the sum of the sites' laws"
    return py, pse, phow


def _budget(
    peak_b: int, pse: float | None, n: int, included: list[Run]
) -> dict[str, object] | None:
    """A --budget for the predicted peak: 10% headroom, or 3 standard errors when more, or
    25% without an uncertainty, plus the CUDA contexts the runs held (the budget counts them);
    rounded up to a round step. None when no budget cudatrace takes would hold it."""
    margin = MARGIN * peak_b
    why = "%d%% headroom" % round(100 * MARGIN)
    if pse is not None and 3 * pse > margin:
        margin, why = 3 * pse, "3 standard errors of the prediction"
    if pse is None:
        margin, why = (
            0.25 * peak_b,
            "25%% headroom: %s"
            % ("two points, no uncertainty known" if n <= 2 else "no uncertainty known"),
        )
    # the budget counts each member's CUDA context (NVML's figure for the process beyond its
    # allocations, docs/budgets.md): the advice holds the most any run was seen to need so. The
    # shim's own measurement is the budget's figure (CUDATRACE_RECORD_CONTEXTS); the launcher's
    # samples stand in where it has none (a short run falls between two samples)
    found = [_context_of(m) for r in included if (m := r.get("measured"))]
    ctxs = [c for c in found if c is not None]
    ctx = max(ctxs) if ctxs else None
    want = peak_b + margin + (ctx or 0)
    step = _round_step(want)
    budget = max(step, int(math.ceil(want / step) * step))
    spec = sentences.size_spec(budget)
    if not _accepted(spec):
        return None
    if ctx is None:
        ctx_text = (
            "CUDA contexts and module images were not measured (NVML listed no process of the "
            "runs); the budget counts them (hundreds of MiB per process): add them"
        )
    else:
        ctx_text = (
            f"it includes {sentences.readable(ctx)} of CUDA context and module images the runs held "
            "beyond their allocations (NVML), which the budget counts"
        )
    return {
        "bytes": budget,
        "spec": spec,
        "context_bytes": ctx,
        "reason": f"the predicted traced peak {sentences.readable(peak_b)} + {sentences.readable(margin)} "
        f"({why}) + contexts, rounded up to a multiple of {sentences.readable(step)}; {ctx_text}",
    }


def _context_of(measured: Measurement) -> int | None:
    """A run's CUDA contexts as a budget counts them: the shim's figure, else NVML's samples'."""
    c = measured.get("context_bytes")
    return c if c is not None else measured.get("untraced_bytes")


def _accepted(spec: str) -> bool:
    """Whether `--budget spec` is one cudatrace takes (every advised number must be)."""
    from ..record.budget import BudgetError, parse_budget

    try:
        parse_budget(spec)
    except BudgetError:
        return False
    return True


def _round_step(v: float) -> int:
    """A round step a little under an eighth of v: 1 MiB at least, powers of two."""
    step = 1 << 20
    while step * 16 <= v:
        step <<= 1
    return step
