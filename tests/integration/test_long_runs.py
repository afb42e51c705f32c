"""Long runs on a shared box, on the simulated driver: a full trace of 600,000 events
from repeated sites stays under 40 bytes an event (compact records); `--aggregate` stays under
2 MiB and still reports the exact peak and the KV site's exact bytes, also after a SIGKILL;
`--no-trace` enforces a budget and writes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from cudatrace.analyze.read.trace import read_dir
from cudatrace.errors import RUN_FAILED
from support import children

MiB = 1 << 20
ITERS = 150_000  # 4 events each: 600,000 events, plus the KV layers and the spike
LAYERS, KV = 28, 4 * MiB


def expected(stdout: str) -> dict:
    line = next(l for l in stdout.splitlines() if l.startswith("peak "))
    p = line.split()
    return {"peak": int(p[1]), "kv": int(p[3]), "events": int(p[5])}


def kv_site(report: dict) -> dict:
    return next(s for s in report["sites"] if "kv_layer" in s["label"])


def test_full_trace_is_at_most_40_bytes_an_event(ct, sim):
    r = ct.run([sim.progs["churn"], ITERS, LAYERS, "4m"], "-q", timeout=300)
    assert r.returncode == 0, r.stderr
    want = expected(r.stdout)
    td = read_dir(r.out)
    (t,) = td.traces
    assert t.n_events == want["events"] >= 600_000 and t.complete
    per_event = os.path.getsize(t.path) / t.n_events
    print(
        f"full trace: {os.path.getsize(t.path)} bytes, {t.n_events} events, {per_event:.1f} B/event"
    )
    assert per_event <= 40, per_event
    rep = json.loads(ct.cli("report", r.out, "--json").stdout)
    assert rep["peak_bytes"] == want["peak"]
    assert rep["never_freed"]["bytes"] == want["kv"]


def aggregate_run(ct, sim, *extra):
    r = ct.run([sim.progs["churn"], ITERS, LAYERS, "4m"], "-q", "--aggregate", *extra, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_aggregate_is_small_and_exact(ct, sim):
    r = aggregate_run(ct, sim)
    want = expected(r.stdout)
    (f,) = list(r.out.glob("*.ctrace"))
    st = f.stat()
    print(
        f"aggregate: {st.st_size} bytes ({st.st_blocks * 512} on disk) for {want['events']} events"
    )
    assert st.st_size <= 2 * MiB
    rep = json.loads(ct.cli("report", r.out, "--json").stdout)
    assert rep["peak_bytes"] == want["peak"]
    kv = kv_site(rep)
    assert kv["bytes"] == want["kv"] and kv["count"] == LAYERS
    assert rep["never_freed"]["bytes"] == want["kv"]
    assert rep["processes"][0]["allocs"] == 2 * ITERS + LAYERS + 1
    assert rep["processes"][0]["frees"] == 2 * ITERS + 1
    assert any("aggregate trace" in w for w in rep["warnings"])
    agg = rep["aggregate"]["files"][0]
    assert agg["reason"] == "exit" and agg["allocs"] == 2 * ITERS + LAYERS + 1
    totals = {t["frames"][0]["function"] if t["frames"] else "?": t for t in agg["totals"]}
    assert totals["loop_async"]["allocs"] == ITERS
    assert totals["loop_async"]["alloc_bytes"] == ITERS * 256 * 1024
    assert totals["loop_async"]["freed_bytes"] == ITERS * 256 * 1024
    # the same run in full: diff says nothing changed at the peak; exports read it
    full = ct.run([sim.progs["churn"], 2000, LAYERS, "4m"], "-q")
    d = ct.cli("diff", full.out, r.out, "--json")
    assert d.returncode == 0, d.stderr
    out = ct.base / "agg.folded"
    e = ct.cli("export", r.out, "--format", "folded", "-o", out)
    assert e.returncode == 0, e.stderr
    assert "kv_layer" in out.read_text()


def test_aggregate_survives_sigkill_mid_run(ct, sim, tmp_path):
    """Killed in the middle of its loop: the last complete snapshot (the spike's peak) reads."""
    from cudatrace import native

    out = tmp_path / "killed"
    out.mkdir()
    env = sim.env()
    env.update(
        LD_PRELOAD=str(native.shim_path()),
        LD_BIND_NOW="1",
        CUDATRACE_DIR=str(out),
        CUDATRACE_MODE="aggregate",
    )
    p = children.popen(
        [str(sim.progs["churn"]), "2000000", str(LAYERS), "4m"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert children.readline(p).strip() == "spiked"
        time.sleep(0.2)  # well inside the loop's second half
        assert p.poll() is None
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.wait()
    rep = json.loads(ct.cli("report", out, "--json").stdout)
    assert rep["processes"][0]["status"] == "truncated"
    assert rep["peak_bytes"] == LAYERS * KV + (256 << 10) + (64 << 10) + (8 << 20)
    assert kv_site(rep)["bytes"] == LAYERS * KV
    assert any("did not exit cleanly" in w for w in rep["warnings"])


def test_a_torn_snapshot_falls_back_to_the_other_slot(ct, sim, tmp_path):
    from cudatrace.analyze.read.aggregate import read_snapshot
    from cudatrace.analyze.read.trace import read_trace

    r = aggregate_run(ct, sim)
    (f,) = list(r.out.glob("*.ctrace"))
    t = read_trace(f)
    good = read_snapshot(t.snap_slots)
    assert good.valid == 2 and good.head["reason"] == 1  # exit, the newest
    newest = max(
        range(len(t.snap_slots)), key=lambda i: int.from_bytes(t.snap_slots[i][8:16], "little")
    )
    torn = list(t.snap_slots)
    b = bytearray(torn[newest])
    b[8 + 300] ^= 0xFF  # a body byte the kill left half-written
    torn[newest] = bytes(b)
    older = read_snapshot(torn)
    assert older.valid == 1 and older.head["seq"] == good.head["seq"] - 1


def test_no_trace_enforces_and_writes_nothing(ct, sim, tmp_path, monkeypatch):
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700)
    work = tmp_path / "work"
    work.mkdir()
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(ledgers)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "--no-trace",
            "--budget",
            "100MiB",
            "--",
            str(sim.progs["hold"]),
            "--exit-after-ms",
            "10",
            "2",
            "64m",
        ],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stderr  # the second 64 MiB is denied
    assert "cudatrace: budget exceeded" in r.stderr
    assert list(work.iterdir()) == []  # no trace directory, nothing
    bad = subprocess.run(
        [sys.executable, "-m", "cudatrace", "run", "--no-trace", "--", "true"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == RUN_FAILED and "--budget" in bad.stderr


def test_aggregate_keeps_denials_in_full(ct, sim, tmp_path):
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700)
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(ledgers)
    r = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "10", "3", "64m"],
        "-q",
        "--aggregate",
        "--budget",
        "150MiB",
        env=env,
    )
    assert r.returncode == 1, r.stderr  # the third 64 MiB is denied
    rep = json.loads(ct.cli("report", r.out, "--json").stdout)
    assert rep["peak_bytes"] == 128 * MiB
    assert [d["count"] for d in rep["denied"]] == [1]
    assert rep["denied"][0]["limit"] == 150 * MiB and rep["denied"][0]["in_use"] == 128 * MiB
    assert "hold_alloc" in rep["denied"][0]["label"]


def test_exited_threads_give_their_numbers_back(ct, sim):
    """300 threads one after another: each takes the number the last one gave back, so the
    reader keeps two contexts (the main thread's and one), and every event is exact."""
    r = ct.run([sim.progs["churn"], 100, 2, "1m", 0, 300], "-q")
    assert r.returncode == 0, r.stderr
    want = expected(r.stdout)
    (t,) = read_dir(r.out).traces
    assert t.n_events == want["events"] and t.bad_events == 0 and t.gaps == 0
    assert t.threads == 2
    assert len({e[5] for e in t.events}) == 301  # every thread's own tid
    rep = json.loads(ct.cli("report", r.out, "--json").stdout)
    assert rep["processes"][0]["allocs"] == 2 * 100 + 2 + 1 + 3 * 300


def test_no_trace_group_member_shows_in_status(ct, sim, tmp_path):
    """A --no-trace member of a group holds its bytes in the ledger, which status reads (and
    which is all it writes); another member is held to what is left."""
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700)
    work = tmp_path / "work"
    work.mkdir()
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(ledgers)
    a = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "--no-trace",
            "--group",
            "wk",
            "--budget",
            "1GiB",
            "--",
            str(sim.progs["hold"]),
            "1",
            "600m",
        ],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in children.lines(a):
            if line.strip() == "ready":
                break
        st = ct.cli("status", "wk", "--json", env=env)
        assert st.returncode == 0, st.stderr
        assert "wk" in st.stdout and str(600 * MiB) in st.stdout
        b = subprocess.run(
            [
                sys.executable,
                "-m",
                "cudatrace",
                "run",
                "--no-trace",
                "--group",
                "wk",
                "--",
                str(sim.progs["hold"]),
                "--exit-after-ms",
                "10",
                "1",
                "600m",
            ],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert b.returncode == 1 and "budget exceeded" in b.stderr, b.stderr
    finally:
        a.terminate()
        a.communicate(timeout=60)
    assert list(work.iterdir()) == []


MANY_SIZES = r"""
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuMemAlloc_v2(CUdeviceptr *, unsigned long);
__attribute__((noinline)) int many(CUdeviceptr *p, unsigned long n) { return cuMemAlloc_v2(p, n); }
int main(void)
{
    void *ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx))
        return 1;
    for (unsigned long i = 0; i < 9000; i++) {
        CUdeviceptr p;
        if (many(&p, 4096 + 64 * i))
            return 1;
    }
    return 0;
}
"""


def test_aggregate_key_table_full_keeps_bytes_exact(ct, sim, tmp_path):
    """9,000 sizes from one site overflow the 8,000 keys: the sizes past the table share a
    "mixed sizes" key; bytes and counts stay exact, the report says sizes are averaged."""
    (tmp_path / "m.c").write_text(MANY_SIZES)
    exe = tmp_path / "many"
    subprocess.run(
        [
            "cc",
            "-O0",
            "-g",
            "-rdynamic",
            "-o",
            str(exe),
            str(tmp_path / "m.c"),
            f"-L{sim.lib}",
            "-lcuda",
        ],
        check=True,
    )
    r = ct.run([exe], "-q", "--aggregate")
    assert r.returncode == 0, r.stderr
    total = sum(4096 + 64 * i for i in range(9000))
    rep = json.loads(ct.cli("report", r.out, "--json").stdout)
    assert rep["peak_bytes"] == total and rep["never_freed"]["bytes"] == total
    site = next(s for s in rep["sites"] if "many" in s["label"])
    assert site["bytes"] == total and site["count"] == 9000
    assert any("sizes are averaged" in w for w in rep["warnings"])
    (f,) = list(r.out.glob("*.ctrace"))
    assert f.stat().st_size <= 4 * MiB


def test_aggregate_sample_files_are_bounded_and_read(ct, sim, tmp_path):
    """--aggregate bounds the sampler's files too (record/sampler.py BoundedLog): the report
    reads them merged, and a full run still writes every sample to samples.jsonl alone."""
    from cudatrace import tracedir

    r = ct.run(
        [sys.executable, "-c", "import time; time.sleep(2)"],
        "-q",
        "--aggregate",
        "--sample-ms",
        "1",
    )
    assert r.returncode == 0, r.stderr
    names = {p.name for p in r.out.iterdir()}
    assert {tracedir.SAMPLES, tracedir.SAMPLES_HISTORY, tracedir.SAMPLES_EXTREMES} <= names
    run = json.loads((r.out / "run.json").read_text())
    taken = run["sampler"]["samples"]
    assert taken >= 50, run["sampler"]
    rep = json.loads(ct.cli("report", r.out, "--json").stdout)
    assert 1 <= rep["observed"]["samples"] <= taken
    full = ct.run([sys.executable, "-c", "import time; time.sleep(0.3)"], "-q")
    assert full.returncode == 0, full.stderr
    assert not any((full.out / n).exists() for n in tracedir.SAMPLE_FILES if n != tracedir.SAMPLES)
    # a malformed option is refused before anything runs
    bad = ct.run([sys.executable, "-c", "pass"], "--sample-ms", "0")
    assert bad.returncode == RUN_FAILED and "--sample-ms" in bad.stderr
