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
run's peak and a law in the knob (analyze/laws.py). `sweep_json` returns the whole result as
the dict of `--json` (schema cudatrace.sweep/1, docs/sweep-json.md); the text is rendered from
that dict (present/sweep.py). The dict is also written to DIR/sweep.json.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import tracedir
from ..analyze import laws
from ..analyze.analysis import Analysis, ReportError
from .knobs import (  # noqa: F401
    Knob,
    SweepError,
    _text_of,
    _value_of,
    bind_command,
    combos,
    parse_expect,
    parse_knobs,
    parse_point,
    parse_value,
    run_name,
    substitute,
)
from .stop import StopRule, Watcher, _tree, live_bytes, url_answers  # noqa: F401

SCHEMA = "cudatrace.sweep/1"
MARGIN = 0.10  # the budget suggestion's headroom over the predicted peak
EXPECT_TOLERANCE = 0.10  # --expect: flag what grows more than 10% faster


@dataclass
class Plan:
    knobs: list[Knob]
    cmd: list[str]
    out: Path
    rule: StopRule = field(default_factory=StopRule)
    run_options: dict = field(default_factory=dict)
    force: bool = False
    depth: int = 1
    attribution: dict = field(default_factory=dict)  # Analysis keywords (fold, view ...)

    def runs(self) -> list[tuple]:
        return combos(self.knobs)


def check_output(plan: Plan) -> None:
    """Refuse to overwrite an earlier sweep (or any trace) without --force; nothing is lost."""
    if plan.out.exists() and not plan.out.is_dir():
        raise SweepError(f"{plan.out} exists and is not a directory")
    if plan.force:
        return
    old = [plan.out / "sweep.json"] if (plan.out / "sweep.json").exists() else []
    for combo in plan.runs():
        d = plan.out / run_name(plan.knobs, combo)
        if d.is_dir() and (list(d.glob("*.ctrace")) or (d / tracedir.RUN).exists()):
            old.append(d)
    if old:
        raise SweepError(
            f"{plan.out} already holds a sweep ({old[0].name}); pass --force to replace "
            "it, or -o another directory"
        )


def _signal_name(status: int) -> str:
    """The signal of an exit status 128+N."""
    try:
        return signal.Signals(status - 128).name
    except ValueError:
        return "signal %d" % (status - 128)


def _budget_line(log: Path) -> str | None:
    try:
        with open(log, "rb") as f:
            for raw in f:
                line = raw.decode(errors="replace").strip()
                if "cudatrace: budget exceeded" in line:
                    return line
    except OSError:
        pass
    return None


def _last_line(log: Path) -> str | None:
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = [l.strip() for l in f.read().decode(errors="replace").splitlines() if l.strip()]
        return lines[-1][:300] if lines else None
    except OSError:
        return None


def measure(path: Path, depth: int, symbolizer=None, attribution: dict | None = None):
    """(measurement, symbolizer) of one traced run: the peak and the sites live at it, as
    `report` attributes them (sites keyed as `diff` matches them); `attribution`: keywords
    of Analysis (fold, view, ...)."""
    a = Analysis(path, symbolizer=symbolizer, **(attribution or {}))
    m = a.model
    sites = {}
    for s in a.sites(m.groups_at_peak(), "site", depth):
        sites[s.key] = {"label": s.label(), "key": s.key_text(), "bytes": s.bytes, "count": s.count}
    return {
        "peak_bytes": m.peak_bytes,
        "peak_time": a.seconds(m.peak_ts) if m.found else None,
        "end_bytes": m.end_bytes,
        "allocs": m.counts.get("allocs", 0),
        "denied": m.counts.get("denied", 0),
        "failed": m.counts.get("failed", 0),
        "processes": len(a.traces),
        "sites": sites,
    }, a.symbolizer


def attribute_together(runs: list[dict], depth: int, attribution: dict | None = None) -> None:
    """One attribution across the sweep's runs, as `diff` builds one call graph from both of
    its runs: the allocator layers are recognized from every measured run's stacks together,
    then each run's sites are measured again with them, so a law is named by the responsible
    code even where one run alone would not decide it (docs/attribution.md)."""
    from ..analyze.layers import CallGraph

    measured = [r for r in runs if r.get("measured")]
    opts = dict(attribution or {})
    if len(measured) < 2 or opts.get("fold_layers") is False:
        return
    graph, sym = CallGraph(), None
    try:
        for r in measured:  # one run at a time: the graph keeps names, not the runs
            a = Analysis(Path(r["directory"]), symbolizer=sym, graph=graph, **opts)
            a.stacks.learn(a.allocation_stacks())
            sym = a.symbolizer
        for r in measured:
            a = Analysis(Path(r["directory"]), symbolizer=sym, graph=graph, **opts)
            a.stacks.set_source(None)
            r["measured"]["sites"] = {
                s.key: {"label": s.label(), "key": s.key_text(), "bytes": s.bytes, "count": s.count}
                for s in a.sites(a.model.groups_at_peak(), "site", depth)
            }
    except ReportError:
        return  # a run that cannot be read again keeps its own attribution


def execute(plan: Plan, progress=None) -> list[dict]:
    """Run every value (the product of a grid), each traced into its directory; how each ended
    and what it measured. progress(index, total, run) is called after each run."""
    from ..record.launcher import LaunchError, RunOptions
    from ..record.launcher import run as launch

    plan.out.mkdir(parents=True, exist_ok=True)
    todo = plan.runs()
    runs: list[dict] = []
    symbolizer = None
    for n, combo in enumerate(todo, 1):
        cmd = substitute(plan.cmd, plan.knobs, combo)
        d = plan.out / run_name(plan.knobs, combo)
        d.mkdir(parents=True, exist_ok=True)
        log = d / "output.log"
        rec = {
            "index": n - 1,
            "combo": combo,
            "command": cmd,
            "directory": str(d),
            "output": str(log),
            "ended": None,
            "included": False,
            "measured": None,
        }
        done = threading.Event()
        holder: dict = {}

        def on_start(proc, out, holder=holder, done=done):
            if plan.rule.active:
                w = holder["w"] = Watcher(proc, out, plan.rule, done)
                w.start()

        # quiet launcher, but the shim's budget lines go to the run's log: they say why it failed
        opts = RunOptions(
            cmd=cmd,
            out_dir=d,
            quiet=True,
            force=True,
            on_start=on_start,
            extra_env={"CUDATRACE_QUIET": "0"},
            **plan.run_options,
        )
        t0 = time.monotonic()
        status = None
        with open(log, "wb") as f:
            opts.stdout = opts.stderr = f
            try:
                status, _ = launch(opts)
            except LaunchError as e:
                rec["ended"] = {"how": "not_started", "why": str(e), "status": e.status}
            finally:
                done.set()
                if "w" in holder:
                    holder["w"].join()
        rec["seconds"] = round(time.monotonic() - t0, 3)
        stopped = holder["w"].info if "w" in holder else None
        interrupted = [
            s
            for s in opts.signals
            if s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
        ]
        if rec["ended"] is None:
            rec["ended"] = _ended(status, stopped, interrupted, _run_info(d).get("returncode"))
            if rec["ended"]["how"] != "interrupted":
                try:
                    rec["measured"], symbolizer = measure(
                        d, plan.depth, symbolizer, plan.attribution
                    )
                except ReportError as e:
                    rec["ended"] = {
                        "how": "no_trace",
                        "status": status,
                        "why": str(e),
                    }
        meas = rec["measured"]
        if meas is not None and (meas["denied"] or _aborted(d)):
            rec["ended"] = {
                "how": "failed_under_budget",
                "status": status,
                "denied": meas["denied"],
                "message": _budget_line(log),
            }
        how = rec["ended"]["how"]
        rec["included"] = how in ("stopped", "killed") or (how == "exited" and status == 0)
        if (
            not rec["included"]
            and rec["ended"]["how"] not in ("not_started",)
            and "message" not in rec["ended"]
        ):
            rec["ended"]["message"] = _last_line(log)
        runs.append(rec)
        if progress is not None:
            progress(n, len(todo), rec)
        if interrupted:
            break
    attribute_together(runs, plan.depth, plan.attribution)
    return runs


def _run_info(d: Path) -> dict:
    try:
        got = json.loads((d / tracedir.RUN).read_text())
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def _aborted(d: Path) -> bool:
    return bool(_run_info(d).get("budget_aborted"))


def _ended(status: int, stopped: dict | None, interrupted: list, returncode=None) -> dict:
    if interrupted:
        return {
            "how": "interrupted",
            "status": status,
            "signal": signal.Signals(interrupted[0]).name,
        }
    if stopped is not None:
        e = dict(stopped)
        e["status"] = status
        return e
    if isinstance(returncode, int) and returncode < 0:
        return {"how": "signaled", "status": status, "signal": _signal_name(status)}
    return {"how": "exited", "status": status}


# ---- the result as data ----------------------------------------------------------------------


def _series(knobs, runs, ys_by_run: list, label: str, key: str | None, expect, counts=None):
    """One law: the peak or a site. ys_by_run: bytes per run (None: run left out)."""
    from ..present import sweep as text

    inc = [(r, y) for r, y in zip(runs, ys_by_run) if y is not None]
    d = {"label": label, "key": key, "bytes": ys_by_run}
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
        d["law"]["text"] = text.law_text(d, k.as_json())
        slope = law.affine.slope if law.affine is not None and law.kind != "flat" else 0.0
        d["_law"] = law
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
        d["law"]["text"] = text.grid_law_text(d, [k.as_json() for k in knobs])
        d["_law"] = g
        growth = []
        if g is not None and not flat:
            for i, k in enumerate(knobs):
                s, at = max((g.partial_slope(i, p), p) for p in pts)
                where = ",".join(
                    f"{o.key}={_show(o, v)}" for j, (o, v) in enumerate(zip(knobs, at)) if j != i
                )
                growth.append((k, s, where))
    d["contradicts_expectation"] = False
    d["expectation"] = None
    worst = None
    for k, s, where in growth:
        e = expect.get(k.key) if isinstance(expect, dict) else expect
        if e is None or s <= 0 or s <= e * (1 + EXPECT_TOLERANCE):
            continue
        ratio = s / e if e > 0 else math.inf
        if worst is None or ratio > worst[0]:
            worst = (ratio, k, s, e, where)
    if worst is not None:
        _, k, s, e, where = worst
        d["contradicts_expectation"] = True
        d["expectation"] = text.expectation_sentence(label, s, e, k.as_json(), where)
    return d


def _show(k: Knob, v) -> str:
    """A knob's value as the user wrote it, when it is one of the values run."""
    return k.texts[k.numbers.index(v)] if v in k.numbers else f"{v:g}"


def sweep_json(
    plan: Plan,
    runs: list[dict],
    expect: float | dict | None = None,
    predict: tuple | None = None,
    predict_text: str | None = None,
    top: int = 10,
    expect_text: str | None = None,
) -> dict:
    """The sweep as a dict: the --json output (docs/sweep-json.md, cudatrace.sweep/1)."""
    from ..present import sweep as text

    knobs = plan.knobs
    included = [r for r in runs if r["included"]]
    peaks = [r["measured"]["peak_bytes"] if r["included"] else None for r in runs]
    peak = _series(knobs, runs, peaks, "peak", None, expect)
    keys: dict = {}
    for r in included:
        for key, s in r["measured"]["sites"].items():
            e = keys.setdefault(key, {"label": s["label"], "key": s["key"], "max": 0})
            e["max"] = max(e["max"], s["bytes"])
    order = sorted(keys.items(), key=lambda kv: (-kv[1]["max"], kv[1]["label"]))
    sites = []
    for key, e in order:
        ys = [
            r["measured"]["sites"].get(key, {}).get("bytes", 0) if r["included"] else None
            for r in runs
        ]
        cs = [
            r["measured"]["sites"].get(key, {}).get("count", 0) if r["included"] else None
            for r in runs
        ]
        sites.append(_series(knobs, runs, ys, e["label"], e["key"], expect, cs))
    shown = [s for i, s in enumerate(sites) if i < top or s["contradicts_expectation"]]
    doc = {
        "schema": SCHEMA,
        "cudatrace_version": __import__("cudatrace").__version__,
        "command": list(plan.cmd),
        "directory": str(plan.out),
        "knobs": [k.as_json() for k in knobs],
        "values": [_value_of(knobs, r["combo"]) for r in runs],
        "runs": [
            {
                "value": _value_of(knobs, r["combo"]),
                "text": _text_of(knobs, r["combo"]),
                "command": r["command"],
                "directory": r["directory"],
                "output": r["output"],
                "ended": dict(r["ended"], text=text.ended_text(r["ended"])),
                "included": r["included"],
                "seconds": r.get("seconds"),
                "peak_bytes": r["measured"]["peak_bytes"] if r["measured"] else None,
                "peak_time": r["measured"]["peak_time"] if r["measured"] else None,
                "allocs": r["measured"]["allocs"] if r["measured"] else None,
                "denied": r["measured"]["denied"] if r["measured"] else None,
            }
            for r in runs
        ],
        "stop": {
            "after": plan.rule.stop_after,
            "url": plan.rule.url,
            "settle": plan.rule.settle if plan.rule.url else None,
            "grace": plan.rule.grace,
        },
        "expect": expect,
        "expect_text": expect_text,
        "peak": peak,
        "sites": shown,
        "more_sites": len(sites) - len(shown),
        "prediction": None,
        "notes": [],
    }
    planned = len(combos(knobs))
    if len(runs) < planned:
        doc["notes"].append("interrupted: %d of %d runs done" % (len(runs), planned))
    if len(included) < 2:
        doc["notes"].append("fewer than two runs finished well: no law")
    elif not any(r["measured"]["allocs"] for r in included):
        doc["notes"].append(
            "no run allocated device memory through the CUDA driver: did the command use the GPU?"
        )
    if predict is not None:
        doc["prediction"] = _prediction(knobs, included, peak, sites, predict, predict_text)
    for s in [peak] + sites:
        s.pop("_law", None)
    return doc


def _prediction(knobs, included, peak, sites, point, point_text) -> dict:
    from ..present import sweep as text

    notes = []
    if len(knobs) == 1:
        xs = [knobs[0].numbers[r["combo"][0]] for r in included]
        at = point[0]
        outside = bool(xs) and (at < min(xs) or at > max(xs))
    else:
        outside = any(not (min(k.numbers) <= v <= max(k.numbers)) for k, v in zip(knobs, point))
    if outside:
        notes.append("extrapolated beyond the values run")

    def guess(s):
        law = s.get("_law")
        if law is None:
            return None, None, "no law"
        if len(knobs) == 1:
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

    py, pse, phow = guess(peak)
    law = peak.get("_law")
    if len(knobs) == 1 and law is not None and not law.is_affine and sites:
        # the sites partition the peak: when the peak has no simple law, their laws add up
        got = [guess(s) for s in sites]
        if all(y is not None for y, _, _ in got):
            py = sum(max(0.0, y) for y, _, _ in got)
            ses = [se for _, se, _ in got]
            pse = (
                math.sqrt(sum(se * se for se in ses)) if all(se is not None for se in ses) else None
            )
            phow = "the sum of the sites' laws"
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
    ps = []
    for s in sites:
        y, se, how = guess(s)
        if y is None:
            continue
        ps.append(
            {
                "label": s["label"],
                "key": s["key"],
                "bytes": max(0, round(y)),
                "stderr": se,
                "how": how,
            }
        )
    ps.sort(key=lambda s: -s["bytes"])
    peak_b = max(0, round(py))
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
    want = peak_b + margin
    step = _round_step(want)
    budget = int(math.ceil(want / step) * step) if want > 0 else 0
    return {
        "at": point_text,
        "value": point[0] if len(knobs) == 1 else {k.key: v for k, v in zip(knobs, point)},
        "extrapolated": outside,
        "peak": {"bytes": peak_b, "stderr": pse, "how": phow},
        "sites": ps[:5],
        "budget": {
            "bytes": budget,
            "spec": text.size_spec(budget),
            "reason": f"the predicted traced peak {text.readable(peak_b)} + {text.readable(margin)} ({why}), rounded up to a multiple "
            f"of {text.readable(step)}; CUDA contexts and module images (hundreds of MiB per process) are "
            "not counted by the budget but take memory on the box: leave them room too",
        },
        "notes": notes,
    }


def _round_step(v: float) -> int:
    """A round step a little under an eighth of v: 1 MiB at least, powers of two."""
    step = 1 << 20
    while step * 16 <= v:
        step <<= 1
    return step


def load_recorded(
    path: Path, depth: int = 1, attribution: dict | None = None
) -> tuple[Plan, list[dict]]:
    """A recorded sweep (DIR or DIR/sweep.json) measured again from its traces: the same runs
    and how they ended, with this version's attribution (and --depth) and laws."""
    f = path / "sweep.json" if path.is_dir() else path
    try:
        doc = json.loads(f.read_text())
    except OSError as e:
        raise SweepError(f"--from {path}: {e.strerror or e}") from None
    except ValueError:
        raise SweepError(f"--from {path}: {f} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise SweepError(f"--from {path}: {f} is not a sweep ({SCHEMA})")
    knobs = [
        Knob(k["placeholder"][1:-1], list(k["values"]), list(k["numbers"]), k["unit"], k["flag"])
        for k in doc["knobs"]
    ]
    st = doc.get("stop") or {}
    plan = Plan(
        knobs,
        list(doc["command"]),
        f.parent.resolve(),
        StopRule(st.get("after"), st.get("url"), st.get("settle") or 2.0, st.get("grace") or 10.0),
        depth=depth,
    )
    runs, sym = [], None
    for i, r in enumerate(doc["runs"]):
        if len(knobs) == 1:
            combo = (knobs[0].texts.index(r["text"]),)
        else:
            parts = dict(p.split("=", 1) for p in r["text"].split(","))
            combo = tuple(k.texts.index(parts[k.key]) for k in knobs)
        d = plan.out / Path(r["directory"]).name  # beside sweep.json, if moved with it
        if not d.is_dir():
            d = Path(r["directory"])
        ended = {k: v for k, v in r["ended"].items() if k != "text"}
        rec = {
            "index": i,
            "combo": combo,
            "command": r["command"],
            "directory": str(d),
            "output": str(d / "output.log"),
            "ended": ended,
            "included": r["included"],
            "seconds": r.get("seconds"),
            "measured": None,
        }
        if r.get("peak_bytes") is not None:
            try:
                rec["measured"], sym = measure(d, depth, sym, attribution)
            except ReportError as e:
                rec["ended"] = {
                    "how": "no_trace",
                    "status": ended.get("status"),
                    "why": str(e),
                }
                rec["included"] = False
        runs.append(rec)
    attribute_together(runs, depth, attribution)
    return plan, runs


def sweep_dict(
    path, depth: int = 1, expect: str | None = None, predict: str | None = None, top: int = 10
) -> dict:
    """The cudatrace.sweep/1 dict of a recorded sweep directory, fitted again from its traces
    (for reports that chart the laws). Raises SweepError on a directory that is not a sweep."""
    plan, runs = load_recorded(Path(path), depth)
    exp = parse_expect(expect, plan.knobs) if expect is not None else None
    point = parse_point(plan.knobs, predict) if predict is not None else None
    return sweep_json(plan, runs, exp, point, predict, top, expect)
