"""`cudatrace metrics`: budgets and traced runs in Prometheus's exposition format, through the
official client library (the optional extra `metrics`; docs/metrics.md has every metric).

One custom Collector reads everything again at each scrape: the ledgers through the same C
code `cudatrace status` uses (a read of the shared mapping: no lock any member waits on, no
write), and, with --traces, the runs being traced there (their files as they are). Groups and
runs that appear are picked up at the next scrape; those that end or become unreadable drop
out of it (an unreadable ledger is counted in cudatrace_ledger_errors, never an error of the
scrape).

Label cardinality is bounded: one series per group and device; per member process (at most 256
a group); per run and device the `top` largest sites by label and the rest summed as
site="other".
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

COMMAND_MAX = 32  # characters of a member's command label (its /proc comm is at most 15)


def _comm(pid: int, other_ns: bool) -> str:
    if other_ns:
        return ""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()[:COMMAND_MAX]
    except OSError:
        return ""


def _group_label(s: dict) -> str:
    if s.get("label"):  # a reader that tells apart ledgers of one name (cudatrace node)
        return s["label"]
    name = Path(s["path"]).name
    return name[: -len(".ledger")] if name.endswith(".ledger") else name


def _devices(rows: list[dict]) -> list[dict]:
    """The devices a group has used (anything held, a peak, a denial); a group that has used
    none yet shows its first device with a limit. A bare budget sets a limit on all 16
    devices the ledger counts: 16 idle series a group would be noise."""
    used = [r for r in rows if r["in_use"] or r["peak"] or r["denials"] or r.get("over")]
    return used or rows[:1]


class TraceCache:
    """Top sites of the runs under some folders, each run analyzed again only when its files
    changed and at most once per `interval` seconds (a big trace's analysis is not redone at
    every scrape)."""

    def __init__(self, paths, top: int, interval: float, symbolize: bool = True):
        self.paths = [Path(p) for p in paths]
        self.top = top
        self.interval = interval
        self.symbolize = symbolize
        self._symbolizer = None
        self._cache: dict[Path, tuple[tuple, float, dict]] = {}
        self._lock = threading.Lock()  # one scrape at a time analyzes (this process only)
        self.errors = 0

    def _sym(self):
        if self._symbolizer is None and self.symbolize:
            from ..analyze.sites import make_symbolizer

            self._symbolizer = make_symbolizer(progress=False)
        return self._symbolizer

    def runs(self) -> list[dict]:
        from ..analyze import live

        out = []
        with self._lock:
            self.errors = 0
            seen = set()
            for p in live.run_dirs(self.paths):
                seen.add(p)
                if not live.running(p):
                    continue
                sig = live.signature(p)
                now = time.monotonic()
                hit = self._cache.get(p)
                if hit and (hit[0] == sig or now - hit[1] < self.interval):
                    out.append(hit[2])
                    continue
                try:
                    data = live.top_sites(p, self.top, self._sym())
                except Exception:  # a run just starting, a file being replaced: next scrape
                    self.errors += 1
                    if hit:
                        out.append(hit[2])
                    continue
                self._cache[p] = (sig, now, data)
                out.append(data)
            for p in list(self._cache):
                if p not in seen:
                    del self._cache[p]
        return out


class Collector:
    """The prometheus_client Collector: `ledgers()` gives status_json's data (record/ledger.py),
    `traces` (a TraceCache or None) the runs."""

    def __init__(
        self,
        ledgers: Callable[[], dict],
        traces: TraceCache | None = None,
        member_labels: Callable[[dict, dict], tuple[str, str, str]] | None = None,
    ):
        self.ledgers = ledgers
        self.traces = traces
        # (ledger, member) -> (namespace, pod, container): per-member series get those labels
        self.member_labels = member_labels

    def describe(self):
        return []  # families vary with what is there: collected at each scrape only

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        G, C = GaugeMetricFamily, CounterMetricFamily
        gl = ["group", "device"]
        ml = ["group", "device", "pid", "command", "share"]
        ml += ["namespace", "pod", "container"] if self.member_labels else []
        fam = {
            "limit": G("cudatrace_budget_limit_bytes", "Budget of the group on the device (0: none)", labels=gl),
            "in_use": G("cudatrace_budget_in_use_bytes", "Bytes the group's live members hold on the device", labels=gl),
            "peak": G("cudatrace_budget_peak_bytes", "Highest total the group reached on the device", labels=gl),
            "contexts": G("cudatrace_budget_context_bytes", "Of in use: the members' CUDA contexts", labels=gl),
            "denials": C("cudatrace_budget_denials", "Allocations the budget refused", labels=gl),
            "members": G("cudatrace_budget_members", "Live member processes of the group", labels=["group"]),
            "m_in_use": G("cudatrace_budget_member_in_use_bytes", "Bytes a member process holds", labels=ml),
            "m_peak": G("cudatrace_budget_member_peak_bytes", "Highest a member process held", labels=ml),
            "m_denials": C("cudatrace_budget_member_denials", "Allocations of a member the budget refused", labels=ml),
            "s_limit": G("cudatrace_budget_share_limit_bytes", "Budget of a share (a job) of the group, on each device", labels=["group", "share"]),
            "s_in_use": G("cudatrace_budget_share_in_use_bytes", "Bytes a share's live members hold", labels=["group", "device", "share"]),
            "errors": G("cudatrace_ledger_errors", "Ledgers in the directory that could not be read at this scrape"),
        }  # fmt: skip
        try:
            st = self.ledgers()
        except Exception:
            st = {"ledgers": [], "errors": [{"error": "no ledger directory"}]}
        for s in st["ledgers"]:
            self._ledger(s, fam, self.member_labels)
        fam["errors"].add_metric([], len(st.get("errors", [])))
        yield from fam.values()
        yield from unfenced_families(st.get("unfenced"))
        if self.traces is not None:
            yield from self._traces()

    @staticmethod
    def _ledger(s: dict, fam: dict, labels=None) -> None:
        g = _group_label(s)
        for r in _devices(s["devices"]):
            lv = [g, str(r["device"])]
            fam["limit"].add_metric(lv, r["limit"])
            fam["in_use"].add_metric(lv, r["in_use"])
            fam["peak"].add_metric(lv, r["peak"])
            fam["contexts"].add_metric(lv, r.get("contexts", 0))
            fam["denials"].add_metric(lv, r["denials"])
        alive = [m for m in s["members"] if m["state"] != "dead"]
        fam["members"].add_metric([g], len(alive))
        shares: dict[str, int] = {}
        share_use: dict[tuple[str, str], int] = {}
        for m in alive:
            cmd = _comm(m["pid"], m.get("other_pidns", False))
            share = m.get("share") or ""
            if share:
                shares[share] = max(shares.get(share, 0), m.get("share_limit", 0))
            extra = list(labels(s, m)) if labels else []
            for d, r in m["devices"].items():
                lv = [g, str(d), str(m["pid"]), cmd, share, *extra]
                fam["m_in_use"].add_metric(lv, r["held"])
                fam["m_peak"].add_metric(lv, r["peak"])
                fam["m_denials"].add_metric(lv, r["denials"])
                if share:
                    k = (str(d), share)
                    share_use[k] = share_use.get(k, 0) + r["held"]
        for share, lim in sorted(shares.items()):
            fam["s_limit"].add_metric([g, share], lim)
        for (d, share), b in sorted(share_use.items()):
            fam["s_in_use"].add_metric([g, d, share], b)

    def _traces(self):
        from prometheus_client.core import GaugeMetricFamily

        live = GaugeMetricFamily(
            "cudatrace_trace_live_bytes",
            'Bytes a traced run holds now, by site (the top N; the rest as site="other")',
            labels=["run", "command", "device", "site"],
        )
        total = GaugeMetricFamily(
            "cudatrace_trace_run_live_bytes",
            "Bytes a traced run holds now on the device",
            labels=["run", "command", "device"],
        )
        runs = self.traces.runs()
        for r in runs:
            for d, row in sorted(r["devices"].items()):
                total.add_metric([r["run"], r["command"], str(d)], row["live"])
                for site, b in row["sites"].items():
                    live.add_metric([r["run"], r["command"], str(d), site], b)
        errs = GaugeMetricFamily(
            "cudatrace_trace_errors", "Runs that could not be read at this scrape"
        )
        errs.add_metric([], self.traces.errors)
        yield total
        yield live
        yield errs


def unfenced_families(u: dict | None):
    """cudatrace_unfenced_processes / _bytes per GPU (NVML's index): processes using the GPU
    that no ledger of the directory counts (record/fence.py unfenced; docs/budgets.md). Every
    GPU NVML lists has both series (0 when none), so `> 0` alerts; none where NVML cannot say."""
    from prometheus_client.core import GaugeMetricFamily

    if not u or not u.get("known"):
        return
    procs = GaugeMetricFamily(
        "cudatrace_unfenced_processes",
        "Processes using the GPU that no budget ledger counts (NVML's list against the members)",
        labels=["gpu"],
    )
    nbytes = GaugeMetricFamily(
        "cudatrace_unfenced_bytes",
        "Device memory NVML shows for the GPU's unfenced processes",
        labels=["gpu"],
    )
    for gpu in u["gpus"]:
        mine = [p for p in u["processes"] if p["gpu"] == gpu]
        procs.add_metric([str(gpu)], len(mine))
        nbytes.add_metric([str(gpu)], sum(p["bytes"] for p in mine))
    yield procs
    yield nbytes


def serve(host: str, port: int, collector: Collector, ready: Callable[[str], None]) -> None:
    """Serve /metrics on host:port until interrupted (OSError when the address is taken)."""
    from prometheus_client import CollectorRegistry, start_http_server

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    start_http_server(port, addr=host, registry=reg)
    ready(f"http://{host if ':' not in host else '[' + host + ']'}:{port}/metrics")
    while True:
        time.sleep(3600)
