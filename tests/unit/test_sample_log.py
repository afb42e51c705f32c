"""The --aggregate sample files stay bounded whatever the run's length, and keep what the report
compares with: the first sample, each figure's extreme, the recent samples whole, the run
thinned evenly (record/sampler.py BoundedLog; read back by analyze/read/trace.py)."""

from __future__ import annotations

from cudatrace import tracedir
from cudatrace.analyze.read.trace import TraceDir
from cudatrace.record.sampler import BoundedLog, FullLog

GiB = 1 << 30


def sample(i: int, spike: int, low: int) -> dict:
    dev = 2 * GiB + (5 * GiB if i == spike else 0) + (i % 7) * 4096
    return {
        "t": 1_000_000 + i * 100_000_000,
        "pids": [100],
        "mem_available": 50 * GiB - (9 * GiB if i == low else 0) - (i % 5) * 4096,
        "mem_free": 40 * GiB,
        "tree_rss": 300 << 20,
        "devices": [{"index": 0, "total": 80 * GiB, "free": 70 * GiB, "used": dev + GiB}],
        "tree_device_bytes": {"0": dev},
    }


def feed(out, n: int, spike: int, low: int, **kw) -> BoundedLog:
    log = BoundedLog(out, **kw)
    for i in range(n):
        log.add(sample(i, spike, low))
    log.close()
    return log


def sizes(out) -> int:
    return sum((out / f).stat().st_size for f in tracedir.SAMPLE_FILES if (out / f).exists())


def lines(out, name: str) -> int:
    p = out / name
    return len(p.read_text().splitlines()) if p.exists() else 0


def test_bounded_whatever_the_length(tmp_path):
    got = {}
    for n in (2_000, 20_000, 200_000):
        out = tmp_path / str(n)
        out.mkdir()
        feed(out, n, spike=n // 3, low=(2 * n) // 3, recent=50, history=40)
        assert lines(out, tracedir.SAMPLES) <= 50 and lines(out, tracedir.SAMPLES_PREV) == 50
        assert lines(out, tracedir.SAMPLES_HISTORY) <= 40
        assert 1 <= lines(out, tracedir.SAMPLES_EXTREMES) <= 7  # one line per figure at most
        got[n] = sizes(out)
    # 100 times the samples, the same few dozen KB
    assert got[200_000] <= 1.1 * got[2_000], got


def test_what_the_report_needs_is_kept(tmp_path):
    n, spike, low = 50_000, 12_345, 31_337
    log = feed(tmp_path, n, spike, low, recent=100, history=64)
    got = TraceDir(tmp_path, [], {}, []).samples()
    ts = [s["t"] for s in got]
    assert ts == sorted(set(ts))  # in time order, each sample once
    idx = [(t - 1_000_000) // 100_000_000 for t in ts]
    assert idx[0] == 0  # the baseline
    assert spike in idx and low in idx  # the highest device figures, the lowest MemAvailable
    # the recent samples whole: the last 100 to 200
    tail = idx[-100:]
    assert tail == list(range(n - 100, n))
    # the history evenly thinned: one sample every `stride`, the stride a power of two
    hist = [
        (s - 1_000_000) // 100_000_000
        for s in (
            int(line.split('"t": ')[1].split(",")[0])
            for line in (tmp_path / tracedir.SAMPLES_HISTORY).read_text().splitlines()
        )
    ]
    stride = log.stride
    assert stride & (stride - 1) == 0 and stride * 64 >= n // 2
    assert hist == list(range(0, hist[-1] + 1, stride))
    assert hist[-1] >= n - 2 * stride
    assert TraceDir(tmp_path, [], {}, []).bad_samples == 0


def test_full_log_keeps_every_sample(tmp_path):
    log = FullLog(tmp_path)
    for i in range(3000):
        log.add(sample(i, -1, -1))
    log.close()
    assert [f for f in tracedir.SAMPLE_FILES if (tmp_path / f).exists()] == [tracedir.SAMPLES]
    assert len(TraceDir(tmp_path, [], {}, []).samples()) == 3000


def test_history_rewrite_never_follows_a_planted_link(tmp_path):
    """The thinned history is replaced by rename, never written through a link someone put in
    its place (a shared trace directory)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    log = BoundedLog(out, recent=10, history=4)
    for i in range(4):
        log.add(sample(i, -1, -1))
    (out / tracedir.SAMPLES_HISTORY).unlink()
    (out / tracedir.SAMPLES_HISTORY).symlink_to(victim)
    for i in range(4, 40):
        log.add(sample(i, -1, -1))
    log.close()
    assert victim.read_text() == "precious\n"
    assert not (out / tracedir.SAMPLES_HISTORY).is_symlink()
