"""`cudatrace metrics`: budgets and traced runs in Prometheus's exposition format, through the
official client library (the optional extra `metrics`; docs/metrics.md has every metric).

One custom Collector reads the ledgers again at each scrape, through the same C code
`cudatrace status` uses (a read of the shared mapping: no lock any member waits on, no write).
With --traces, the runs being traced there are read by a TraceCache outside the scrape: a scrape
asks for figures no older than --trace-interval and waits for them a bounded time, else it is
answered with the last ones (their age is a metric), so a big trace never makes a scrape slow.

A scrape never fails because of one ledger, run or label: each source is read on its own (what
cannot be read is counted in cudatrace_ledger_errors / cudatrace_trace_errors), every label
value is text any client takes (a name's bytes that are not UTF-8 become \\xNN, control
characters are escaped: units.printable),
and no two series of a family share a label set (members are told apart by their ledger slot,
runs by their path).

Label cardinality is bounded: one series per group and device; per member process (its slot in
the ledger); per run and device the `top` largest sites by label and the rest summed as
site="other". Families with a device carry `gpu` (the NVML index) and `UUID`, as dcgm-exporter
names them, for joins with its metrics.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..record_types import LedgerDevice, LedgerMember, LedgerSnapshot, Status, WatchReport
from ..units import printable

if TYPE_CHECKING:
    from ..symbols import Symbolizer

COMMAND_MAX = 32  # characters of a member's command label (its /proc comm is at most 15)
WAIT_S = 1.0  # the most a scrape waits for fresh trace figures

G, C = "gauge", "counter"
KINDS = ("outside_ledger", "unfenced", "group_over_budget")  # record/watch.py's breaches
DEV = ("device", "gpu", "UUID")
MEMBER = ("group", *DEV, "pid", "slot", "command", "share")
RUN = ("run", "path", "command")
MEMBER_KEYS = ("m_in_use", "m_peak", "m_denials")
# labels a member's series gain where the reader knows them (cudatrace node: Kubernetes names)
WORKLOAD = ("namespace", "pod", "container")
# key: (type, name, help, labels); the traced runs' keys start with "t_"
FAMILIES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "limit": (G, "cudatrace_budget_limit_bytes", "Budget of the group on the device (0: none)", ("group", *DEV)),
    "in_use": (G, "cudatrace_budget_in_use_bytes", "Bytes the group's live members hold on the device", ("group", *DEV)),
    "peak": (G, "cudatrace_budget_peak_bytes", "Highest total the group reached on the device", ("group", *DEV)),
    "contexts": (G, "cudatrace_budget_context_bytes", "Of in use: the members' CUDA contexts", ("group", *DEV)),
    "denials": (C, "cudatrace_budget_denials", "Allocations the budget refused", ("group", *DEV)),
    "members": (G, "cudatrace_budget_members", "Live member processes of the group", ("group",)),
    "m_in_use": (G, "cudatrace_budget_member_in_use_bytes", "Bytes a member process holds", MEMBER),
    "m_peak": (G, "cudatrace_budget_member_peak_bytes", "Highest a member process held", MEMBER),
    "m_denials": (C, "cudatrace_budget_member_denials", "Allocations of a member the budget refused", MEMBER),
    "s_limit": (G, "cudatrace_budget_share_limit_bytes", "Budget of a share (a job) of the group, on each device", ("group", "share")),
    "s_in_use": (G, "cudatrace_budget_share_in_use_bytes", "Bytes a share's live members hold", ("group", *DEV, "share")),
    "errors": (G, "cudatrace_ledger_errors", "Ledgers in the directory that could not be read at this scrape", ()),
    "t_total": (G, "cudatrace_trace_run_live_bytes", "Bytes a traced run holds now on the device", (*RUN, *DEV)),
    "t_live": (G, "cudatrace_trace_live_bytes", 'Bytes a traced run holds now, by site (the top N; the rest as site="other")', (*RUN, *DEV, "site")),
    "t_age": (G, "cudatrace_trace_age_seconds", "How long ago the run's figures were read from its trace", RUN),
    "t_errors": (G, "cudatrace_trace_errors", "Runs that could not be read at this scrape", ()),
    "build": (G, "cudatrace_build_info", "The cudatrace serving these metrics (value 1)", ("version", "python", "trace_format")),
    "u_procs": (G, "cudatrace_unfenced_processes", "Processes using the GPU that no budget ledger counts (NVML's list against the members)", ("gpu", "UUID")),
    "u_bytes": (G, "cudatrace_unfenced_bytes", "Device memory NVML shows for the GPU's unfenced processes", ("gpu", "UUID")),
    "w_breaches": (G, "cudatrace_watch_breaches", "Breaches NVML shows against the ledgers now: kind outside_ledger, unfenced (on a GPU fenced processes use), group_over_budget", ("gpu", "UUID", "kind")),
    "w_bytes": (G, "cudatrace_watch_breach_bytes", "Of the breaches, the bytes NVML shows beyond what the ledgers count", ("gpu", "UUID", "kind")),
    "w_known": (G, "cudatrace_watch_per_process_known", "1: NVML gives each process's memory on the GPU; 0: it cannot (reason), and the watch falls back to the device's figure", ("gpu", "UUID", "reason")),
    "w_used": (G, "cudatrace_watch_device_used_bytes", "The GPU's memory in use as the platform gives it (source nvml, or meminfo where the GPU shares the host's memory)", ("gpu", "UUID", "source")),
    "w_ledgers": (G, "cudatrace_watch_ledger_bytes", "What the ledgers count on the GPU", ("gpu", "UUID")),
    "w_unaccounted": (G, "cudatrace_watch_unaccounted_bytes", "The GPU's memory in use that no ledger counts (device used less the ledgers; contexts of unfenced processes and the driver's own included)", ("gpu", "UUID", "source")),
}  # fmt: skip
RUN_GROUP = "@run"  # the private ledgers of `cudatrace run --budget`, summed (no series each)


def _label(v: object) -> str:
    """A label value any client takes and any screen shows as it is: text, bytes that are not
    UTF-8 as \\xNN, control characters escaped (units.printable)."""
    return printable(str(v))


class Families:
    """The samples of one scrape, by FAMILIES key; a label set seen before in a family is
    not added twice (Prometheus would keep one of them). Every family is exported, with or
    without samples, but the traced runs' without --traces (`traces` False). `workload`: the
    member families carry WORKLOAD's labels too."""

    def __init__(self, traces: bool = True, workload: bool = False) -> None:
        self.samples: dict[str, dict[tuple[str, ...], float]] = {k: {} for k in FAMILIES}
        self.traces = traces
        self.workload = workload

    def add(self, key: str, labels: Sequence[object], value: float) -> None:
        lv = tuple(_label(x) for x in labels)
        self.samples[key].setdefault(lv, value)

    def families(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for key, (kind, name, text, labels) in FAMILIES.items():
            rows = self.samples[key]
            if key.startswith("t_") and not self.traces:
                continue
            if self.workload and key in MEMBER_KEYS:
                labels = (*labels, *WORKLOAD)
            fam = (GaugeMetricFamily if kind == G else CounterMetricFamily)(
                name, text, labels=list(labels)
            )
            for lv, v in rows.items():
                fam.add_metric(list(lv), v)
            yield fam


def _comm(pid: int, other_ns: bool) -> str:
    if other_ns:
        return ""
    try:
        raw = Path(f"/proc/{pid}/comm").read_bytes().rstrip(b"\n")
    except OSError:
        return ""
    return raw.decode(errors="surrogateescape")[:COMMAND_MAX]


def _group_label(s: LedgerSnapshot) -> str:
    if s.get("label"):  # a reader that tells apart ledgers of one name (cudatrace node)
        return s["label"]
    name = Path(s["path"]).name
    if s.get("group") and (s.get("parts") or ("@" in name and not s.get("private"))):
        return s["group"]  # a group of users' parts (<group>@<uid>.ledger)
    return name[: -len(".ledger")] if name.endswith(".ledger") else name


def _devices(rows: list[LedgerDevice]) -> list[LedgerDevice]:
    """The devices a group has used (anything held, a peak, a denial); a group that has used
    none yet shows its first device with a limit. A bare budget sets a limit on all 16
    devices the ledger counts: 16 idle series a group would be noise."""
    used = [r for r in rows if r["in_use"] or r["peak"] or r["denials"] or r.get("over")]
    return used or rows[:1]


_build: list[tuple[str, str, int]] = []


def _build_info() -> tuple[str, str, int]:
    """(cudatrace's version, Python's, the trace format it reads)."""
    if not _build:
        from .. import __version__
        from ..native import defines, header_text

        fmt = defines(header_text("trace_format.h")).get("CT_FORMAT_VERSION", 0)
        _build.append((__version__, sys.version.split()[0], fmt))
    return _build[0]


class Gpus:
    """The `gpu` (NVML index) and `UUID` labels of a device: a CUDA ordinal goes through
    CUDA_VISIBLE_DEVICES (the exporter's own for the ledgers, whose ordinals its members share;
    a traced process's own for its trace), whose entry is an index or a UUID; NVML's UUIDs
    (`uuids`: index -> UUID) complete it. Unknown parts are ""."""

    def __init__(self, uuids: Mapping[int, str] | None = None, visible: str | None = None):
        self.uuids = dict(uuids or {})
        self.index = {u: i for i, u in self.uuids.items()}
        self.visible = visible

    def of_ordinal(self, ordinal: int) -> tuple[str, str]:
        entry = str(ordinal)
        if self.visible is not None:
            vis = [x.strip() for x in self.visible.split(",") if x.strip()]
            entry = vis[ordinal] if 0 <= ordinal < len(vis) else ""
        return self.of_entry(entry)

    def of_entry(self, entry: str) -> tuple[str, str]:
        if entry.isdigit():
            return entry, self.uuids.get(int(entry), "")
        if entry.startswith("GPU-"):
            i = self.index.get(entry)
            return ("" if i is None else str(i)), entry
        return "", ""


class TraceCache:
    """The figures of the runs under some folders (analyze/documents/live.py), read outside the scrape:
    `runs()` asks for figures no older than `interval` seconds and waits for them at most
    `wait` seconds, else answers the last ones. A run is analyzed again only when something was
    written into its traces since (live.signature). `start()` runs the reads in a thread;
    without it, `runs()` reads in the caller (tests)."""

    def __init__(
        self,
        paths: Iterable[str | Path],
        top: int,
        interval: float,
        symbolize: bool = True,
        wait: float = WAIT_S,
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self.top = top
        self.interval = interval
        self.wait = wait
        self.symbolize = symbolize
        self._symbolizer: Symbolizer | None = None
        # a run's figures (analyze/documents/live.py: figures), with when they were read (`at`)
        self._figures: dict[Path, dict[str, Any]] = {}
        self._sigs: dict[Path, tuple[object, ...]] = {}
        self.errors = 0
        self._cond = threading.Condition()
        self._asked = 0.0  # monotonic time of the latest request
        self._began = 0.0  # monotonic time the pass under way (or the last one) began
        self._done = -1.0  # ... the last finished pass began
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cudatrace-traces", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._asked <= self._done:
                    self._cond.wait()
            self.refresh()

    def runs(self) -> list[dict[str, Any]]:
        """The runs' figures, each with its age (`age_s`)."""
        now = time.monotonic()
        if self._thread is None:
            if now - self._done >= self.interval:
                self.refresh()
        else:
            with self._cond:
                if now - self._done >= self.interval:
                    self._asked = now
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: self._done >= now, self.wait)
        with self._cond:
            figs = list(self._figures.values())
        t = time.monotonic()
        return [dict(f, age_s=max(0.0, t - f["at"])) for f in figs]

    def _sym(self) -> Symbolizer | None:
        if self._symbolizer is None and self.symbolize:
            from ..analyze.sites.stacks import make_symbolizer

            self._symbolizer = make_symbolizer(progress=False)
        return self._symbolizer

    def refresh(self) -> None:
        """One pass over the runs: each running one read again where it changed."""
        from ..analyze.documents import live

        began = time.monotonic()
        with self._cond:
            self._began = began
        errors = 0
        figures: dict[Path, dict[str, Any]] = {}
        for p in live.run_dirs(self.paths):
            try:
                if not live.running(p):
                    continue
                sig = live.signature(p)
                old = self._figures.get(p)
                if old is not None and self._sigs.get(p) == sig:
                    figures[p] = dict(old, at=began)
                    continue
                fig = live.figures(p, self.top, self._sym())
                # a device it held on before and holds nothing on now reads 0 while it runs
                have = {(r["device"], r["gpu"]) for r in fig["devices"]}
                gone = [dict(r, live=0, sites={}) for r in (old or {}).get("devices", [])
                        if (r["device"], r["gpu"]) not in have]  # fmt: skip
                rows = sorted(fig["devices"] + gone, key=lambda r: (r["device"], str(r["gpu"])))
                figures[p] = dict(fig, devices=rows, at=began)
                self._sigs[p] = sig
            except Exception:  # a run just starting, a file being replaced: next pass
                errors += 1
                if p in self._figures:
                    figures[p] = self._figures[p]
        with self._cond:
            self._figures = figures
            self._sigs = {p: s for p, s in self._sigs.items() if p in figures}
            self.errors = errors
            self._done = began
            self._cond.notify_all()


class Collector:
    """The prometheus_client Collector: `ledgers()` gives status_json's data (record/ledger_status.py),
    `traces` (a TraceCache or None) the runs, `gpus` the gpu/UUID labels of a device,
    `member_labels` (ledger, member) -> (namespace, pod, container) where the reader knows them."""

    def __init__(
        self,
        ledgers: Callable[[], Status],
        traces: TraceCache | None = None,
        gpus: Gpus | None = None,
        member_labels: Callable[[LedgerSnapshot, LedgerMember], tuple[str, str, str]] | None = None,
    ):
        self.ledgers = ledgers
        self.traces = traces
        self.gpus = gpus or Gpus()
        self.member_labels = member_labels
        self._place: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._run_denials: dict[
            str, dict[tuple[str, int, str, str], int]
        ] = {}  # live runs' last counts
        self._runs_gone: dict[
            tuple[str, int, str, str], int
        ] = {}  # the last counts of runs that ended

    def describe(self) -> list[Any]:
        return []  # families vary with what is there: collected at each scrape only

    def collect(self) -> Iterator[Any]:
        f = Families(traces=self.traces is not None, workload=self.member_labels is not None)
        self._budgets(f)
        if self.traces is not None:
            self._traces(f)
        f.add("build", _build_info(), 1)
        yield from f.families()

    def _budgets(self, f: Families) -> None:
        try:
            st = self.ledgers()
        except Exception:
            st = {"ledgers": [], "errors": [{"path": "", "error": "no ledger directory"}]}
        errors = len(st.get("errors", []))
        watch = st.get("watch")
        self._place = _placements(watch)
        runs: list[LedgerSnapshot] = []
        for s in st["ledgers"]:
            if s.get("private"):
                runs.append(s)
                continue
            one = Families(workload=f.workload)
            try:
                self._ledger(s, one)
            except Exception:  # one malformed ledger costs its own series only
                errors += 1
                continue
            for key, rows in one.samples.items():
                for lv, v in rows.items():
                    f.add(key, lv, v)
        errors += self._runs(runs, f)
        f.add("errors", (), errors)
        _watch(watch, f)

    def _gpu(self, s: LedgerSnapshot, slot: int, d: int) -> tuple[str, str]:
        """The gpu and UUID labels of ledger s's ordinal d (slot -1: the group's): where the
        watch saw it (NVML's lists of its members), else through CUDA_VISIBLE_DEVICES."""
        key = s.get("label") or s["path"]
        found = self._place.get((key, slot, d)) or self._place.get((key, -1, d))
        return found if found is not None else self.gpus.of_ordinal(d)

    def _runs(self, runs: list[LedgerSnapshot], f: Families) -> int:
        """The private ledgers of `cudatrace run --budget`s summed as group "@run" (one series a
        device, not one a run; their members are the runs', `metrics --traces`); denials keep
        counting up when a run ends. Returns the runs that could not be read."""
        keys = ("limit", "in_use", "contexts")
        sums: dict[str, dict[tuple[str, int, str, str], int]] = {k: {} for k in keys}
        live: dict[str, dict[tuple[str, int, str, str], int]] = {}
        members, errors = 0, 0
        for s in runs:
            try:
                rows = _devices(s["devices"])
                members += sum(1 for m in s["members"] if m["state"] != "dead")
            except Exception:
                errors += 1
                continue
            mine = live.setdefault(s["path"], {})
            for r in rows:
                lv = (RUN_GROUP, r["device"], *self._gpu(s, -1, int(r["device"])))
                for k, v in (("limit", r["limit"]), ("in_use", r["in_use"]),
                             ("contexts", r.get("contexts", 0))):  # fmt: skip
                    sums[k][lv] = sums[k].get(lv, 0) + int(v)
                mine[lv] = mine.get(lv, 0) + int(r["denials"])
        for path, counts in self._run_denials.items():
            if path not in live:
                for lv, n in counts.items():
                    self._runs_gone[lv] = self._runs_gone.get(lv, 0) + n
        self._run_denials = live
        denials = dict(self._runs_gone)
        for counts in live.values():
            for lv, n in counts.items():
                denials[lv] = denials.get(lv, 0) + n
        for k, totals in sums.items():
            for lv, v in totals.items():
                f.add(k, lv, v)
        for lv, n in denials.items():
            f.add("denials", lv, n)
        if runs or self._runs_gone:
            f.add("members", (RUN_GROUP,), members)
        return errors

    def _ledger(self, s: LedgerSnapshot, f: Families) -> None:
        g = _group_label(s)
        for r in _devices(s["devices"]):
            lv = (g, r["device"], *self._gpu(s, -1, int(r["device"])))
            f.add("limit", lv, r["limit"])
            f.add("in_use", lv, r["in_use"])
            f.add("peak", lv, r["peak"])
            f.add("contexts", lv, r.get("contexts", 0))
            f.add("denials", lv, r["denials"])
        alive = [m for m in s["members"] if m["state"] != "dead"]
        f.add("members", (g,), len(alive))
        shares: dict[str, int] = {}
        share_use: dict[tuple[int, str], int] = {}
        for m in alive:
            cmd = _comm(m["pid"], m.get("other_pidns", False))
            share = m.get("share") or ""
            if share:
                shares[share] = max(shares.get(share, 0), m.get("share_limit", 0))
            extra = tuple(self.member_labels(s, m)) if self.member_labels else ()
            for d, md in m["devices"].items():
                who: tuple[object, ...] = (g, d, *self._gpu(s, m.get("slot", -1), int(d)), m["pid"])
                who = (*who, m.get("slot", ""), cmd, share, *extra)
                f.add("m_in_use", who, md["held"])
                f.add("m_peak", who, md["peak"])
                f.add("m_denials", who, md["denials"])
                if share:
                    k = (int(d), share)
                    share_use[k] = share_use.get(k, 0) + md["held"]
        for share, lim in sorted(shares.items()):
            f.add("s_limit", (g, share), lim)
        for (d, share), b in sorted(share_use.items()):
            f.add("s_in_use", (g, d, *self._gpu(s, -1, d), share), b)

    def _traces(self, f: Families) -> None:
        assert self.traces is not None
        try:
            runs = self.traces.runs()
            errors = self.traces.errors
        except Exception:
            runs, errors = [], 1
        for r in runs:
            try:
                run = (r["run"], r["path"], r["command"])
                f.add("t_age", run, round(r["age_s"], 3))
                for row in r["devices"]:
                    lv = (*run, row["device"], *self.gpus.of_entry(str(row["gpu"])))
                    f.add("t_total", lv, row["live"])
                    for site, b in row["sites"].items():
                        f.add("t_live", (*lv, site), b)
            except Exception:
                errors += 1
        f.add("t_errors", (), errors)


def _placements(w: WatchReport | None) -> dict[tuple[str, int, int], tuple[str, str]]:
    """(ledger, slot, ordinal) -> (gpu, UUID) where the watch placed it."""
    if not w or not w.get("known"):
        return {}
    uuids = {d["gpu"]: d["uuid"] for d in w["devices"]}
    return {
        (p["ledger"], p["slot"], p["device"]): (str(p["gpu"]), uuids.get(p["gpu"], ""))
        for p in w.get("placements", [])
    }


def _watch(w: WatchReport | None, f: Families) -> None:
    """The watch's series per GPU (record/watch.py; docs/metrics.md): every one exists where
    NVML can tell it (0 when nothing is wrong), none where it cannot (never a 0 for what it
    could not see): the per-process ones where NVML gives no per-process figure, all of them
    without NVML. cudatrace_unfenced_processes / _bytes: the processes using the GPU that no
    ledger counts, on any GPU."""
    if not w or not w.get("known"):
        return
    for d in w["devices"]:
        g = (d["gpu"], d["uuid"])
        f.add("w_known", (*g, d["reason"] or ""), 1 if d["per_process"] else 0)
        f.add("w_ledgers", g, d["ledgers"])
        if d["used"] is not None:
            f.add("w_used", (*g, d["source"]), d["used"])
            f.add("w_unaccounted", (*g, d["source"]), max(0, d["used"] - d["ledgers"]))
        unf = [p for p in d["processes"] if p["fence"] == "unfenced"]
        if d["listed"]:
            f.add("u_procs", g, len(unf))
        if d["per_process"]:
            f.add("u_bytes", g, sum(p["bytes"] or 0 for p in unf))
        found = [x for x in w["findings"] if x["gpu"] == d["gpu"]]
        for kind in KINDS:
            if not d["listed"] or (kind != "unfenced" and not d["per_process"]):
                continue
            mine = [x for x in found if x["kind"] == kind]
            f.add("w_breaches", (*g, kind), len(mine))
            if d["per_process"]:
                f.add("w_bytes", (*g, kind), sum(x["excess"] or 0 for x in mine))


def serve(host: str, port: int, collector: Collector, ready: Callable[[str], None]) -> None:
    """Serve /metrics on host:port until interrupted (OSError when the address is taken)."""
    from prometheus_client import CollectorRegistry, start_http_server

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    started = start_http_server(port, addr=host, registry=reg)  # (server, thread) from 0.17
    try:
        ready(f"http://{host if ':' not in host else '[' + host + ']'}:{port}/metrics")
        while True:
            time.sleep(3600)
    finally:
        # the server stops before the interpreter ends: a scrape's thread left running through
        # the interpreter's finalization can hold the exit up
        if isinstance(started, tuple):
            server, thread = started
            if thread.is_alive():
                server.shutdown()
            server.server_close()
            thread.join(5)
