"""Many ranks as one run (docs/ranks.md): tags, the outlier rule, clocks of several hosts, and
peaks that never add up different devices. Traces written by support/tracegen.py."""

from __future__ import annotations

import pytest

from cudatrace.analyze.documents.analysis import Analysis
from cudatrace.analyze.documents.ranks import alloc_ordinals, outliers
from cudatrace.analyze.documents.report import build_report
from cudatrace.analyze.read.load import ReportError
from cudatrace.analyze.read.tags import tag_of
from cudatrace.analyze.read.trace import read_trace
from cudatrace.present.report import render_text
from support.schemas import validate
from support.tracegen import MS, SEC, TraceWriter

MiB = 1 << 20

# the `ranks` section as docs/report-json.md describes it
# The ranks section is held to the schema the package ships (cudatrace/schemas/report-1.json).


def test_outlier_rule():
    same = {"rank %d" % i: 100 * MiB for i in range(8)}
    assert outliers(same)[1] == []
    assert outliers(dict(same, **{"rank 5": 140 * MiB})) == (100 * MiB, ["rank 5"])
    assert outliers(dict(same, **{"rank 2": 10 * MiB}))[1] == ["rank 2"]  # low stands out too
    # within 10% of the median: noise, not an outlier
    assert outliers(dict(same, **{"rank 5": 108 * MiB}))[1] == []
    # spread evenly: no rank stands out
    spread = {"rank %d" % i: (100 + 10 * i) * MiB for i in range(8)}
    assert outliers(spread)[1] == []
    # a site only half the ranks hold stands out on none
    half = {"rank %d" % i: (64 * MiB if i % 2 else 0) for i in range(8)}
    assert outliers(half)[1] == []
    # one rank alone holding it stands out
    assert outliers(dict.fromkeys(same, 0) | {"rank 3": 64 * MiB})[1] == ["rank 3"]
    # two ranks: no median to stand out from
    assert outliers({"rank 0": MiB, "rank 1": 900 * MiB}) == (None, [])


def _trace(path, **info):
    w = TraceWriter(path, info={"env." + k: v for k, v in info.items()})
    w.close()
    return read_trace(path)


def test_rank_variables_innermost_launcher_first(tmp_path):
    t = _trace(tmp_path / "1.0.ctrace", RANK="5", LOCAL_RANK="1", WORLD_SIZE="8", SLURM_PROCID="1")
    g = tag_of(t)
    assert (g.rank, g.local_rank, g.world_size, g.source) == (5, 1, 8, "RANK")
    t = _trace(tmp_path / "2.0.ctrace", SLURM_PROCID="3", SLURM_LOCALID="0", SLURM_NTASKS="4")
    assert (tag_of(t).rank, tag_of(t).local_rank, tag_of(t).source) == (3, 0, "SLURM_PROCID")
    t = _trace(tmp_path / "3.0.ctrace", OMPI_COMM_WORLD_RANK="7", OMPI_COMM_WORLD_SIZE="16")
    assert (tag_of(t).rank, tag_of(t).world_size) == (7, 16)
    t = _trace(tmp_path / "4.0.ctrace", PMI_RANK="2")
    assert tag_of(t).rank == 2
    t = _trace(tmp_path / "5.0.ctrace", RANK="x")  # not a number: no rank
    assert tag_of(t).rank is None and tag_of(t).host == "testhost"
    t = _trace(tmp_path / "6.0.ctrace", CUDATRACE_HOST="node17")
    assert tag_of(t).host == "node17"


def _host(d, host, boot_ns, ranks, gpus, sizes, wall=1_700_000_000 * SEC):
    """One host's trace directory: rank r allocates sizes[r] on CUDA_VISIBLE_DEVICES=gpus[r], at
    wall time +1 s (its monotonic clock reads boot_ns then), holds it 1 s, frees it."""
    d.mkdir()
    for i, r in enumerate(ranks):
        w = TraceWriter(
            d / ("%d.0.ctrace" % (100 + r)),
            pid=100 + r,
            host=host,
            start_ns=boot_ns,
            realtime_ns=wall,
            info={"env.RANK": r, "env.LOCAL_RANK": i, "env.CUDA_VISIBLE_DEVICES": gpus[i]},
        )
        w.alloc(boot_ns + SEC + r * MS, sizes[i], 0x7F0000000000 + r * (1 << 32))
        w.free(boot_ns + 2 * SEC, 0x7F0000000000 + r * (1 << 32))
        w.close()
    return d


@pytest.fixture
def two_hosts(tmp_path):
    # hostB booted 5000 s after hostA: its monotonic clock reads 5000 s less at the same moment
    a = _host(tmp_path / "hostA", "hostA", 9000 * SEC, [0, 1], ["0", "1"], [4 * MiB, 4 * MiB])
    b = _host(tmp_path / "hostB", "hostB", 4000 * SEC, [2, 3], ["0", "0"], [4 * MiB, 12 * MiB])
    return a, b


def test_two_hosts_one_clock_and_no_figure_over_a_device(two_hosts):
    a = Analysis(list(two_hosts), symbolize=False)
    starts = {t.host: t.start_monotonic_ns for t in a.traces}
    assert starts["hostA"] == starts["hostB"]  # the same wall moment, one clock
    r = build_report(a)
    rk = r["ranks"]
    validate(r)
    assert rk is not None
    assert [h["host"] for h in rk["hosts"]] == ["hostA", "hostB"]
    assert [x["label"] for x in rk["ranks"]] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    # every rank allocated at ~1 s of the common clock
    assert all(abs(x["peak_time"] - rk["ranks"][0]["peak_time"]) < 0.01 for x in rk["ranks"])
    # device 0 of hostA and device 0 of hostB are two devices; ranks 2 and 3 share GPU 0 of B
    devs = {(d["host"], d["device"]): d["peak_bytes"] for d in rk["devices"]}
    assert devs == {("hostA", "0"): 4 * MiB, ("hostA", "1"): 4 * MiB, ("hostB", "0"): 16 * MiB}
    # the run's peak is the most one device held, never the 24 MiB of all hosts together
    assert r["peak_bytes"] == 16 * MiB and r["peak_scope"] == "device"
    assert max(d["peak_bytes"] for d in r["devices"]) == r["peak_bytes"]
    assert {x["label"]: x["peak_bytes"] for x in rk["ranks"]}["rank 3"] == 12 * MiB
    text = render_text(r, width=200)
    assert "device hostB:0 peak   16.0 MiB" in text
    assert "the most one device held" in text


def test_by_rank_and_the_parent_directory(two_hosts, tmp_path):
    a = Analysis(tmp_path, symbolize=False)  # the folder holding both host folders
    assert len(a.td.dirs) == 2 and len(a.traces) == 4
    r = build_report(a, by="rank", at="1.5s")
    assert {s["label"]: s["bytes"] for s in r["sites"]} == {
        "rank 0": 4 * MiB,
        "rank 1": 4 * MiB,
        "rank 2": 4 * MiB,
        "rank 3": 12 * MiB,
    }
    assert r["paths"] == [str(d) for d in two_hosts]
    validate(r)
    assert r["ranks"] is not None
    # three ranks hold 4 MiB, rank 3 holds 12 MiB: it stands out (8 MiB over the median)
    assert [(o["label"], o["bytes"]) for o in r["ranks"]["outliers"]] == [("rank 3", 12 * MiB)]
    site = r["ranks"]["sites"][0]
    assert (site["ranks"], site["min_bytes"], site["max_bytes"]) == (4, 4 * MiB, 12 * MiB)
    assert [o["label"] for o in site["outliers"]] == ["rank 3"]
    text = render_text(r, width=200)
    assert "4 ranks: 3 x 4.00 MiB, rank 3: 12.0 MiB (stands out; median 4.00 MiB)" in text
    assert "by rank" in text


def test_a_folder_of_one_trace_directory(tmp_path):
    (tmp_path / "run").mkdir()
    _host(tmp_path / "run" / "node1", "node1", 9000 * SEC, [0], ["0"], [MiB])
    r = build_report(Analysis(tmp_path / "run", symbolize=False))
    assert r["paths"] == [str(tmp_path / "run")] and r["ranks"]["ranks"][0]["label"] == "rank 0"


def test_several_directories_errors(tmp_path, two_hosts):
    with pytest.raises(ReportError, match="no such trace directory"):
        Analysis([two_hosts[0], tmp_path / "missing"], symbolize=False)
    with pytest.raises(ReportError, match="named twice"):
        Analysis([two_hosts[0], two_hosts[0]], symbolize=False)
    # device 0 of two hosts is two devices: --device cannot pick one
    with pytest.raises(ReportError, match="--device picks a device ordinal"):
        build_report(Analysis(list(two_hosts), symbolize=False), device=0)


def test_one_directory_without_ranks_has_no_ranks_section(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    w = TraceWriter(d / "1.0.ctrace")
    w.alloc(1_000_000_000_100, MiB, 0x7F0000000000)
    w.close()
    r = build_report(Analysis(d, symbolize=False))
    assert r["ranks"] is None and "peak_scope" not in r and r["paths"] == [str(d)]


def test_one_host_ranks_on_different_gpus_are_different_devices(tmp_path):
    # both ranks allocate on their ordinal 0, which CUDA_VISIBLE_DEVICES maps to GPUs 2 and 3
    d = _host(tmp_path / "node", "node", 9000 * SEC, [0, 1], ["2", "3"], [4 * MiB, 6 * MiB])
    r = build_report(Analysis(d, symbolize=False))
    assert r["ranks"]["split_devices"] and r["peak_scope"] == "device"
    assert [(x["label"], x["peak_bytes"]) for x in r["devices"]] == [
        ("2", 6 * MiB),
        ("3", 4 * MiB),
    ] or [(x["label"], x["peak_bytes"]) for x in r["devices"]] == [("2", 4 * MiB), ("3", 6 * MiB)]
    assert r["peak_bytes"] == 6 * MiB  # never the 10 MiB of "device 0" summed over two GPUs
    # the same GPU for both: one device, and the per-ordinal figures stay as they were
    d2 = _host(tmp_path / "node2", "node", 9000 * SEC, [0, 1], ["1", "1"], [4 * MiB, 6 * MiB])
    r2 = build_report(Analysis(d2, symbolize=False))
    assert not r2["ranks"]["split_devices"] and "peak_scope" not in r2
    assert r2["peak_bytes"] == 10 * MiB and r2["ranks"]["devices"][0]["peak_bytes"] == 10 * MiB


def test_two_launches_on_one_host_keep_their_ranks_apart(tmp_path):
    # two separate jobs on one host, each with ranks 0 and 1: four ranks, named by directory
    j1 = _host(tmp_path / "job1", "node", 9000 * SEC, [0, 1], ["0", "1"], [4 * MiB, 4 * MiB])
    j2 = _host(tmp_path / "job2", "node", 9000 * SEC, [0, 1], ["2", "3"], [4 * MiB, 8 * MiB])
    r = build_report(Analysis([j1, j2], symbolize=False))
    got = {x["label"]: x["peak_bytes"] for x in r["ranks"]["ranks"]}
    assert got == {
        "job1 rank 0": 4 * MiB,
        "job1 rank 1": 4 * MiB,
        "job2 rank 0": 4 * MiB,
        "job2 rank 1": 8 * MiB,
    }


def _same_tables(a):
    from cudatrace.analyze.documents.ranks import tables

    fast, full = tables(a, fast=True), tables(a, fast=False)
    for k in ("rank_peaks", "dev_peaks", "dev_end", "dev_allocs", "dev_ranks", "rank_devs"):
        got, want = ({x: v for x, v in t[k].items() if v} for t in (fast, full))
        assert got == want, k
    return fast


def test_the_short_way_agrees_with_the_sweep(two_hosts, tmp_path):
    # one process per rank; hostB's two ranks share GPU 0 (a device swept, the others not)
    tb = _same_tables(Analysis(list(two_hosts), symbolize=False))
    assert tb["dev_peaks"][("hostB", "0")][0] == 16 * MiB
    # a rank of two processes (a worker and its child), and a process on two devices
    d = tmp_path / "mixed"
    d.mkdir()
    for pid, rank, size in ((10, 0, 4), (11, 0, 6), (12, 1, 2)):
        w = TraceWriter(d / ("%d.0.ctrace" % pid), pid=pid, info={"env.RANK": rank})
        w.alloc(1_000_000_000_000 + pid * MS, size * MiB, 0x7F0000000000 + pid * (1 << 32))
        w.close(end_ts=1_000_000_000_000 + 100 * MS)  # exits holding it (after its events)
    a = Analysis(d, symbolize=False)
    assert all(len(alloc_ordinals(t)) == 1 for t in a.traces)  # the short way is taken
    tb = _same_tables(a)
    assert tb["rank_peaks"][(0, "", 0)][0] == 10 * MiB  # the two processes of rank 0 together
    assert tb["dev_peaks"][("testhost", "0")][0] == 12 * MiB
    # a process that allocated on two devices: the sweep
    d2 = tmp_path / "twodev"
    d2.mkdir()
    w = TraceWriter(d2 / "13.0.ctrace", pid=13, info={"env.RANK": 2})
    w.alloc(1_000_000_000_000 + 20 * MS, MiB, 0x7E0000000000, device=0)
    w.alloc(1_000_000_000_000 + 21 * MS, 3 * MiB, 0x7E1000000000, device=1)
    w.close(end_ts=1_000_000_000_000 + 100 * MS)
    a = Analysis(d2, symbolize=False)
    assert alloc_ordinals(a.traces[0]) == {0, 1}
    r = build_report(a)
    assert r["ranks"]["ranks"][0]["devices"] == ["0", "1"]
    assert {x["device"]: x["peak_bytes"] for x in r["ranks"]["devices"]} == {"0": MiB, "1": 3 * MiB}


def test_the_run_summary_names_ranks_and_devices(tmp_path):
    import io

    from cudatrace.present.summary import print_summary

    sizes = [4 * MiB, 4 * MiB, 12 * MiB]
    d = _host(tmp_path / "node", "node", 9000 * SEC, [0, 1, 2], ["0", "1", "2"], sizes)
    out = io.StringIO()
    print_summary(d, 0, out)
    text = out.getvalue()
    assert "all devices together" in text and "node:2 12.0 MiB" in text
    assert (
        "ranks: 3, peaks 4.00 MiB .. 12.0 MiB; rank 2 stands out (12.0 MiB, median 4.00 MiB)"
        in text
    )


def test_a_missing_rank_is_named(tmp_path):
    # ranks 0, 1 and 3 of WORLD_SIZE=4 left traces; rank 2 never started (or never used CUDA)
    d = tmp_path / "job"
    d.mkdir()
    for r in (0, 1, 3):
        w = TraceWriter(
            d / ("%d.0.ctrace" % (100 + r)),
            pid=100 + r,
            info={"env.RANK": r, "env.LOCAL_RANK": r, "env.WORLD_SIZE": 4},
        )
        w.alloc(1_000_000_000_000 + r * MS, MiB, 0x7F0000000000 + r * (1 << 32))
        w.close()
    r = build_report(Analysis(d, symbolize=False))
    validate(r)
    assert r["ranks"]["missing"] == {"ranks": [2], "world_size": 4, "variable": "WORLD_SIZE"}
    text = render_text(r)
    assert "missing: rank 2 of 4 (WORLD_SIZE) left no trace" in text, text
    # every rank there: nothing is missing
    w = TraceWriter(d / "102.0.ctrace", pid=102, info={"env.RANK": 2, "env.WORLD_SIZE": 4})
    w.alloc(1_000_000_000_000, MiB, 0x7E0000000000)
    w.close()
    r = build_report(Analysis(d, symbolize=False))
    assert r["ranks"]["missing"] is None and "missing:" not in render_text(r)
