"""`cudatrace metrics` without servers: the top-N-plus-other bound on a run's sites, runs that
ended dropping out, and the exposition (names, _total counters, the labels' bounds)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import subprocess
import sys
import threading
import time

import cudatrace
from cudatrace.analyze.documents import live
from cudatrace.analyze.read import trace as trace_mod
from cudatrace.analyze.read.trace import C
from cudatrace.present.metrics import Collector, Gpus, TraceCache
from support import children
from support.tracegen import BASE_TS, MS, TraceWriter

MiB = 1 << 20


def _run(d, sizes, ended=False):
    d.mkdir(parents=True)
    w = TraceWriter(d / "1000.0.ctrace", pid=1000, header={"flags": C()["CT_FH_LIVE_LOCK"]})
    w.module("/usr/bin/app", 0x400000, 0x500000)
    for i, size in enumerate(sizes):
        leaf = w.stack([0x401000 + 0x100 * i, 0x402000])
        w.alloc(BASE_TS + (i + 1) * MS, size, 0x7F0000000000 + i * (1 << 30), stack=leaf)
    w.close(clean=ended)
    run = {"argv": ["/opt/bin/server", "--x"], "start_monotonic_ns": BASE_TS - MS}
    if ended:
        run["exit_status"] = 0
    (d / "run.json").write_text(json.dumps(run))


@contextlib.contextmanager
def _launcher(d):
    """A run going on: its launcher's hold on the trace directory (a flock on
    .cudatrace.lock) and its processes' on their traces (the shim's lock, CT_FH_LIVE_LOCK)."""
    fds = [os.open(d / ".cudatrace.lock", os.O_RDWR | os.O_CREAT, 0o600)]
    try:
        fcntl.flock(fds[0], fcntl.LOCK_EX)
        fds += [_writer_lock(t) for t in d.glob("*.ctrace")]
        yield
    finally:
        for fd in fds:
            os.close(fd)


def test_top_sites_and_other(tmp_path):
    _run(tmp_path / "r", [5 * MiB, 3 * MiB, 1 * MiB])
    data = live.top_sites(tmp_path / "r", top=1)
    dev = data["devices"][0]
    assert dev["device"] == 0 and dev["gpu"] == "0"
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
    with _launcher(tmp_path / "runs" / "a"):
        reg = CollectorRegistry(auto_describe=False)
        cache = TraceCache([tmp_path / "runs"], 1, 0, symbolize=False)
        gpus = Gpus({0: "GPU-aaaa", 1: "GPU-bbbb"}, None)
        reg.register(Collector(_ledgers, cache, gpus))
        text = generate_latest(reg).decode()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    dev0 = 'UUID="GPU-aaaa",device="0",gpu="0"'
    assert f'cudatrace_budget_limit_bytes{{{dev0},group="gpu0"}} 8.589934592e+09' in lines
    assert not any('device="1"' in ln for ln in lines)  # idle devices of a bare budget: none
    assert f'cudatrace_budget_denials_total{{{dev0},group="gpu0"}} 3.0' in lines
    assert 'cudatrace_budget_members{group="gpu0"} 3.0' in lines  # the dead one is not counted
    assert sum(ln.startswith("cudatrace_budget_member_in_use_bytes{") for ln in lines) == 3
    assert (
        f'cudatrace_budget_share_in_use_bytes{{{dev0},group="gpu0",share="41"}} 3.145728e+06'
        in lines
    )
    assert "cudatrace_ledger_errors 1.0" in lines
    runs = [ln for ln in lines if ln.startswith("cudatrace_trace_live_bytes{")]
    assert len(runs) == 2 and all('run="a"' in ln and 'command="server"' in ln for ln in runs)
    assert any('site="other"' in ln and ln.endswith(" 3.145728e+06") for ln in runs)
    path = str(tmp_path / "runs" / "a")
    assert (
        'cudatrace_trace_run_live_bytes{UUID="GPU-aaaa",command="server",device="0",gpu="0",'
        f'path="{path}",run="a"}} 8.388608e+06' in lines
    ), lines
    assert "# TYPE cudatrace_budget_denials_total counter" in text
    # what serves them
    build = [ln for ln in lines if ln.startswith("cudatrace_build_info{")]
    assert build == [
        'cudatrace_build_info{python="%s",trace_format="%d",version="%s"} 1.0'
        % (sys.version.split()[0], C()["CT_FORMAT_VERSION"], cudatrace.__version__)
    ]


def _exposition(collector) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return generate_latest(reg).decode()


def _samples(text: str) -> dict[str, float]:
    """series (name and labels) -> value; every series once, or the test fails."""
    out: dict[str, float] = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            key, value = ln.rsplit(" ", 1)
            assert key not in out, f"two series share a label set: {key}"
            out[key] = float(value)
    return out


NAME_ME = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"\xff\xfebad\x1b[2J", 0, 0, 0)  # PR_SET_NAME
print("ready", flush=True)
time.sleep(60)
"""


def _one_group(members: list[dict]) -> dict:
    devices = [{"device": 0, "limit": 8 << 30, "in_use": 7 * MiB, "peak": 7 * MiB, "denials": 0}]
    return {"ledgers": [{"path": "/l/g.ledger", "devices": devices, "members": members}]}


def _member(slot: int, pid: int, held: int, other_ns: bool = False) -> dict:
    return {"slot": slot, "pid": pid, "state": "alive", "other_pidns": other_ns,
            "devices": {0: {"held": held, "peak": held, "denials": 0}}}  # fmt: skip


def test_bytes_that_are_not_utf8_never_blank_a_scrape(tmp_path):
    # a member whose process name is not UTF-8 (any job sharing the ledger can name itself so),
    # and a --traces run whose directory name is not: every other series is still served
    child = children.popen([sys.executable, "-c", NAME_ME], stdout=subprocess.PIPE)
    try:
        assert children.readline(child).strip() == b"ready"
        ledgers = _one_group([_member(0, child.pid, 7 * MiB)])
        d = tmp_path / os.fsdecode(b"run-\xff\xfe")
        _run(d, [5 * MiB])
        with _launcher(d):
            text = _exposition(
                Collector(lambda: ledgers, TraceCache([tmp_path], 5, 0, symbolize=False))
            )
    finally:
        child.kill()
        child.wait()
    s = _samples(text)
    member = [k for k in s if k.startswith("cudatrace_budget_member_in_use_bytes{")]
    assert len(member) == 1 and 'command="\\\\xff\\\\xfebad\\\\x1b[2J"' in member[0], member
    assert s['cudatrace_budget_members{group="g"}'] == 1
    runs = [k for k in s if k.startswith("cudatrace_trace_run_live_bytes{")]
    assert len(runs) == 1 and 'run="run-\\\\xff\\\\xfe"' in runs[0], runs
    assert s[runs[0]] == 5 * MiB


def test_no_two_series_share_a_label_set(tmp_path):
    # two containers' pid 1 in one group (each in its own pid namespace), and two runs whose
    # host folders have one name (docs/ranks.md's layout: run1/hostA, run2/hostA)
    ledgers = _one_group([_member(0, 1, 4 * MiB, True), _member(1, 1, 3 * MiB, True)])
    for run, size in (("run1", 5 * MiB), ("run2", 2 * MiB)):
        _run(tmp_path / run / "hostA", [size])
    with _launcher(tmp_path / "run1" / "hostA"), _launcher(tmp_path / "run2" / "hostA"):
        cache = TraceCache([tmp_path / "run1", tmp_path / "run2"], 5, 0, symbolize=False)
        s = _samples(_exposition(Collector(lambda: ledgers, cache)))
    members = {k: v for k, v in s.items() if k.startswith("cudatrace_budget_member_in_use")}
    assert len(members) == 2 and sum(members.values()) == 7 * MiB, members
    runs = {k: v for k, v in s.items() if k.startswith("cudatrace_trace_run_live_bytes{")}
    assert len(runs) == 2 and sorted(runs.values()) == [2 * MiB, 5 * MiB], runs
    assert all('run="hostA"' in k for k in runs)


def test_gpu_and_uuid_labels():
    g = Gpus({0: "GPU-aaaa", 1: "GPU-bbbb", 2: "GPU-cccc"}, "2,0")
    assert g.of_ordinal(0) == ("2", "GPU-cccc")  # the exporter's CUDA_VISIBLE_DEVICES
    assert g.of_ordinal(1) == ("0", "GPU-aaaa")
    assert g.of_ordinal(2) == ("", "")  # no such device there
    assert g.of_entry("GPU-bbbb") == ("1", "GPU-bbbb")  # a traced process's entry, a UUID
    assert g.of_entry("MIG-1/2/3") == ("", "")
    assert Gpus().of_ordinal(3) == ("3", "")  # without NVML


def test_a_scrape_never_waits_for_a_whole_analysis(tmp_path, monkeypatch):
    # the analysis of a big trace takes seconds: the scrape is answered without it (the budgets
    # at once, the run once its figures are there), never after it
    _run(tmp_path / "a", [5 * MiB])
    release = threading.Event()
    real = live.figures

    def slow(*args, **kw):
        release.wait(120)
        return real(*args, **kw)

    monkeypatch.setattr(live, "figures", slow)
    with _launcher(tmp_path / "a"):
        cache = TraceCache([tmp_path], 5, 0, symbolize=False, wait=0.5)
        cache.start()
        col = Collector(_ledgers, cache)
        got: list[str] = []
        scrape = threading.Thread(target=lambda: got.append(_exposition(col)))
        scrape.start()
        scrape.join(60)
        assert got and not release.is_set(), "the scrape waited for the analysis"
        s = _samples(got[0])
        assert s['cudatrace_budget_members{group="gpu0"}'] == 3
        assert not any(k.startswith("cudatrace_trace_run_live_bytes") for k in s)
        release.set()
        for _ in range(600):  # the figures, once read
            s = _samples(_exposition(col))
            runs = [k for k in s if k.startswith("cudatrace_trace_run_live_bytes")]
            if runs:
                break
            time.sleep(0.1)
        assert runs and s[runs[0]] == 5 * MiB
        ages = [v for k, v in s.items() if k.startswith("cudatrace_trace_age_seconds{")]
        assert len(ages) == 1 and ages[0] >= 0


def _writer_lock(path) -> int:
    """What a live shim holds on its trace: an OFD read lock on byte 0 (CT_FH_LIVE_LOCK)."""
    fd = os.open(path, os.O_RDONLY)
    fl = struct.pack("hh4xqqi4x", fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0)
    fcntl.fcntl(fd, getattr(fcntl, "F_OFD_SETLK", 37), fl)
    return fd


def test_a_run_is_read_again_only_when_written(tmp_path, monkeypatch):
    # traced through the environment (no run.json): the run lives while its writer holds its
    # lock; each scrape looks at what was written, and analyzes only when something was
    d = tmp_path / "envrun"
    d.mkdir()
    w = TraceWriter(d / "1000.0.ctrace", pid=1000, header={"flags": C()["CT_FH_LIVE_LOCK"]})
    w.module("/usr/bin/app", 0x400000, 0x500000)
    w.alloc(BASE_TS + MS, 5 * MiB, 0x7F0000000000, stack=w.stack([0x401000, 0x402000]))
    w.close(clean=False)
    reads = []
    for mod in (live, trace_mod):
        real = mod.read_dir
        monkeypatch.setattr(mod, "read_dir", lambda p, real=real: reads.append(p) or real(p))
    fd = _writer_lock(d / "1000.0.ctrace")
    try:
        col = Collector(_ledgers, TraceCache([d], 5, 0, symbolize=False))
        for _ in range(3):
            s = _samples(_exposition(col))
            runs = [k for k in s if k.startswith("cudatrace_trace_run_live_bytes")]
            assert len(runs) == 1 and s[runs[0]] == 5 * MiB and 'command="app"' in runs[0]
        assert len(reads) == 1, reads
        # written in place (the file keeps its size and its time): read again
        data = bytearray((d / "1000.0.ctrace").read_bytes())
        st = os.stat(d / "1000.0.ctrace")
        with open(d / "1000.0.ctrace", "r+b") as f:
            f.write(bytes(data[:300]) + b"\x01" + bytes(data[301:400]))
        os.utime(d / "1000.0.ctrace", ns=(st.st_atime_ns, st.st_mtime_ns))
        _exposition(col)
        assert len(reads) == 2, reads
    finally:
        os.close(fd)
    # its writer gone (killed: no exit record), the run is no longer exported
    s = _samples(_exposition(col))
    assert not any(k.startswith("cudatrace_trace_run_live_bytes") for k in s)


def _private(path: str, in_use: int, denials: int) -> dict:
    devices = [{"device": 0, "limit": 40 * MiB, "in_use": in_use, "peak": in_use,
                "denials": denials, "contexts": 0}]  # fmt: skip
    members = [_member(0, 100, in_use)]
    return {"path": path, "private": True, "devices": devices, "members": members}


def test_ad_hoc_runs_are_summed_and_their_denials_never_go_down():
    """`cudatrace run --budget`'s private ledgers (@run-<pid>-<random>) are one group "@run":
    no series a run (a host's runs would churn), no members; the denials of a run that ended
    stay in the counter."""
    st = {"ledgers": [_private("/l/@run-1-ab.ledger", 30 * MiB, 2),
                      _private("/l/@run-2-cd.ledger", 10 * MiB, 1)], "errors": []}  # fmt: skip
    col = Collector(lambda: st, gpus=Gpus({0: "GPU-aaaa"}, None))
    got = _samples(_exposition(col))
    dev0 = 'UUID="GPU-aaaa",device="0",gpu="0",group="@run"'
    assert got[f"cudatrace_budget_in_use_bytes{{{dev0}}}"] == 40 * MiB
    assert got[f"cudatrace_budget_denials_total{{{dev0}}}"] == 3
    assert got['cudatrace_budget_members{group="@run"}'] == 2
    assert not [k for k in got if "@run-" in k or k.startswith("cudatrace_budget_member_in_use")]
    st["ledgers"] = [_private("/l/@run-2-cd.ledger", 10 * MiB, 1)]  # the first run ended
    got = _samples(_exposition(col))
    assert got[f"cudatrace_budget_denials_total{{{dev0}}}"] == 3
    assert got[f"cudatrace_budget_in_use_bytes{{{dev0}}}"] == 10 * MiB
    st["ledgers"] = []
    got = _samples(_exposition(col))
    assert got[f"cudatrace_budget_denials_total{{{dev0}}}"] == 3
    assert got['cudatrace_budget_members{group="@run"}'] == 0


def test_a_live_runs_device_reads_0_once_it_holds_nothing(tmp_path, monkeypatch):
    """A run that freed everything on a device keeps its series at 0 while it runs."""
    figs = [{"run": "r", "path": "/t/r", "command": "x",
             "devices": [{"device": 0, "gpu": "0", "live": 5 * MiB, "sites": {"f": 5 * MiB}}]},
            {"run": "r", "path": "/t/r", "command": "x", "devices": []}]  # fmt: skip
    monkeypatch.setattr(live, "run_dirs", lambda paths: [tmp_path])
    monkeypatch.setattr(live, "running", lambda p: True)
    monkeypatch.setattr(live, "signature", lambda p: len(figs))
    monkeypatch.setattr(live, "figures", lambda p, top, sym: figs.pop(0))
    cache = TraceCache([tmp_path], 10, 0, symbolize=False)
    col = Collector(lambda: {"ledgers": [], "errors": []}, cache, Gpus({0: "GPU-aaaa"}, None))
    key = 'cudatrace_trace_run_live_bytes{UUID="GPU-aaaa",command="x",device="0",gpu="0",path="/t/r",run="r"}'
    assert _samples(_exposition(col))[key] == 5 * MiB
    assert _samples(_exposition(col))[key] == 0
