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

import itertools
import json
import math
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .analyze import laws
from .budget import BudgetError, parse_size
from .report import Analysis, ReportError, parse_time

SCHEMA = "cudatrace.sweep/1"
MARGIN = 0.10             # the budget suggestion's headroom over the predicted peak
EXPECT_TOLERANCE = 0.10   # --expect: flag what grows more than 10% faster


class SweepError(Exception):
    """Bad input: exit status 2, nothing run."""
    status = 2


# ---- the knobs -------------------------------------------------------------------------------

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUM_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@dataclass
class Knob:
    name: str                    # "" for the one unnamed list ({})
    texts: list[str]
    numbers: list                # int or float; bytes when unit == "bytes"
    unit: str | None = None      # "bytes" when the values are sizes (512MiB)
    flag: str | None = None      # the option the placeholder is the value of, if any

    @property
    def placeholder(self) -> str:
        return "{%s}" % self.name

    @property
    def label(self) -> str:
        """How the knob is named in sentences: its flag, else its placeholder."""
        return self.flag or (self.placeholder if self.name else "the value")

    @property
    def key(self) -> str:
        """Its name in the JSON's value objects and directory names."""
        if self.name:
            return self.name
        return self.flag.lstrip("-") if self.flag else "value"

    def noun(self) -> str | None:
        """'block' for --num-blocks, 'layer' for --layers: what one unit of the knob is."""
        if self.unit or not self.flag:
            return None
        words = [w for w in re.split(r"[-_]+", self.flag.lstrip("-").lower()) if w]
        if len(words) >= 2 and words[0] in ("num", "n", "number", "nr") and words[1] != "of":
            words = words[1:]
        elif len(words) >= 3 and words[:2] == ["number", "of"]:
            words = words[2:]
        elif len(words) == 2 and words[1] == "count":
            return words[0]
        elif len(words) != 1:
            return None
        if len(words) != 1 or not words[0].isalpha() or not words[0].endswith("s") or \
                words[0].endswith(("ss", "us", "is")) or len(words[0]) < 4:
            return None
        w = words[0]
        if w.endswith(("ches", "shes", "xes", "sses")):
            return w[:-2]
        return w[:-1]

    def as_json(self) -> dict:
        return {"name": self.key, "placeholder": self.placeholder, "flag": self.flag,
                "unit": self.unit, "noun": self.noun(), "values": list(self.texts),
                "numbers": list(self.numbers)}


def parse_value(text: str):
    """(number, is_size): '64' -> (64, False), '1.5' -> (1.5, False), '512MiB' -> (bytes, True)."""
    t = text.strip()
    if _NUM_RE.match(t):
        v = float(t)
        return (int(v) if v == int(v) and "." not in t and "e" not in t.lower() else v), False
    try:
        return parse_size(t), True
    except BudgetError as e:
        raise SweepError("%r is not a number or a size (512MiB, 1.5GiB): %s" % (t, e.why))


def parse_knobs(specs) -> list[Knob]:
    """--values V1,V2,... (one unnamed list, placeholder {}) or NAME=V1,V2 (several: a grid)."""
    if not specs:
        raise SweepError("cudatrace sweep: --values is required (--values 1,2,4, or "
                         "--values a=1,2 --values b=8,16 for a grid)")
    knobs: list[Knob] = []
    for spec in specs:
        name, _, body = spec.partition("=") if re.match(r"^\s*[A-Za-z_]\w*\s*=", spec) \
            else ("", "", spec)
        name = name.strip()
        if name and not _NAME_RE.match(name):
            raise SweepError("cudatrace sweep: --values %s: %r is not a knob name (letters, "
                             "digits, _)" % (spec, name))
        items = [x.strip() for x in body.split(",")]
        if not body.strip() or any(not x for x in items):
            raise SweepError("cudatrace sweep: --values %s: an empty value (write V1,V2,...)"
                             % spec)
        if len(items) < 2:
            raise SweepError("cudatrace sweep: --values %s: one value gives no law; give at least "
                             "two (three to test the law)" % spec)
        parsed = []
        for x in items:
            try:
                parsed.append(parse_value(x))
            except SweepError as e:
                raise SweepError("cudatrace sweep: --values %s: %s" % (spec, e))
        sizes = {s for (v, s) in parsed if not (v == 0 and not s)}
        if len(sizes) > 1:
            raise SweepError("cudatrace sweep: --values %s mixes sizes (512MiB) and plain numbers; "
                             "write every value with its unit" % spec)
        nums = [v for v, _ in parsed]
        seen = set()
        for x, v in zip(items, nums):
            if v in seen:
                raise SweepError("cudatrace sweep: --values %s: %s is repeated" % (spec, x))
            seen.add(v)
        knobs.append(Knob(name, items, nums, "bytes" if sizes == {True} else None))
    unnamed = [k for k in knobs if not k.name]
    if unnamed and len(knobs) > 1:
        if len(unnamed) == len(knobs):
            raise SweepError("cudatrace sweep: %d unnamed --values lists: name each knob "
                             "(--values a=1,2 --values b=8,16) and write {a} and {b} in the "
                             "command" % len(knobs))
        raise SweepError("cudatrace sweep: give either one unnamed --values list (for {}) or "
                         "named lists (a=1,2 for {a}), not both")
    names = [k.name for k in knobs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SweepError("cudatrace sweep: --values %s=... given twice" % sorted(dup)[0])
    return knobs


def bind_command(knobs: list[Knob], cmd: list[str]) -> None:
    """Check the placeholders against the command and find each knob's flag."""
    if not cmd:
        raise SweepError("cudatrace sweep: no command: "
                         "cudatrace sweep --values 1,2,4 -- CMD ... {}")
    for k in knobs:
        where = [i for i, a in enumerate(cmd) if k.placeholder in a]
        if not where:
            if k.name:
                raise SweepError("cudatrace sweep: the command has no %s: write it where the "
                                 "value of --values %s=... goes" % (k.placeholder, k.name))
            raise SweepError("cudatrace sweep: the command has no {}: write {} where the value "
                             "goes, e.g. cudatrace sweep --values 1,2,4 -- ./server "
                             "--num-blocks {}")
        i = where[0]
        arg = cmd[i]
        m = re.match(r"^(--?[A-Za-z][\w.-]*)=" + re.escape(k.placeholder) + "$", arg)
        if m:
            k.flag = m.group(1)
        elif arg == k.placeholder and i > 0 and re.match(r"^--?[A-Za-z][\w.-]*$", cmd[i - 1]):
            k.flag = cmd[i - 1]
    named = {k.name for k in knobs if k.name}
    if named:
        for a in cmd:
            for m in re.finditer(r"\{([A-Za-z_]\w*)\}", a):
                if m.group(1) not in named:
                    raise SweepError("cudatrace sweep: the command has {%s} but no --values %s=..."
                                     % (m.group(1), m.group(1)))
            if "{}" in a:
                raise SweepError("cudatrace sweep: the command has {} but the knobs are named "
                                 "(%s): write {%s} instead" % (", ".join(sorted(named)),
                                                               sorted(named)[0]))


def substitute(cmd: list[str], knobs: list[Knob], combo: tuple) -> list[str]:
    out = []
    for a in cmd:
        for k, i in zip(knobs, combo):
            a = a.replace(k.placeholder, k.texts[i])
        out.append(a)
    return out


def combos(knobs: list[Knob]) -> list[tuple]:
    """Indexes into each knob's values: every value of one knob; the product of a grid."""
    return list(itertools.product(*(range(len(k.texts)) for k in knobs)))


def run_name(knobs: list[Knob], combo: tuple) -> str:
    name = ",".join("%s=%s" % (k.key, k.texts[i]) for k, i in zip(knobs, combo))
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", name)


# ---- stopping servers ------------------------------------------------------------------------

@dataclass
class StopRule:
    stop_after: float | None = None
    url: str | None = None
    settle: float = 2.0
    grace: float = 10.0
    url_timeout: float = 300.0

    @property
    def active(self) -> bool:
        return self.stop_after is not None or self.url is not None


def url_answers(url: str, timeout: float = 2.0) -> bool:
    """True once anything answers HTTP there (an error status too); no proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            r.read(1)
        return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def live_bytes(out: Path):
    """Traced bytes live now in a running trace directory (None if it cannot be read yet)."""
    from .model import build
    from .trace import read_dir
    try:
        td = read_dir(out)
        return build(td).end_bytes if td.traces else 0
    except Exception:
        return None


def _tree(pid: int) -> list[int]:
    from .launcher import tree_pids
    try:
        return tree_pids(pid)
    except OSError:
        return [pid]


class Watcher(threading.Thread):
    """Stops one run by the rule; `info` says how (None: the command ended by itself)."""

    def __init__(self, proc, out: Path, rule: StopRule, done: threading.Event):
        super().__init__(daemon=True, name="cudatrace-sweep-watcher")
        self.proc, self.out, self.rule, self.done = proc, out, rule, done
        self.info: dict | None = None
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def run(self) -> None:
        r = self.rule
        if r.stop_after is not None:
            if not self.done.wait(r.stop_after):
                self.stop({"how": "stopped", "why": "time", "seconds": r.stop_after})
            return
        if r.url is None:
            return
        answered = None
        while not self.done.is_set():
            if url_answers(r.url):
                answered = self.elapsed()
                break
            if self.elapsed() >= r.url_timeout:
                self.stop({"how": "url_timeout", "url": r.url, "seconds": r.url_timeout})
                return
            self.done.wait(0.2)
        if answered is None:
            return
        last, since, settled = object(), time.monotonic(), False
        while not self.done.is_set():
            t = time.monotonic()
            v = live_bytes(self.out)
            took = time.monotonic() - t
            now = time.monotonic()
            if v != last or v is None:
                last, since = v, now
            elif now - since >= r.settle:
                settled = True
                break
            if self.elapsed() - answered >= max(r.url_timeout, r.settle):
                break
            self.done.wait(max(0.1, min(r.settle / 4, 1.0), 2 * took))
        if self.done.is_set():
            return
        self.stop({"how": "stopped", "why": "url", "url": r.url, "answered_after": answered,
                   "settle": r.settle, "settled": settled,
                   "live_bytes": last if isinstance(last, int) else None})

    def _send(self, sig) -> None:
        if self.proc.returncode is not None:
            return
        for pid in _tree(self.proc.pid):
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def stop(self, info: dict) -> None:
        info["after"] = self.elapsed()
        self.info = info
        for sig in (signal.SIGINT, signal.SIGTERM):
            info["signal"] = sig.name
            self._send(sig)
            if self.done.wait(self.rule.grace):
                return
        info["signal"] = "SIGKILL"
        if info["how"] == "stopped":
            info["how"] = "killed"
        self._send(signal.SIGKILL)


# ---- running ---------------------------------------------------------------------------------

@dataclass
class Plan:
    knobs: list[Knob]
    cmd: list[str]
    out: Path
    rule: StopRule = field(default_factory=StopRule)
    run_options: dict = field(default_factory=dict)
    force: bool = False
    depth: int = 1

    def runs(self) -> list[tuple]:
        return combos(self.knobs)


def check_output(plan: Plan) -> None:
    """Refuse to overwrite an earlier sweep (or any trace) without --force; nothing is lost."""
    if plan.out.exists() and not plan.out.is_dir():
        raise SweepError("cudatrace sweep: %s exists and is not a directory" % plan.out)
    if plan.force:
        return
    old = [plan.out / "sweep.json"] if (plan.out / "sweep.json").exists() else []
    for combo in plan.runs():
        d = plan.out / run_name(plan.knobs, combo)
        if d.is_dir() and (list(d.glob("*.ctrace")) or (d / "run.json").exists()):
            old.append(d)
    if old:
        raise SweepError("cudatrace sweep: %s already holds a sweep (%s); pass --force to replace "
                         "it, or -o another directory" % (plan.out, old[0].name))


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


def measure(path: Path, depth: int, symbolizer=None):
    """(measurement, symbolizer) of one traced run: the peak and the sites live at it, as
    `report` attributes them (sites keyed as `diff` matches them)."""
    a = Analysis(path, symbolizer=symbolizer)
    m = a.model
    sites = {}
    for s in a.sites(m.groups_at_peak(), "site", depth):
        sites[s.key] = {"label": s.label(), "key": s.key_text(), "bytes": s.bytes,
                        "count": s.count}
    return {"peak_bytes": m.peak_bytes,
            "peak_time": a.seconds(m.peak_ts) if m.found else None,
            "end_bytes": m.end_bytes, "allocs": m.counts.get("allocs", 0),
            "denied": m.counts.get("denied", 0), "failed": m.counts.get("failed", 0),
            "processes": len(a.traces), "sites": sites}, a.symbolizer


def execute(plan: Plan, progress=None) -> list[dict]:
    """Run every value (the product of a grid), each traced into its directory; how each ended
    and what it measured. progress(index, total, run) is called after each run."""
    from .launcher import LaunchError, RunOptions
    from .launcher import run as launch
    plan.out.mkdir(parents=True, exist_ok=True)
    todo = plan.runs()
    runs: list[dict] = []
    symbolizer = None
    for n, combo in enumerate(todo, 1):
        cmd = substitute(plan.cmd, plan.knobs, combo)
        d = plan.out / run_name(plan.knobs, combo)
        d.mkdir(parents=True, exist_ok=True)
        log = d / "output.log"
        rec = {"index": n - 1, "combo": combo, "command": cmd, "directory": str(d),
               "output": str(log), "ended": None, "included": False, "measured": None}
        done = threading.Event()
        holder: dict = {}

        def on_start(proc, out, holder=holder, done=done):
            if plan.rule.active:
                w = holder["w"] = Watcher(proc, out, plan.rule, done)
                w.start()

        opts = RunOptions(cmd=cmd, out_dir=d, quiet=True, force=True, on_start=on_start,
                          **plan.run_options)
        t0 = time.monotonic()
        status = None
        with open(log, "wb") as f:
            opts.stdout = opts.stderr = f
            try:
                status = launch(opts)
            except LaunchError as e:
                rec["ended"] = {"how": "not_started", "why": str(e), "status": e.status}
            finally:
                done.set()
                if "w" in holder:
                    holder["w"].join()
        rec["seconds"] = round(time.monotonic() - t0, 3)
        stopped = holder["w"].info if "w" in holder else None
        interrupted = [s for s in opts.signals if s in (signal.SIGINT, signal.SIGTERM,
                                                         signal.SIGHUP, signal.SIGQUIT)]
        if rec["ended"] is None:
            rec["ended"] = _ended(status, stopped, interrupted, _run_info(d).get("returncode"))
            if rec["ended"]["how"] != "interrupted":
                try:
                    rec["measured"], symbolizer = measure(d, plan.depth, symbolizer)
                except ReportError as e:
                    rec["ended"] = {"how": "no_trace", "status": status,
                                    "why": str(e).replace("cudatrace: ", "", 1)}
        meas = rec["measured"]
        if meas is not None and (meas["denied"] or _aborted(d)):
            rec["ended"] = {"how": "failed_under_budget", "status": status,
                            "denied": meas["denied"], "message": _budget_line(log)}
        how = rec["ended"]["how"]
        rec["included"] = how in ("stopped", "killed") or (how == "exited" and status == 0)
        if not rec["included"] and rec["ended"]["how"] not in ("not_started",) and \
                "message" not in rec["ended"]:
            rec["ended"]["message"] = _last_line(log)
        runs.append(rec)
        if progress is not None:
            progress(n, len(todo), rec)
        if interrupted:
            break
    return runs


def _run_info(d: Path) -> dict:
    try:
        got = json.loads((d / "run.json").read_text())
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def _aborted(d: Path) -> bool:
    return bool(_run_info(d).get("budget_aborted"))


def _ended(status: int, stopped: dict | None, interrupted: list, returncode=None) -> dict:
    if interrupted:
        return {"how": "interrupted", "status": status,
                "signal": signal.Signals(interrupted[0]).name}
    if stopped is not None:
        e = dict(stopped)
        e["status"] = status
        return e
    if isinstance(returncode, int) and returncode < 0:
        return {"how": "signaled", "status": status, "signal": _signal_name(status)}
    return {"how": "exited", "status": status}


# ---- the result as data ----------------------------------------------------------------------

def _value_of(knobs: list[Knob], combo: tuple):
    if len(knobs) == 1:
        return knobs[0].numbers[combo[0]]
    return {k.key: k.numbers[i] for k, i in zip(knobs, combo)}


def _text_of(knobs: list[Knob], combo: tuple) -> str:
    if len(knobs) == 1:
        return knobs[0].texts[combo[0]]
    return ",".join("%s=%s" % (k.key, k.texts[i]) for k, i in zip(knobs, combo))


def parse_point(knobs: list[Knob], text: str) -> tuple:
    """--predict V (one knob) or NAME=V,NAME=V (a grid) -> one number per knob."""
    if len(knobs) == 1:
        k = knobs[0]
        t = text.strip()
        if "=" in t:
            name, _, t = t.partition("=")
            if name.strip() not in (k.key, k.name, k.flag):
                raise SweepError("cudatrace sweep: --predict %s: the knob is %s" % (text, k.label))
        v, is_size = parse_value(t)
        if k.unit == "bytes" and not is_size and v != 0:
            raise SweepError("cudatrace sweep: --predict %s: the values swept are sizes; write "
                             "it with its unit (2GiB)" % text)
        if k.unit is None and is_size:
            raise SweepError("cudatrace sweep: --predict %s: the values swept are plain numbers"
                             % text)
        return (v,)
    got = {}
    for item in text.split(","):
        name, eq, t = item.partition("=")
        if not eq:
            raise SweepError("cudatrace sweep: --predict %s: name every knob: %s" % (
                text, ",".join("%s=V" % k.key for k in knobs)))
        got[name.strip()] = t
    out = []
    for k in knobs:
        if k.key not in got:
            raise SweepError("cudatrace sweep: --predict %s: no value for %s" % (text, k.key))
        v, _ = parse_value(got.pop(k.key))
        out.append(v)
    if got:
        raise SweepError("cudatrace sweep: --predict %s: no knob named %s" % (text, sorted(got)[0]))
    return tuple(out)


def parse_expect(text: str, knobs: list[Knob] | None = None):
    """--expect SLOPE: bytes per unit of the knob: '1', '0.5', '1MiB' -> a float. On a grid
    NAME=SLOPE,... (only those knobs) or one SLOPE for every knob -> {NAME: float}."""
    if not knobs or len(knobs) == 1:
        t = text.split("=", 1)[1] if knobs and "=" in text and text.split("=", 1)[0].strip() in \
            (knobs[0].key, knobs[0].name, knobs[0].flag) else text
        v, _ = parse_value(t)
        return float(v)
    if "=" not in text:
        v, _ = parse_value(text)
        return {k.key: float(v) for k in knobs}
    out = {}
    names = {k.key for k in knobs}
    for item in text.split(","):
        name, eq, t = item.partition("=")
        name = name.strip()
        if not eq or name not in names:
            raise SweepError("%r: write NAME=SLOPE with NAME one of %s" % (item, ", ".join(
                sorted(names))))
        out[name] = float(parse_value(t)[0])
    return out


def _series(knobs, runs, ys_by_run: list, label: str, key: str | None, expect, counts=None):
    """One law: the peak or a site. ys_by_run: bytes per run (None: run left out)."""
    from .present import sweep as text
    inc = [(r, y) for r, y in zip(runs, ys_by_run) if y is not None]
    d = {"label": label, "key": key, "bytes": ys_by_run}
    if counts is not None:
        d["count"] = counts
    if len(knobs) == 1:
        k = knobs[0]
        law = laws.classify([k.numbers[r["combo"][0]] for r, _ in inc], [y for _, y in inc])
        d["fit"] = law.affine.as_json() if law.affine is not None else None
        d["law"] = {"kind": law.kind, "tested": law.tested, "detail": law.detail,
                    "points": [[x, y] for x, y in law.points]}
        if law.power is not None:
            d["law"]["power"] = {"coefficient": law.power.coef, "exponent": law.power.exponent,
                                 "r2": law.power.r2}
        d["law"]["text"] = text.law_text(d, k.as_json())
        slope = law.affine.slope if law.affine is not None and law.kind != "flat" else 0.0
        d["_law"] = law
        growth = [(k, slope, None)]
    else:
        pts = [tuple(k.numbers[i] for k, i in zip(knobs, r["combo"])) for r, _ in inc]
        g = laws.fit_grid(pts, [y for _, y in inc], [k.key for k in knobs]) if inc else None
        d["fit"] = g.as_json() if g is not None else None
        ys = [y for _, y in inc]
        flat = bool(ys) and (max(ys) == min(ys) or (
            max(ys) - min(ys) <= laws.REL_TOL * max(abs(y) for y in ys)
            and (g is None or g.r2 < 0.9)))
        d["law"] = {"kind": "flat" if flat else (g.model if g else "none"),
                    "tested": bool(g and g.lsq.dof > 0),
                    "points": [list(p) + [y] for p, (_, y) in zip(pts, inc)]}
        d["law"]["text"] = text.grid_law_text(d, [k.as_json() for k in knobs])
        d["_law"] = g
        growth = []
        if g is not None and not flat:
            for i, k in enumerate(knobs):
                s, at = max((g.partial_slope(i, p), p) for p in pts)
                where = ",".join("%s=%s" % (o.key, _show(o, v)) for j, (o, v) in
                                 enumerate(zip(knobs, at)) if j != i)
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
    return k.texts[k.numbers.index(v)] if v in k.numbers else "%g" % v


def sweep_json(plan: Plan, runs: list[dict], expect: float | dict | None = None,
               predict: tuple | None = None, predict_text: str | None = None,
               top: int = 10, expect_text: str | None = None) -> dict:
    """The sweep as a dict: the --json output (docs/sweep-json.md, cudatrace.sweep/1)."""
    from .present import sweep as text
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
        ys = [r["measured"]["sites"].get(key, {}).get("bytes", 0) if r["included"] else None
              for r in runs]
        cs = [r["measured"]["sites"].get(key, {}).get("count", 0) if r["included"] else None
              for r in runs]
        sites.append(_series(knobs, runs, ys, e["label"], e["key"], expect, cs))
    shown = [s for i, s in enumerate(sites) if i < top or s["contradicts_expectation"]]
    doc = {
        "schema": SCHEMA,
        "cudatrace_version": __import__("cudatrace").__version__,
        "command": list(plan.cmd),
        "directory": str(plan.out),
        "knobs": [k.as_json() for k in knobs],
        "values": [_value_of(knobs, r["combo"]) for r in runs],
        "runs": [{"value": _value_of(knobs, r["combo"]), "text": _text_of(knobs, r["combo"]),
                  "command": r["command"], "directory": r["directory"], "output": r["output"],
                  "ended": dict(r["ended"], text=text.ended_text(r["ended"])),
                  "included": r["included"], "seconds": r.get("seconds"),
                  "peak_bytes": r["measured"]["peak_bytes"] if r["measured"] else None,
                  "peak_time": r["measured"]["peak_time"] if r["measured"] else None,
                  "allocs": r["measured"]["allocs"] if r["measured"] else None,
                  "denied": r["measured"]["denied"] if r["measured"] else None}
                 for r in runs],
        "stop": {"after": plan.rule.stop_after, "url": plan.rule.url,
                 "settle": plan.rule.settle if plan.rule.url else None,
                 "grace": plan.rule.grace},
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
        doc["notes"].append("no run allocated device memory through the CUDA driver: did the "
                            "command use the GPU?")
    if predict is not None:
        doc["prediction"] = _prediction(knobs, included, peak, sites, predict, predict_text)
    for s in [peak] + sites:
        s.pop("_law", None)
    return doc


def _prediction(knobs, included, peak, sites, point, point_text) -> dict:
    from .present import sweep as text
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
                how += " (the law is %s: the estimate may miss a step)" % law.kind.replace(
                    "_", " ")
            elif law.kind == "irregular":
                how += " (no simple law: a rough estimate)"
            return y, se, how
        y, se = law.predict(point)
        return y, se, "%s fit" % law.model

    py, pse, phow = guess(peak)
    law = peak.get("_law")
    if len(knobs) == 1 and law is not None and not law.is_affine and sites:
        # the sites partition the peak: when the peak has no simple law, their laws add up
        got = [guess(s) for s in sites]
        if all(y is not None for y, _, _ in got):
            py = sum(max(0.0, y) for y, _, _ in got)
            ses = [se for _, se, _ in got]
            pse = math.sqrt(sum(se * se for se in ses)) if all(se is not None for se in ses) \
                else None
            phow = "the sum of the sites' laws"
    if py is None:
        return {"at": point_text, "peak": None, "sites": [], "budget": None,
                "notes": notes + ["no law to predict from"]}
    n = len(included)
    if pse is None:
        notes.append("only %d points: a law through them has no uncertainty to give" % n
                     if n <= 2 else "the law has as many terms as points, or is not affine: "
                     "no uncertainty to give")
    ps = []
    for s in sites:
        y, se, how = guess(s)
        if y is None:
            continue
        ps.append({"label": s["label"], "key": s["key"], "bytes": max(0, round(y)),
                   "stderr": se, "how": how})
    ps.sort(key=lambda s: -s["bytes"])
    peak_b = max(0, round(py))
    margin = MARGIN * peak_b
    why = "%d%% headroom" % round(100 * MARGIN)
    if pse is not None and 3 * pse > margin:
        margin, why = 3 * pse, "3 standard errors of the prediction"
    if pse is None:
        margin, why = 0.25 * peak_b, "25%% headroom: %s" % (
            "two points, no uncertainty known" if n <= 2 else "no uncertainty known")
    want = peak_b + margin
    step = _round_step(want)
    budget = int(math.ceil(want / step) * step) if want > 0 else 0
    return {"at": point_text, "value": point[0] if len(knobs) == 1 else
            {k.key: v for k, v in zip(knobs, point)},
            "extrapolated": outside,
            "peak": {"bytes": peak_b, "stderr": pse, "how": phow},
            "sites": ps[:5],
            "budget": {"bytes": budget, "spec": text.size_spec(budget),
                       "reason": "the predicted traced peak %s + %s (%s), rounded up to a multiple "
                       "of %s; CUDA contexts and module images (hundreds of MiB per process) are "
                       "not counted by the budget but take memory on the box: leave them room too"
                       % (text.readable(peak_b), text.readable(margin), why,
                          text.readable(step))},
            "notes": notes}


def _round_step(v: float) -> int:
    """A round step a little under an eighth of v: 1 MiB at least, powers of two."""
    step = 1 << 20
    while step * 16 <= v:
        step <<= 1
    return step


def load_recorded(path: Path, depth: int = 1) -> tuple[Plan, list[dict]]:
    """A recorded sweep (DIR or DIR/sweep.json) measured again from its traces: the same runs
    and how they ended, with this version's attribution (and --depth) and laws."""
    f = path / "sweep.json" if path.is_dir() else path
    try:
        doc = json.loads(f.read_text())
    except OSError as e:
        raise SweepError("cudatrace sweep: --from %s: %s" % (path, e.strerror or e))
    except ValueError:
        raise SweepError("cudatrace sweep: --from %s: %s is not JSON" % (path, f))
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise SweepError("cudatrace sweep: --from %s: %s is not a sweep (%s)" % (path, f, SCHEMA))
    knobs = [Knob(k["placeholder"][1:-1], list(k["values"]), list(k["numbers"]), k["unit"],
                  k["flag"]) for k in doc["knobs"]]
    st = doc.get("stop") or {}
    plan = Plan(knobs, list(doc["command"]), f.parent.resolve(),
                StopRule(st.get("after"), st.get("url"), st.get("settle") or 2.0,
                         st.get("grace") or 10.0), depth=depth)
    runs, sym = [], None
    for i, r in enumerate(doc["runs"]):
        if len(knobs) == 1:
            combo = (knobs[0].texts.index(r["text"]),)
        else:
            parts = dict(p.split("=", 1) for p in r["text"].split(","))
            combo = tuple(k.texts.index(parts[k.key]) for k in knobs)
        d = plan.out / Path(r["directory"]).name        # beside sweep.json, if moved with it
        if not d.is_dir():
            d = Path(r["directory"])
        ended = {k: v for k, v in r["ended"].items() if k != "text"}
        rec = {"index": i, "combo": combo, "command": r["command"], "directory": str(d),
               "output": str(d / "output.log"), "ended": ended, "included": r["included"],
               "seconds": r.get("seconds"), "measured": None}
        if r.get("peak_bytes") is not None:
            try:
                rec["measured"], sym = measure(d, depth, sym)
            except ReportError as e:
                rec["ended"] = {"how": "no_trace", "status": ended.get("status"),
                                "why": str(e).replace("cudatrace: ", "", 1)}
                rec["included"] = False
        runs.append(rec)
    return plan, runs


def sweep_dict(path, depth: int = 1, expect: str | None = None, predict: str | None = None,
               top: int = 10) -> dict:
    """The cudatrace.sweep/1 dict of a recorded sweep directory, fitted again from its traces
    (for reports that chart the laws). Raises SweepError on a directory that is not a sweep."""
    plan, runs = load_recorded(Path(path), depth)
    exp = parse_expect(expect, plan.knobs) if expect is not None else None
    point = parse_point(plan.knobs, predict) if predict is not None else None
    return sweep_json(plan, runs, exp, point, predict, top, expect)


# ---- the command -----------------------------------------------------------------------------

def _time(opt: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        v = parse_time(text)
    except ValueError as e:
        raise SweepError("cudatrace sweep: %s %s: %s" % (opt, text, e))
    return v


def default_out(cmd0: str) -> Path:
    base = "cudatrace-sweep-%s-%s" % (Path(cmd0).name or "run", time.strftime("%Y%m%d-%H%M%S"))
    p = Path.cwd() / base
    n = 1
    while p.exists():
        n += 1
        p = Path.cwd() / ("%s-%d" % (base, n))
    return p


def main(values, cmd, out_dir=None, force=False, as_json=False, stop_after=None, until_url=None,
         settle="2s", grace="10s", url_timeout="300s", expect=None, predict=None, top=10,
         depth=1, run_options=None, out=None, err=None, from_dir=None) -> int:
    """`cudatrace sweep`; returns the exit status: 0, 1 when fewer than two runs could be
    fitted, 2 on bad input (nothing run)."""
    from .present import sweep as text
    out = out or sys.stdout
    err = err or sys.stderr
    cmd = list(cmd)
    if from_dir is not None:
        return _main_from(Path(from_dir), values, cmd, as_json, expect, predict, top, depth,
                          out, err)
    try:
        knobs = parse_knobs(values)
        bind_command(knobs, cmd)
        if stop_after is not None and until_url is not None:
            raise SweepError("cudatrace sweep: --stop-after and --until-url: give one")
        rule = StopRule(_time("--stop-after", stop_after), until_url,
                        _time("--settle", settle), _time("--grace", grace),
                        _time("--url-timeout", url_timeout))
        if until_url is not None and not re.match(r"^https?://", until_url):
            raise SweepError("cudatrace sweep: --until-url %s: an http:// or https:// URL"
                             % until_url)
        exp = None
        if expect is not None:
            try:
                exp = parse_expect(expect, knobs)
            except SweepError as e:
                raise SweepError("cudatrace sweep: --expect %s: %s" % (expect, e))
        point = parse_point(knobs, predict) if predict is not None else None
        plan = Plan(knobs, cmd, (Path(out_dir) if out_dir else default_out(
            cmd[0].replace("{", "").replace("}", ""))).resolve(), rule, dict(run_options or {}),
            force, depth)
        check_output(plan)
        if not any(k.placeholder in cmd[0] for k in knobs):
            from .launcher import LaunchError, check_enterable, resolve_command
            try:
                check_enterable(resolve_command(cmd[0]))
            except LaunchError as e:
                err.write("%s\n" % e)
                return e.status
    except SweepError as e:
        err.write("%s\n" % e)
        return e.status

    total = len(plan.runs())
    err.write("cudatrace sweep: %d run%s of %s -> %s\n" % (
        total, "" if total == 1 else "s", " ".join(cmd), plan.out))
    err.flush()

    def progress(n, total, rec):
        m = rec["measured"]
        err.write("  %d/%d  %s: %s%s%s\n" % (
            n, total, _text_of(knobs, rec["combo"]), text.ended_text(rec["ended"]),
            ", peak %s" % text.readable(m["peak_bytes"]) if m and rec["included"] else "",
            "" if rec["included"] else " (left out of the laws)"))
        err.flush()

    try:
        runs = execute(plan, progress)
    except KeyboardInterrupt:
        err.write("cudatrace sweep: interrupted\n")
        return 130
    doc = sweep_json(plan, runs, exp, point, predict, top, expect)
    try:
        (plan.out / "sweep.json").write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as e:
        err.write("cudatrace sweep: could not write %s: %s\n" % (plan.out / "sweep.json", e))
    if as_json:
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        out.write(text.render(doc))
    out.flush()
    return 0 if sum(1 for r in runs if r["included"]) >= 2 else 1


def _main_from(path: Path, values, cmd, as_json, expect, predict, top, depth, out, err) -> int:
    """`cudatrace sweep --from DIR`: the recorded sweep's laws again, nothing run."""
    from .present import sweep as text
    try:
        if values or cmd:
            raise SweepError("cudatrace sweep: --from replays a recorded sweep: give no --values "
                             "and no command")
        plan, runs = load_recorded(path, depth)
        exp = None
        if expect is not None:
            try:
                exp = parse_expect(expect, plan.knobs)
            except SweepError as e:
                raise SweepError("cudatrace sweep: --expect %s: %s" % (expect, e))
        point = parse_point(plan.knobs, predict) if predict is not None else None
    except SweepError as e:
        err.write("%s\n" % e)
        return e.status
    doc = sweep_json(plan, runs, exp, point, predict, top, expect)
    out.write(json.dumps(doc, indent=2) + "\n" if as_json else text.render(doc))
    return 0 if sum(1 for r in runs if r["included"]) >= 2 else 1
