"""The runs of a sweep: the plan, each run launched and traced into its directory, how it
ended, what it measured (the peak and the sites at it, as `report` attributes them); and a
recorded sweep read back from its sweep.json and traces."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from .. import settings, tracedir
from ..analyze.documents.analysis import Analysis
from ..analyze.read.load import ReportError
from ..analyze.read.runfacts import driver_used
from ..attribution import Attribution
from ..symbols import Symbolizer
from .knobs import SCHEMA, Knob, SweepError, combos, run_name, substitute
from .records import Ended, MeasuredSite, Measurement, Run
from .stop import StopRule, Watcher


@dataclass
class Plan:
    knobs: list[Knob]
    cmd: list[str]
    out: Path
    rule: StopRule = field(default_factory=StopRule)
    # the keywords of record.launcher.RunOptions (the command line's RunSettings.as_dict())
    run_options: dict[str, Any] = field(default_factory=dict)
    force: bool = False
    attribution: Attribution = Attribution()  # of every run's sites (its depth included)

    def runs(self) -> list[tuple[int, ...]]:
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


def measure(
    path: Path, attribution: Attribution = Attribution(), symbolizer: Symbolizer | None = None
) -> tuple[Measurement, Symbolizer | None]:
    """(measurement, symbolizer) of one traced run: the peak and the sites live at it, as
    `report` attributes them (sites keyed as `diff` matches them)."""
    a = Analysis(path, attribution, symbolizer=symbolizer)
    m = a.model
    # what NVML saw the tree hold beyond the traced allocations (CUDA contexts, module
    # images): a budget counts it, so advice must include it (None: NVML listed no process).
    # The launcher's samples miss a short run; the shim's own measurement (the figure a budget
    # counts, recorded by each process: CUDATRACE_RECORD_CONTEXTS) does not
    obs = a.observed.compare(m.peak_ts, m.bytes_max, a.start_ns, ends=a.process_ends())
    untraced = (obs.get("max") or {}).get("untraced_max_bytes")
    contexts = a.budget_contexts()
    sites = _peak_sites(a, attribution.depth)
    return {
        "peak_bytes": m.peak_bytes,
        "peak_time": a.seconds(m.peak_ts) if m.found else None,
        "end_bytes": m.end_bytes,
        "allocs": m.counts.get("allocs", 0),
        "denied": m.counts.get("denied", 0),
        "failed": m.counts.get("failed", 0),
        "processes": len(a.traces),
        "untraced_bytes": max(0, untraced) if isinstance(untraced, int) else None,
        "context_bytes": max(contexts.values()) if contexts else None,
        "sites": sites,
        "driver_used": driver_used(a.traces),
        "simulated": bool(a.td.run.get("simulated")),
    }, a.symbolizer


def _peak_sites(a: Analysis, depth: int) -> dict[tuple[object, ...], MeasuredSite]:
    """The sites live at a run's peak, keyed as `diff` matches them: what a law is fitted on."""
    return {
        s.key: {
            "label": s.label(a.full_names),
            "key": s.key_text(),
            "bytes": s.bytes,
            "count": s.count,
        }
        for s in a.sites(a.model.groups_at_peak(), "site", depth)
    }


def attribute_together(runs: list[Run], attribution: Attribution) -> None:
    """One attribution across the sweep's runs, as `diff` builds one call graph from both of
    its runs: the allocator layers are recognized from every measured run's stacks together,
    then each run's sites are measured again with them, so a law is named by the responsible
    code even where one run alone would not decide it (docs/attribution.md)."""
    from ..analyze.sites.layers import CallGraph

    measured = [(r["directory"], m) for r in runs if (m := r.get("measured"))]
    if len(measured) < 2 or not attribution.fold:
        return
    graph, sym = CallGraph(), None
    try:
        for d, _ in measured:  # one run at a time: the graph keeps names, not the runs
            a = Analysis(Path(d), attribution, symbolizer=sym, graph=graph)
            a.stacks.learn(a.model.allocation_stacks())
            sym = a.symbolizer
        for d, m in measured:
            a = Analysis(Path(d), attribution, symbolizer=sym, graph=graph)
            a.stacks.set_source(None)
            m["sites"] = _peak_sites(a, attribution.depth)
    except ReportError:
        return  # a run that cannot be read again keeps its own attribution


def execute(plan: Plan, progress: Callable[[int, int, Run], None] | None = None) -> list[Run]:
    """Run every value (the product of a grid), each traced into its directory; how each ended
    and what it measured. progress(index, total, run) is called after each run."""
    plan.out.mkdir(parents=True, exist_ok=True)
    todo = plan.runs()
    runs: list[Run] = []
    held = _Held()  # one symbolizer for every run: its caches carry over
    for n, combo in enumerate(todo, 1):
        rec, started, status, interrupted = _launch(plan, n - 1, combo)
        if started and rec["ended"]["how"] != "interrupted":
            _measure_into(rec, plan, status, held)
        _judge(rec, status)
        runs.append(rec)
        if progress is not None:
            progress(n, len(todo), rec)
        if interrupted:
            break
    attribute_together(runs, plan.attribution)
    return runs


@dataclass
class _Held:
    symbolizer: Symbolizer | None = None


def _launch(
    plan: Plan, index: int, combo: tuple[int, ...]
) -> tuple[Run, bool, int | None, list[int]]:
    """Launch one run into its directory, quiet, its output into output.log, stopped by the
    plan's rule: (its record with how it ended, whether it started, its exit status, the
    signals that interrupted the sweep)."""
    from ..record.launcher import LaunchError, RunOptions
    from ..record.launcher import run as launch

    cmd = substitute(plan.cmd, plan.knobs, combo)
    d = plan.out / run_name(plan.knobs, combo)
    d.mkdir(parents=True, exist_ok=True)
    log = d / "output.log"
    done = threading.Event()
    holder: dict[str, Watcher] = {}

    def on_start(proc: subprocess.Popen[bytes], out: Path | None) -> None:
        if plan.rule.active and out is not None:
            w = holder["w"] = Watcher(proc, out, plan.rule, done)
            w.start()

    # quiet launcher, but the shim's budget lines go to the run's log: they say why it failed;
    # each process records its CUDA contexts as a budget counts them (the advice adds them)
    opts = RunOptions(
        cmd=cmd,
        out_dir=d,
        quiet=True,
        force=True,
        on_start=on_start,
        extra_env=settings.environment(QUIET=False, RECORD_CONTEXTS=True),
        **plan.run_options,
    )
    t0 = time.monotonic()
    status = None
    ended: Ended | None = None
    with open(log, "wb") as f:
        opts.stdout = opts.stderr = f
        try:
            status, _ = launch(opts)
        except LaunchError as e:
            ended = {"how": "not_started", "why": str(e), "status": e.status}
        finally:
            done.set()
            if "w" in holder:
                holder["w"].join()
    seconds = round(time.monotonic() - t0, 3)
    stopped = holder["w"].info if "w" in holder else None
    interrupted = [
        s
        for s in opts.signals
        if s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    ]
    started = ended is None
    if ended is None:
        assert status is not None  # launch returned (a LaunchError set "ended")
        returncode = _run_info(d).get("returncode")
        ended = _ended(
            status, stopped, interrupted, returncode if isinstance(returncode, int) else None
        )
    rec: Run = {
        "index": index,
        "combo": combo,
        "command": cmd,
        "directory": str(d),
        "output": str(log),
        "ended": ended,
        "included": False,
        "measured": None,
        "seconds": seconds,
    }
    return rec, started, status, interrupted


def _measure_into(rec: Run, plan: Plan, status: int | None, held: _Held) -> None:
    """The run's measurement, or why there is none (no readable trace)."""
    try:
        rec["measured"], held.symbolizer = measure(
            Path(rec["directory"]), plan.attribution, held.symbolizer
        )
    except ReportError as e:
        rec["ended"] = {"how": "no_trace", "status": status, "why": str(e)}


def _judge(rec: Run, status: int | None) -> None:
    """Whether the run enters the laws; a run failed under its budget says so with the shim's
    line, any other left-out run with the last line of its output."""
    d, log = Path(rec["directory"]), Path(rec["output"])
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
    if not rec["included"] and how not in ("not_started",) and "message" not in rec["ended"]:
        rec["ended"]["message"] = _last_line(log)


def _run_info(d: Path) -> dict[str, object]:
    try:
        got = json.loads((d / tracedir.RUN).read_text())
        return cast("dict[str, object]", got) if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def _aborted(d: Path) -> bool:
    return bool(_run_info(d).get("budget_aborted"))


def _ended(
    status: int,
    stopped: Ended | None,
    interrupted: list[int],
    returncode: int | None = None,
) -> Ended:
    if interrupted:
        return {
            "how": "interrupted",
            "status": status,
            "signal": signal.Signals(interrupted[0]).name,
        }
    if stopped is not None:
        e = stopped.copy()
        e["status"] = status
        return e
    if isinstance(returncode, int) and returncode < 0:
        return {"how": "signaled", "status": status, "signal": _signal_name(status)}
    return {"how": "exited", "status": status}


def load_recorded(path: Path, attribution: Attribution = Attribution()) -> tuple[Plan, list[Run]]:
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
        attribution=attribution,
    )
    runs: list[Run] = []
    sym: Symbolizer | None = None
    for i, r in enumerate(doc["runs"]):
        combo: tuple[int, ...]
        if len(knobs) == 1:
            combo = (knobs[0].texts.index(r["text"]),)
        else:
            parts = dict(p.split("=", 1) for p in r["text"].split(","))
            combo = tuple(k.texts.index(parts[k.key]) for k in knobs)
        # only beside this sweep.json: a copy never reads the original's runs (another sweep's
        # data in the laws); a run missing here is said so and left out
        d = plan.out / Path(r["directory"]).name
        missing = not d.is_dir()
        ended = cast(Ended, {k: v for k, v in r["ended"].items() if k != "text"})
        rec: Run = {
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
        if missing and r.get("peak_bytes") is not None:
            rec["ended"] = {
                "how": "no_trace",
                "status": ended.get("status"),
                "why": f"its directory {d.name} is not beside {f.name} in {plan.out}",
            }
            rec["included"] = False
        elif r.get("peak_bytes") is not None:
            try:
                rec["measured"], sym = measure(d, attribution, sym)
            except ReportError as e:
                rec["ended"] = {
                    "how": "no_trace",
                    "status": ended.get("status"),
                    "why": str(e),
                }
                rec["included"] = False
        runs.append(rec)
    attribute_together(runs, attribution)
    return plan, runs
