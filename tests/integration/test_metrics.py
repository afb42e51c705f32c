"""`cudatrace metrics` scraped by a real Prometheus (Debian's `prometheus`, started here on
127.0.0.1 and always stopped) while groups and traced runs go on, on the simulated driver:
queries through Prometheus's HTTP API return the limits, in-use bytes and denial counts
`status --json` gives at that moment, and the live bytes of the traced runs (a full trace and an
--aggregate one) as `report` gives them, each within one scrape, also while a run's live bytes
change in place (its trace files keep their size and time). And without Prometheus: a run traced
through the environment whose process is killed drops out; a killed process's memory ends.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from support import children

GiB = 1 << 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except OSError as e:
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} ({last})")


class Procs:
    def __init__(self):
        self.procs = []

    def start(self, cmd, env, **kw):
        p = children.popen(list(map(str, cmd)), env=env, text=True, **kw)
        self.procs.append(p)
        return p

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate(timeout=20)


@pytest.fixture
def procs():
    ps = Procs()
    try:
        yield ps
    finally:
        ps.stop()


def _member(procs, env, hold, *opts, n=1, size="1g"):
    p = procs.start(
        [sys.executable, "-m", "cudatrace", "run", "-q", *opts, "--", hold, n, size],
        env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    for line in children.lines(p):
        if line.strip() == "ready":
            return p
    raise AssertionError(f"member {opts} never became ready: {children.said(p)}")


def _prom_query(base: str, q: str) -> list[dict]:
    r = json.loads(_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})))
    assert r["status"] == "success", r
    return r["data"]["result"]


def _metrics_and_prometheus(procs, env, tmp_path) -> str:
    """`cudatrace metrics --traces tmp_path/runs` and a Prometheus scraping it every 2 s; the
    base URL of Prometheus's API, once it is ready."""
    if not shutil.which("prometheus"):
        pytest.fail("prometheus is not installed: .ci/run installs Debian's `prometheus`")
    mport, pport = _free_port(), _free_port()
    procs.start(
        [sys.executable, "-m", "cudatrace", "metrics", "--listen", f"127.0.0.1:{mport}",
         "--traces", tmp_path / "runs", "--trace-interval", "0"],
        env, stderr=subprocess.PIPE,
    )  # fmt: skip
    page = _wait(lambda: _get(f"http://127.0.0.1:{mport}/metrics"), 30, "cudatrace metrics")
    assert "cudatrace_budget_denials_total" in page and "cudatrace_build_info{" in page
    conf = tmp_path / "prometheus.yml"
    conf.write_text(
        "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n"
        "scrape_configs:\n  - job_name: cudatrace\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{mport}']\n"
    )
    prom_log = open(tmp_path / "prometheus.log", "w")
    procs.start(
        ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{pport}"],
        env, stdout=prom_log, stderr=prom_log,
    )  # fmt: skip
    base = f"http://127.0.0.1:{pport}"
    try:
        _wait(lambda: "Ready" in _get(f"{base}/-/ready"), 60, "Prometheus to be ready")
    except AssertionError:
        print((tmp_path / "prometheus.log").read_text()[-4000:])
        raise
    return base


def _scraped_after(base: str, after: float, tmp_path) -> None:
    """Until Prometheus holds a successful scrape that began after `after` (time.time())."""

    def scraped():
        res = _prom_query(base, 'timestamp(up{job="cudatrace"}) and up{job="cudatrace"} == 1')
        return res and float(res[0]["value"][1]) > after

    try:
        _wait(scraped, 60, "a scrape after the figures were taken")
    except AssertionError:
        print((tmp_path / "prometheus.log").read_text()[-4000:])
        raise


def test_prometheus_scrapes_budgets_and_traces(ct, sim, procs, tmp_path):
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700)
    env = ct.env(state=sim.new_state(), total_bytes=10 * GiB)
    env["CUDATRACE_LEDGER_DIR"] = str(ledgers)
    hold = sim.progs["hold"]
    ta, tb = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    # group ga: 3 GiB; one traced member takes 3 x 1 GiB and is denied a 4th
    run_a = _member(procs, env, hold, "-o", ta, "--group", "ga", "--budget", "3GiB", n=4)
    # group gb: 2 GiB; an --aggregate member holds 1 GiB, another gets 1 GiB and is denied 1
    _member(procs, env, hold, "--aggregate", "-o", tb, "--group", "gb", "--budget", "2GiB")
    _member(procs, env, hold, "--no-trace", "--group", "gb", n=2)

    base = _metrics_and_prometheus(procs, env, tmp_path)
    r = ct.cli("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    _scraped_after(base, time.time(), tmp_path)

    def one(q: str) -> float:
        res = _prom_query(base, q)
        assert len(res) == 1, (q, res)
        return float(res[0]["value"][1])

    groups = {s["group"]: s for s in status["ledgers"]}
    assert set(groups) == {"ga", "gb"}
    for g, s in groups.items():
        d0 = next(r for r in s["devices"] if r["device"] == 0)
        sel = f'{{group="{g}",device="0"}}'
        assert one(f"cudatrace_budget_limit_bytes{sel}") == d0["limit"]
        assert one(f"cudatrace_budget_in_use_bytes{sel}") == d0["in_use"]
        assert one(f"cudatrace_budget_denials_total{sel}") == d0["denials"]
        alive = [m for m in s["members"] if m["state"] == "alive"]
        assert one(f'cudatrace_budget_members{{group="{g}"}}') == len(alive)
        for m in alive:
            msel = f'{{group="{g}",device="0",pid="{m["pid"]}",slot="{m["slot"]}",command="hold"}}'
            assert one(f"cudatrace_budget_member_in_use_bytes{msel}") == m["devices"]["0"]["held"]
    assert (
        groups["ga"]["devices"][0]["in_use"] == 3 * GiB
        and groups["ga"]["devices"][0]["denials"] == 1
    )
    assert (
        groups["gb"]["devices"][0]["in_use"] == 2 * GiB
        and groups["gb"]["devices"][0]["denials"] == 1
    )

    # the traced runs: what each holds, and its top site
    assert one('cudatrace_trace_run_live_bytes{run="a",device="0"}') == 3 * GiB
    assert one('cudatrace_trace_run_live_bytes{run="b",device="0"}') == 1 * GiB
    for run, held in (("a", 3 * GiB), ("b", 1 * GiB)):
        res = _prom_query(base, f'cudatrace_trace_live_bytes{{run="{run}",device="0"}}')
        sites = {r["metric"]["site"]: float(r["value"][1]) for r in res}
        top = max(sites, key=sites.get)
        assert "hold_alloc" in top and sites[top] == held, sites
        assert res[0]["metric"]["command"] == "hold"

    # the Grafana dashboard's queries are valid PromQL over these metrics, and the budget
    # panels find series
    dash = json.loads(
        (Path(__file__).resolve().parents[2] / "docs/grafana-cudatrace.json").read_text()
    )
    for panel in dash["panels"]:
        for t in panel["targets"]:
            q = t["expr"].replace("$group", ".*").replace("$run", ".*")
            res = _prom_query(base, q)
            if "share" not in q and "denials" not in q:
                assert res, (panel["title"], q)

    # while it serves: a group appears, a traced run and its group's last member end
    _member(procs, env, hold, "--no-trace", "--group", "gc", "--budget", "1GiB")
    run_a.terminate()
    run_a.communicate(timeout=30)

    def caught_up():
        gc = _prom_query(base, 'cudatrace_budget_in_use_bytes{group="gc",device="0"}')
        ga = _prom_query(base, 'cudatrace_budget_members{group="ga"}')
        a = _prom_query(base, 'cudatrace_trace_run_live_bytes{run="a"}')
        return gc and float(gc[0]["value"][1]) == GiB and ga and ga[0]["value"][1] == "0" and not a

    _wait(caught_up, 60, "the new group, and run a gone")
    assert one('up{job="cudatrace"}') == 1


SIM_UUID0 = "GPU-5ca1ab1e-0000-4000-8000-000000000000"  # the simulated NVML's device 0


def test_prometheus_follows_a_run_as_it_is_written(ct, sim, procs, tmp_path):
    # a traced run's live bytes change step by step; its trace files keep their size and time
    # (chunks preallocated, written through a mapping): after each step, the first scrape that
    # began after it holds what `status --json` and `report` say at that moment
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700)
    env = ct.env(state=sim.new_state(), total_bytes=10 * GiB)
    env["CUDATRACE_LEDGER_DIR"] = str(ledgers)
    run = tmp_path / "runs" / "s"
    p = procs.start(
        [sys.executable, "-m", "cudatrace", "run", "-q", "-o", run, "--group", "gs",
         "--budget", "8GiB", "--", sim.progs["steps"]],
        env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert children.readline(p).strip() == "ready"
    base = _metrics_and_prometheus(procs, env, tmp_path)
    trace, sizes = None, set()
    for cmd in ("a 1g", "a 1g", "f", "a 512m", "f"):
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        assert children.readline(p).strip() == "ok", cmd
        trace = trace or next(run.glob("*.ctrace"))
        st = json.loads(ct.cli("status", "--json", env=env).stdout)
        rep = ct.cli("report", run, "--json", env=env)
        assert rep.returncode == 0, rep.stderr
        held = json.loads(rep.stdout)["end_bytes"]
        in_use = next(g for g in st["ledgers"] if g["group"] == "gs")["devices"][0]["in_use"]
        assert held == in_use, (cmd, held, in_use)
        _scraped_after(base, time.time(), tmp_path)
        sel = f'{{run="s",device="0",gpu="0",UUID="{SIM_UUID0}"}}'
        res = _prom_query(base, f"cudatrace_trace_run_live_bytes{sel}")
        assert [float(r["value"][1]) for r in res] == [held], (cmd, res)
        res = _prom_query(
            base, f'cudatrace_budget_in_use_bytes{{group="gs",gpu="0",UUID="{SIM_UUID0}"}}'
        )
        assert [float(r["value"][1]) for r in res] == [in_use], (cmd, res)
        sizes.add(trace.stat().st_size)
    assert len(sizes) == 1  # the trace never grew: its chunk is written in place


def test_a_killed_environment_traced_run_drops_out(ct, sim, tmp_path):
    from cudatrace import native
    from cudatrace.present.metrics import TraceCache

    d = tmp_path / "runs" / "envrun"
    d.mkdir(parents=True)
    env = ct.env()
    env.update(LD_PRELOAD=str(native.shim_path()), CUDATRACE_DIR=str(d))
    hold = str(sim.progs["hold"])
    procs = []
    try:
        for size in ("1m", "2m"):
            procs.append(children.popen([hold, "1", size], env=env, stdout=subprocess.PIPE))
            for line in children.lines(procs[-1]):
                if line.strip() == b"ready":
                    break
        cache = TraceCache([tmp_path / "runs"], 5, 0, symbolize=False)
        (r,) = cache.runs()
        assert r["command"] == "hold" and r["devices"][0]["live"] == 3 << 20, r
        # one process killed (no exit record): its memory ends, the run goes on with the other
        procs[0].kill()
        procs[0].wait()
        (r,) = cache.runs()
        assert r["devices"][0]["live"] == 2 << 20, r
        # both killed: the run is over, no longer exported
        procs[1].kill()
        procs[1].wait()
        assert cache.runs() == []
    finally:
        for q in procs:
            q.kill()
            q.wait()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_the_server_stops_on_a_signal_it_inherited_ignored(ct, sim, procs, sig):
    # a shell starts a background job with SIGINT ignored, and that is inherited: the server
    # takes both signals itself, stops and exits 0
    port = _free_port()

    def ignore():
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)

    env = ct.env()
    p = procs.start([sys.executable, "-m", "cudatrace", "metrics", "--listen", f"127.0.0.1:{port}"],
                    env, preexec_fn=ignore, stderr=subprocess.PIPE)  # fmt: skip
    _wait(lambda: _get(f"http://127.0.0.1:{port}/metrics"), 30, "the metrics server")
    p.send_signal(getattr(signal, sig))
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
