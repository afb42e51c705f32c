"""`cudatrace metrics` without servers: the top-N-plus-other bound on a run's sites, runs that
ended dropping out, and the exposition (names, _total counters, the labels' bounds)."""

from __future__ import annotations

import json

from cudatrace.analyze import live
from cudatrace.present.metrics import Collector, TraceCache
from support.tracegen import BASE_TS, MS, TraceWriter

MiB = 1 << 20


def _run(d, sizes, ended=False):
    d.mkdir(parents=True)
    w = TraceWriter(d / "1000.0.ctrace", pid=1000)
    w.module("/usr/bin/app", 0x400000, 0x500000)
    for i, size in enumerate(sizes):
        leaf = w.stack([0x401000 + 0x100 * i, 0x402000])
        w.alloc(BASE_TS + (i + 1) * MS, size, 0x7F0000000000 + i * (1 << 30), stack=leaf)
    w.close(clean=ended)
    run = {"argv": ["/opt/bin/server", "--x"], "start_monotonic_ns": BASE_TS - MS}
    if ended:
        run["exit_status"] = 0
    (d / "run.json").write_text(json.dumps(run))


def test_top_sites_and_other(tmp_path):
    _run(tmp_path / "r", [5 * MiB, 3 * MiB, 1 * MiB])
    data = live.top_sites(tmp_path / "r", top=1)
    dev = data["devices"][0]
    assert dev["live"] == 9 * MiB and data["command"] == "server"
    (top, b), (other, rest) = dev["sites"].items()
    assert b == 5 * MiB and other == "other" and rest == 4 * MiB
    assert len(live.top_sites(tmp_path / "r", top=5)["devices"][0]["sites"]) == 3


def _ledgers():
    members = [
        {"pid": 10 + i, "state": "alive", "share": "41" if i else None, "share_limit": 2 << 30,
         "devices": {0: {"held": i * MiB, "peak": i * MiB, "denials": i}}}
        for i in range(3)
    ] + [{"pid": 99, "state": "dead", "devices": {0: {"held": 1, "peak": 1, "denials": 0}}}]  # fmt: skip
    devices = [
        {"device": d, "limit": 8 << 30, "in_use": 3 * MiB if d == 0 else 0,
         "peak": 3 * MiB if d == 0 else 0, "denials": 3 if d == 0 else 0, "contexts": 0}
        for d in range(16)
    ]  # fmt: skip
    return {
        "ledgers": [{"path": "/l/gpu0.ledger", "devices": devices, "members": members}],
        "errors": [{"path": "/l/bad.ledger", "error": "refused"}],
    }


def test_exposition(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    _run(tmp_path / "runs" / "a", [5 * MiB, 3 * MiB])
    _run(tmp_path / "runs" / "old", [7 * MiB], ended=True)  # ended: not exported
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector(_ledgers, TraceCache([tmp_path / "runs"], 1, 0, symbolize=False)))
    text = generate_latest(reg).decode()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert 'cudatrace_budget_limit_bytes{device="0",group="gpu0"} 8.589934592e+09' in lines
    assert not any('device="1"' in ln for ln in lines)  # idle devices of a bare budget: none
    assert 'cudatrace_budget_denials_total{device="0",group="gpu0"} 3.0' in lines
    assert 'cudatrace_budget_members{group="gpu0"} 3.0' in lines  # the dead one is not counted
    assert sum(ln.startswith("cudatrace_budget_member_in_use_bytes{") for ln in lines) == 3
    assert (
        'cudatrace_budget_share_in_use_bytes{device="0",group="gpu0",share="41"} 3.145728e+06'
        in lines
    )
    assert "cudatrace_ledger_errors 1.0" in lines
    runs = [ln for ln in lines if ln.startswith("cudatrace_trace_live_bytes{")]
    assert len(runs) == 2 and all('run="a"' in ln and 'command="server"' in ln for ln in runs)
    assert any('site="other"' in ln and ln.endswith(" 3.145728e+06") for ln in runs)
    assert (
        'cudatrace_trace_run_live_bytes{command="server",device="0",run="a"} 8.388608e+06' in lines
    )
    assert "# TYPE cudatrace_budget_denials_total counter" in text
