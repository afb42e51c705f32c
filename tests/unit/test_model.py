"""The replay model, against hand-computed cases, on both backends (C and the Python reference),
and the two backends against each other on random traces."""

from __future__ import annotations

import random

import pytest

from cudatrace.analyze.documents.ranks import alloc_ordinals
from cudatrace.analyze.read.trace import C, read_dir
from cudatrace.analyze.replay import lives
from cudatrace.analyze.replay.lives import Groups
from cudatrace.analyze.replay.model import build
from support import tracegen as tg
from support.replay_oracle import BACKENDS, build_with

MS = tg.MS
T = tg.BASE_TS


def ts(ms: float) -> int:
    return T + int(ms * MS)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def write(tmp_path, name="1000.0.ctrace", **kw) -> tg.TraceWriter:
    return tg.TraceWriter(tmp_path / name, **kw)


def model_of(tmp_path, backend):
    return build_with(read_dir(tmp_path), backend)


def sizes(allocs):
    return sorted(a.size for a in allocs)


def test_the_product_replays_in_c():
    # the tools library is built from this checkout: build() replays in C, never in Python
    assert build([]).backend.name == "c"


def test_interleaved_frees(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000)  # 100
    w.alloc(ts(2), 200, 0xB000)  # 300
    w.free(ts(3), 0xA000)  # 200
    w.alloc(ts(4), 50, 0xC000)  # 250
    w.alloc(ts(5), 300, 0xD000)  # 550  <- peak
    w.free(ts(6), 0xB000)  # 350
    w.close(end_ts=ts(1000))  # exits later
    m = model_of(tmp_path, backend)
    assert (m.peak_bytes, m.peak_ts) == (550, ts(5))
    assert m.end_bytes == 350
    assert sizes(m.live_at_peak) == [50, 200, 300]
    assert sizes(m.live_at_end) == [50, 300]
    assert m.counts["allocs"] == 4 and m.counts["frees"] == 2
    assert m.counts["unmatched_frees"] == 0
    # at a time: every event at or before it counts
    assert sizes(m.at(ts(3))) == [200]
    assert sizes(m.at(ts(2.5))) == [100, 200]
    assert sizes(m.at(ts(0))) == []
    assert m.live_bytes_at(ts(5)) == (550, 3)
    assert m.bytes_at([ts(0), ts(1), ts(2.5), ts(3), ts(5), ts(6), ts(99)]) == [
        0,
        100,
        300,
        200,
        550,
        350,
        350,
    ]
    # the most live at one moment of a window (what an NVML reading inside it could see)
    lo = [ts(0), ts(2.5), ts(3), ts(5.5), ts(7)]
    hi = [ts(0.5), ts(4.5), ts(5), ts(6), ts(7)]
    assert m.bytes_max(lo, hi) == [0, 300, 550, 550, 350]
    assert m.bytes_max([ts(3)], [ts(4.5)]) == [250]
    assert m.bytes_max([ts(1), ts(3)], [ts(1), ts(3)]) == m.bytes_at([ts(1), ts(3)])
    for bad in (([ts(1)], []), ([ts(2), ts(1)], [ts(3)] * 2), ([ts(1)] * 2, [ts(3), ts(2)])):
        with pytest.raises(ValueError):
            m.bytes_max(*bad)
    # lifetimes
    life = {a.size: a.end_ts for a in m.lifetimes()}
    assert life == {100: ts(3), 200: ts(6), 50: ts(1000), 300: ts(1000)}  # ended with it


def test_several_devices(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000, device=0)  # total 100; dev0 100
    w.alloc(ts(2), 300, 0xB000, device=1)  # total 400 <- peak; dev1 300 <- dev1 peak
    w.free(ts(3), 0xA000, device=0)  # 300
    w.alloc(ts(4), 50, 0xC000, device=0)  # 350
    w.free(ts(5), 0xB000, device=1)  # 50
    w.alloc(ts(6), 80, 0xE000, device=0)  # 130; dev0 130 <- dev0 peak
    w.close()
    m = model_of(tmp_path, backend)
    assert (m.peak_bytes, m.peak_ts) == (400, ts(2))
    assert m.device_peaks == {0: (130, ts(6)), 1: (300, ts(2))}
    assert m.device_end == {0: 130, 1: 0}
    assert m.device_allocs == {0: 3, 1: 1}
    assert sizes(m.live_at_device_peak(0)) == [50, 80]
    assert sizes(m.live_at_device_peak(1)) == [300]
    assert sizes(m.at(ts(4), device=0)) == [50]
    g = m.groups_at_peak(device=0)
    assert (g.bytes, g.count) == (130, 2)


def test_several_processes_merge_by_timestamp(tmp_path, backend):
    p = write(tmp_path, "1000.0.ctrace", pid=1000)
    q = write(tmp_path, "1001.0.ctrace", pid=1001, ppid=1000)
    p.alloc(ts(1), 100, 0x1000)  # 100
    q.alloc(ts(2), 200, 0x2000)  # 300
    q.alloc(ts(3), 50, 0x1000)  # 350 <- peak (same address, other process)
    p.free(ts(4), 0x1000)  # 250: frees pid 1000's, not 1001's
    q.free(ts(5), 0x2000)  # 50
    q.free(ts(6), 0x7777)  # matches nothing in pid 1001
    p.close()
    q.close()
    m = model_of(tmp_path, backend)
    assert (m.peak_bytes, m.peak_ts) == (350, ts(3))
    assert m.end_bytes == 50
    assert [(a.trace, a.size) for a in m.live_at_end] == [(1, 50)]
    assert m.counts["unmatched_frees"] == 1
    assert [pr["peak_bytes"] for pr in m.procs] == [100, 250]
    assert [pr["end_bytes"] for pr in m.procs] == [0, 50]


def test_equal_timestamps_break_ties_by_trace_order(tmp_path, backend):
    # at ts 6, trace 0's free comes before trace 1's alloc: the total never reaches 200
    p = write(tmp_path, "1000.0.ctrace", pid=1000)
    q = write(tmp_path, "1001.0.ctrace", pid=1001)
    p.alloc(ts(5), 100, 0x1000)
    p.free(ts(6), 0x1000)
    q.alloc(ts(6), 100, 0x1000)
    p.close(end_ts=ts(1000))  # exits later
    q.close(end_ts=ts(1000))  # exits later
    m = model_of(tmp_path, backend)
    assert (m.peak_bytes, m.peak_ts) == (100, ts(5))
    assert [a.trace for a in m.live_at_peak] == [0]
    assert [a.trace for a in m.at(ts(6))] == [1]


def test_address_reuse(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000)
    w.free(ts(2), 0xA000)
    w.alloc(ts(3), 200, 0xA000)  # the same address again: 200 <- peak
    w.free(ts(4), 0xA000)
    w.alloc(ts(5), 50, 0xA000)
    w.alloc(ts(6), 30, 0xA000)  # reused while live (its free was not seen): 50 ends here
    w.close(end_ts=ts(1000))  # exits later
    m = model_of(tmp_path, backend)
    assert (m.peak_bytes, m.peak_ts) == (200, ts(3))
    assert m.end_bytes == 30
    assert m.counts["reused"] == 1
    assert [(a.size, a.end_ts) for a in m.lifetimes()] == [
        (100, ts(2)),
        (200, ts(4)),
        (50, ts(6)),
        (30, ts(1000)),  # never freed: its process's end ended it
    ]
    assert [a.how for a in m.lifetimes()] == [
        lives.END_FREE,
        lives.END_FREE,
        lives.END_REUSED,
        lives.END_EXITED,
    ]


def test_frees_that_match_nothing(tmp_path, backend):
    w = write(tmp_path)
    w.free(ts(1), 0xDEAD)  # allocated before tracing began
    w.alloc(ts(2), 100, 0xA000)
    w.free(ts(3), 0)  # cudaFree(NULL): a no-op, not unmatched
    w.free(ts(4), 0xA000, result=1)  # a failed free frees nothing
    w.free(ts(5), 0xBEEF, api="cuMemFreeHost", rt="cudaFreeHost")
    w.close()
    m = model_of(tmp_path, backend)
    assert m.peak_bytes == 100 and m.end_bytes == 100
    assert m.counts["unmatched_frees"] == 2
    assert m.counts["null_frees"] == 1
    assert m.counts["failed_frees"] == 1
    assert m.unmatched_frees == 2


def test_failed_allocations_are_not_counted(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000)
    w.alloc(ts(2), 1 << 40, 0, result=2)  # CUDA_ERROR_OUT_OF_MEMORY
    w.alloc(ts(3), 64, 0, result=1, api="cuMemAllocManaged", rt="cudaMallocManaged")
    w.close()
    m = model_of(tmp_path, backend)
    assert m.peak_bytes == 100
    assert m.counts["allocs"] == 1 and m.counts["failed"] == 2
    assert [(f.size, f.result) for f in m.failed] == [(1 << 40, 2), (64, 1)]
    assert m.procs[0]["failed"] == 2


def test_host_pinned_is_not_device_memory(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 1 << 30, 0x600000, api="cuMemHostAlloc", rt="cudaHostAlloc")
    w.alloc(ts(2), 1 << 20, 0x700000, api="cuMemAllocHost_v2", rt="cudaMallocHost")
    w.free(ts(3), 0x600000, api="cuMemFreeHost", rt="cudaFreeHost")
    w.close(end_ts=ts(1000))  # exits later
    m = model_of(tmp_path, backend)
    assert not m.found
    assert m.peak_bytes == 0 and m.live_at_peak == [] and m.live_at_end == []
    assert m.host_peak == (1 << 30) + (1 << 20) and m.host_end == 1 << 20
    assert m.counts["host_allocs"] == 2 and m.counts["host_frees"] == 1


def test_vmm_create_release(tmp_path, backend):
    w = write(tmp_path)
    two = 2 << 20
    # plain: create then release frees it
    w.event(ts(1), "cuMemCreate", size=two, addr=0x11, device=0)
    w.event(ts(2), "cuMemRelease", addr=0x11)
    # the CUDA samples' pattern: create, map, release at once; freed by the unmap
    w.event(ts(3), "cuMemCreate", size=two, addr=0x22, device=0)
    w.event(ts(4), "cuMemMap", size=two, addr=0x7F0000000000, aux=0x22)
    w.event(ts(5), "cuMemRelease", addr=0x22)  # still mapped: nothing freed yet
    w.event(ts(6), "cuMemCreate", size=two, addr=0x33, device=1)  # 4 MiB <- peak
    w.event(ts(7), "cuMemUnmap", size=two, addr=0x7F0000000000)  # frees 0x22
    # two mappings of one handle, unmapped by one range
    w.event(ts(8), "cuMemMap", size=two // 2, addr=0x7F1000000000, aux=0x33)
    w.event(ts(9), "cuMemMap", size=two // 2, addr=0x7F1000100000, aux=0x33)
    w.event(ts(10), "cuMemRelease", addr=0x33)
    w.event(ts(11), "cuMemUnmap", size=two, addr=0x7F1000000000)
    w.close()
    m = model_of(tmp_path, backend)
    assert (m.peak_bytes, m.peak_ts) == (2 * two, ts(6))
    assert m.end_bytes == 0
    assert sizes(m.at(ts(5))) == [two]  # released but mapped: still live
    assert sizes(m.at(ts(7))) == [two]  # 0x22 gone, 0x33 live
    assert sizes(m.at(ts(10))) == [two]
    assert m.at(ts(11)) == []
    assert m.counts["deferred_releases"] == 2
    assert m.counts["maps"] == 3 and m.counts["unmaps"] == 2
    assert [a.how for a in m.lifetimes()] == [
        lives.END_FREE,
        lives.END_UNMAPPED,
        lives.END_UNMAPPED,
    ]
    assert m.device_peaks == {0: (two, ts(1)), 1: (two, ts(6))}


def test_managed_async_pitch_array_graph_are_device_memory(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 10, 0x1, api="cuMemAllocManaged", rt="cudaMallocManaged")
    w.alloc(ts(2), 20, 0x2, api="cuMemAllocAsync", rt="cudaMallocAsync")
    w.alloc(ts(3), 30, 0x3, api="cuMemAllocPitch_v2", rt="cudaMallocPitch")
    w.alloc(ts(4), 40, 0x4, api="cuArrayCreate_v2", rt=None)
    w.alloc(ts(5), 50, 0x5, api="cuGraphAddMemAllocNode", rt=None)
    w.event(ts(6), "cuIpcOpenMemHandle_v2", addr=0x6)  # an import: never counted
    w.free(ts(7), 0x2, api="cuMemFreeAsync", rt="cudaFreeAsync")
    w.free(ts(8), 0x4, api="cuArrayDestroy", rt=None)
    w.close()
    m = model_of(tmp_path, backend)
    assert m.peak_bytes == 150 and m.end_bytes == 90
    assert m.counts["imports"] == 1


def test_out_of_order_events_are_replayed_in_time_order(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000)
    w.alloc(ts(3), 300, 0xB000)
    w.free(ts(2), 0xA000)  # published after a later event (another thread)
    w.close()
    m = model_of(tmp_path, backend)
    assert m.counts["unsorted_traces"] == 1
    assert (m.peak_bytes, m.peak_ts) == (300, ts(3))
    assert sizes(m.live_at_peak) == [300]


def test_meminfo_and_denials_are_listed(tmp_path, backend):
    w = write(tmp_path)
    w.meminfo(
        ts(1),
        free=1 << 30,
        total=2 << 30,
        real_free=70 << 30,
        real_total=80 << 30,
        virtualized=True,
    )
    w.deny(ts(2), 4 << 30, limit=2 << 30, in_use=1 << 30)
    w.close()
    m = model_of(tmp_path, backend)
    assert not m.found
    assert [(q.size, q.event[lives.ADDR]) for q in m.meminfo] == [(2 << 30, 1 << 30)]
    assert m.meminfo[0].flags & C()["CT_EF_VIRTUALIZED"]
    assert [(d.size, d.event[lives.AUX], d.event[lives.AUX2]) for d in m.denied] == [
        (4 << 30, 2 << 30, 1 << 30)
    ]
    assert m.counts["denied"] == 1 and m.counts["meminfo"] == 1


def test_truncated_trace_still_replays(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000)
    w.alloc(ts(2), 200, 0xB000)
    w.close(clean=False)
    td = read_dir(tmp_path)
    assert td.traces[0].status == "truncated"
    m = build_with(td, backend)
    assert m.peak_bytes == 300 and m.end_bytes == 300


def test_record_cut_mid_way(tmp_path, backend):
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000)
    w.alloc(ts(2), 200, 0xB000)
    pos = w.pos
    w.close(clean=False, zero_tail=False)
    tg.cut(tmp_path / "1000.0.ctrace", pos - 20)  # the last event half written
    td = read_dir(tmp_path)
    assert td.traces[0].status == "truncated"
    m = build_with(td, backend)
    assert m.peak_bytes == 100


def test_events_across_chunks(tmp_path, backend):
    # 2 MiB chunks: 40k events make the writer pad to several chunk boundaries
    w = write(tmp_path)
    n = 40000
    for i in range(n):
        w.alloc(ts(i), 1, 0x1000 + i)
    w.close()
    td = read_dir(tmp_path)
    assert td.traces[0].n_events == n and td.traces[0].complete
    m = build_with(td, backend)
    assert m.peak_bytes == n


def test_timeline_points_hold_the_peak(tmp_path, backend):
    w = write(tmp_path)
    for i in range(1000):
        w.alloc(ts(i), 10, 0x1000 + i)
    for i in range(1000):
        w.free(ts(1000 + i), 0x1000 + i)
    w.close()
    m = build_with(read_dir(tmp_path), backend, timeline_buckets=64)
    pts = m.timeline_points()
    assert max(v for _, v in pts) == m.peak_bytes == 10000
    assert pts[-1][1] == 0
    assert all(a[0] <= b[0] for a, b in zip(pts, pts[1:]))


def test_events_given_as_tuples(tmp_path, backend):
    # a Trace whose events were set in Python (no scanner array) replays the same
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000)
    w.close()
    td = read_dir(tmp_path)
    t = td.traces[0]
    evs = list(t.events)
    e = list(evs[0])
    e[0] = ts(2)
    e[2] = 0xB000
    e[1] = 50
    t.events = evs + [tuple(e)]
    assert t.raw_events is None and t.n_events == 2
    m = build_with(td, backend)
    assert m.peak_bytes == 150


def test_groups_match_allocs(tmp_path, backend):
    w = write(tmp_path)
    a = w.stack([0x401000, 0x402000])
    b = w.stack([0x403000, 0x402000])
    w.alloc(ts(1), 100, 0xA000, stack=a)
    w.alloc(ts(2), 300, 0xB000, stack=a)
    w.alloc(ts(3), 200, 0xC000, stack=b, device=1)
    w.close()
    m = model_of(tmp_path, backend)
    g = m.groups_at_peak()
    ref = Groups.of(m.live_at_peak)
    assert g.plain() == ref.plain()
    assert g.bytes == 600 and g.count == 3
    assert g.by_device() == {0: 400, 1: 200}
    assert [list(r[9]) for r in g.rows] == [[100, 300], [200]]


# ---- the C replay against the Python reference, on random traces ----------------------------


def random_run(d, seed: int, procs: int = 3, events: int = 600):
    rnd = random.Random(seed)
    apis_alloc = [
        ("cuMemAlloc_v2", "cudaMalloc"),
        ("cuMemAllocManaged", "cudaMallocManaged"),
        ("cuMemAllocAsync", "cudaMallocAsync"),
        ("cuMemHostAlloc", "cudaHostAlloc"),
    ]
    for p in range(procs):
        w = tg.TraceWriter(d / ("%d.0.ctrace" % (1000 + p)), pid=1000 + p)
        stacks = [w.stack([0x401000 + 16 * k, 0x500000 + p]) for k in range(5)]
        live: list[int] = []
        handles: list[int] = []
        maps: list[tuple[int, int]] = []
        t = T + rnd.randrange(0, 5) * MS
        for i in range(events):
            t += rnd.choice([0, 0, 1, 2, 5]) * MS  # equal timestamps happen
            r = rnd.random()
            dev = rnd.randrange(0, 3) - (1 if rnd.random() < 0.05 else 0)
            st = rnd.choice(stacks)
            if r < 0.35 or not live:
                addr = (
                    rnd.choice(live)
                    if live and rnd.random() < 0.05
                    else 0x1000 * rnd.randrange(1, 400)
                )
                api, rt = rnd.choice(apis_alloc)
                res = 2 if rnd.random() < 0.05 else 0
                w.alloc(
                    t,
                    rnd.randrange(1, 1 << 20),
                    addr,
                    api=api,
                    rt=rt,
                    device=dev,
                    stack=st,
                    result=res,
                )
                if not res:
                    live.append(addr)
            elif r < 0.65:
                addr = live.pop(rnd.randrange(len(live))) if rnd.random() < 0.9 else 0xFFFF000
                host = rnd.random() < 0.2
                w.free(
                    t,
                    addr,
                    api="cuMemFreeHost" if host else "cuMemFree_v2",
                    rt=None,
                    device=dev,
                    result=1 if rnd.random() < 0.03 else 0,
                )
            elif r < 0.72:
                h = rnd.randrange(1, 50)
                w.event(
                    t, "cuMemCreate", size=rnd.randrange(1, 1 << 21), addr=h, device=dev, stack=st
                )
                handles.append(h)
            elif r < 0.78 and handles:
                ptr = 0x7F0000000000 + rnd.randrange(0, 64) * 0x100000
                w.event(t, "cuMemMap", size=0x100000, addr=ptr, aux=rnd.choice(handles))
                maps.append((ptr, 0x100000))
            elif r < 0.83 and maps:
                ptr, n = maps.pop(rnd.randrange(len(maps)))
                if rnd.random() < 0.3:
                    ptr, n = ptr - 0x100000, 0x400000  # a range over several mappings
                w.event(t, "cuMemUnmap", size=n, addr=ptr)
            elif r < 0.88 and handles:
                w.event(t, "cuMemRelease", addr=handles.pop(rnd.randrange(len(handles))))
            elif r < 0.92:
                w.meminfo(t, free=1 << 30, total=2 << 30, device=dev)
            elif r < 0.95:
                w.deny(t, 1 << 30, limit=1 << 31, in_use=1 << 30, device=dev, stack=st)
            else:
                # out of order: an event stamped earlier than the previous one
                w.alloc(
                    t - 3 * MS if t - 3 * MS > T else t, 77, 0x9000000 + i, device=dev, stack=st
                )
        w.close(clean=rnd.random() < 0.7)


def snapshot(m, ts_list):
    def key(allocs):
        return sorted((a.trace, a.index, a.seq, a.end_ts, a.how) for a in allocs)

    out = {
        "summary": (
            m.found,
            m.peak_bytes,
            m.peak_ts,
            m.peak_seq,
            m.end_bytes,
            m.host_peak,
            m.host_peak_ts,
            m.host_end,
            m.t0,
            m.t_end,
        ),
        "counts": m.counts,
        "devices": (m.device_peaks, m.device_peak_seq, m.device_end, m.device_allocs),
        "procs": m.procs,
        "peak": key(m.live_at_peak),
        "end": key(m.live_at_end),
        "all": key(m.lifetimes()),
        "failed": key(m.failed),
        "denied": key(m.denied),
        "meminfo": key(m.meminfo),
        "timeline": m.timeline_buckets(),
        "tl_dev": {d: m.timeline_buckets(d) for d in m.device_peaks},
        "stack_totals": m.stack_totals(),
        "gpeak": m.groups_at_peak().plain(),
        "gend": m.groups_at_end().plain(),
    }
    out["bytes_at"] = m.bytes_at(sorted(ts_list))
    lo = sorted(ts_list)
    hi = []
    for k, t in enumerate(lo):  # windows of a few widths, their ends ascending too
        hi.append(max(hi[-1] if hi else 0, t + (k % 3) * 7 * MS))
    out["bytes_max"] = m.bytes_max(lo, hi)
    for d in m.device_peaks:
        out["bytes_max%d" % d] = m.bytes_max(lo, hi, d)
    for d in m.device_peaks:
        out["bytes_at%d" % d] = m.bytes_at(sorted(ts_list), d)
    for t in ts_list:
        out["at%d" % t] = key(m.at(t))
        out["b%d" % t] = m.live_bytes_at(t)
        out["g%d" % t] = m.groups_at(t).plain()
    for d in m.device_peaks:
        out["dpeak%d" % d] = key(m.live_at_device_peak(d))
        out["gdpeak%d" % d] = m.groups_at_peak(d).plain()
    return out


@pytest.mark.skipif("c" not in BACKENDS, reason="C replay not built")
@pytest.mark.parametrize("seed", range(12))
def test_c_matches_python_reference(tmp_path, seed):
    random_run(tmp_path, seed)
    td = read_dir(tmp_path)
    mc = build_with(td, "c", timeline_buckets=97)
    mp = build_with(td, "python", timeline_buckets=97)
    rnd = random.Random(seed)
    times = [rnd.randrange(mc.t0 - MS, mc.t_end + MS) for _ in range(5)] + [mc.t0, mc.t_end]
    a, b = snapshot(mc, times), snapshot(mp, times)
    for k in a:
        assert a[k] == b[k], k


# ---- a process's memory ends when the process ends (issue 21, item 3) ----


def test_sequential_processes_do_not_add_up(tmp_path, backend):
    # three programs one after the other, each holding 2 GiB until it exits: the device never
    # held more than 2 GiB; each left 2 GiB never freed
    G = 1 << 30
    for k in range(3):
        w = write(tmp_path, "%d.0.ctrace" % (1000 + k), pid=1000 + k)
        w.alloc(ts(10 * k + 1), 2 * G, 0xA000)
        w.close(end_ts=ts(10 * k + 5))
    m = model_of(tmp_path, backend)
    assert m.peak_bytes == 2 * G
    assert m.end_bytes == 6 * G  # never freed, each at its own exit
    assert m.bytes_at([ts(3), ts(6), ts(12), ts(99)]) == [2 * G, 0, 2 * G, 0]
    assert [pr["end_bytes"] for pr in m.procs] == [2 * G] * 3
    assert [a.how for a in m.lifetimes()] == [lives.END_EXITED] * 3
    assert [a.end_ts for a in m.lifetimes()] == [ts(5), ts(15), ts(25)]


def test_exec_ends_the_old_image(tmp_path, backend):
    # pid 1000 allocates 6 MiB, then execs (no exit record); the new image allocates 6 MiB
    M = 1 << 20
    a = write(tmp_path, "1000.0.ctrace", pid=1000)
    a.alloc(ts(1), 6 * M, 0xA000)
    a.close(clean=False)
    b = write(tmp_path, "1000.1.ctrace", pid=1000, exec_index=1, start_ns=ts(3))
    b.alloc(ts(4), 6 * M, 0xA000)
    b.close(end_ts=ts(9))
    m = model_of(tmp_path, backend)
    assert m.peak_bytes == 6 * M
    assert m.lifetimes()[0].end_ts == ts(3)


def test_a_killed_process_holds_its_memory_to_the_end(tmp_path, backend):
    # no exit record and no later image: when it died is unknown, so its memory stays counted
    M = 1 << 20
    a = write(tmp_path, "1000.0.ctrace", pid=1000)
    a.alloc(ts(1), 6 * M, 0xA000)
    a.close(clean=False)
    b = write(tmp_path, "1001.0.ctrace", pid=1001)
    b.alloc(ts(4), 6 * M, 0xA000)
    b.close(end_ts=ts(9))
    m = model_of(tmp_path, backend)
    assert m.peak_bytes == 12 * M
    assert m.lifetimes()[0].end_ts is None


def test_an_exit_goes_before_an_allocation_at_the_same_time(tmp_path, backend):
    a = write(tmp_path, "1001.0.ctrace", pid=1001)
    b = write(tmp_path, "1000.0.ctrace", pid=1000)
    a.alloc(ts(1), 100, 0xA000)
    a.close(end_ts=ts(4))
    b.alloc(ts(4), 100, 0xA000)
    b.close(end_ts=ts(9))
    m = model_of(tmp_path, backend)
    assert m.peak_bytes == 100


# ---- event blocks (format version 3) decoded by the replay as it goes (issue 25, item 4) ----


def block_threads(rnd: random.Random, events, in_order: bool = True) -> list[int]:
    """A thread number for each event: in_order, each thread's events in time order (as the
    shim writes them), now and then a new thread taking an old number (bit 31); else any."""
    last: dict[int, int] = {}
    out = []
    for e in events:
        if not in_order:
            out.append(rnd.randrange(3))
            continue
        ok = [t for t in range(len(last) + 1) if last.get(t, 0) <= e[0]]
        t = rnd.choice(ok[:4]) if ok else len(last)
        new = t in last and rnd.random() < 0.03
        last[t] = e[0]
        out.append(t | (1 << 31 if new else 0))
    return out


def blocks_run(tmp_path, seed: int, in_order: bool = True):
    """random_run (several processes, kills) plus an exec'd image, written twice: as EVENT
    records (dir 'events') and as the event blocks of several threads (dir 'blocks')."""
    a, b = tmp_path / "events", tmp_path / "blocks"
    a.mkdir()
    b.mkdir()
    random_run(a, seed)
    rnd = random.Random(seed)
    w = tg.TraceWriter(a / "1000.1.ctrace", pid=1000, exec_index=1, start_ns=ts(400))
    for i in range(60):
        w.alloc(ts(400 + i), 1000 + i, 0x5000 * (1 + i % 7), device=i % 2)
        if i % 3 == 0:
            w.free(ts(400 + i), 0x5000 * (1 + i % 7))
    w.close(clean=rnd.random() < 0.5)
    blocks = {}
    for f in sorted(a.glob("*.ctrace")):
        blocks[f.name] = tg.rewrite_as_blocks(
            f, b / f.name, lambda evs: block_threads(rnd, evs, in_order)
        )
    return a, b, blocks


def _times(m, seed):
    rnd = random.Random(seed)
    return [rnd.randrange(m.t0 - MS, m.t_end + MS) for _ in range(5)] + [m.t0, m.t_end]


@pytest.mark.parametrize("seed", range(8))
def test_blocks_replayed_as_they_decode_match_the_reference(tmp_path, seed):
    a, b, _ = blocks_run(tmp_path, seed)
    td = read_dir(b)
    streamed = [t for t in td.traces if t.n_events]
    assert streamed and all(t.source_blocks is not None for t in streamed)
    mc = build_with(td, "c", timeline_buckets=97)
    assert all(t._raw is None for t in td.traces), "no trace's events were held"
    mp = build_with(read_dir(b), "python", timeline_buckets=97)  # decodes into tuples
    times = _times(mc, seed)
    sc, sp = snapshot(mc, times), snapshot(mp, times)
    for k in sc:
        assert sc[k] == sp[k], k
    assert sc["counts"]["unsorted_traces"] > 0  # threads' blocks are out of time order
    # the blocks hold the events of the 72-byte records, each once (in another order: the
    # replay's order within equal times follows the file, so the figures may differ there)
    ea = {t.path.name: sorted(t.events) for t in read_dir(a).traces}
    assert {t.path.name: sorted(t.events) for t in read_dir(b).traces} == ea
    # the ranks' devices of a trace, read from its blocks without holding its events
    tb = read_dir(b).traces
    assert [alloc_ordinals(t) for t in tb] == [alloc_ordinals(t) for t in read_dir(a).traces]
    assert all(t._raw is None for t in tb)


@pytest.mark.parametrize("seed", range(3))
def test_threads_out_of_order_are_replayed_from_an_array(tmp_path, seed):
    _, b, _ = blocks_run(tmp_path, seed, in_order=False)
    td = read_dir(b)
    assert any(t.source_blocks is None and t.n_events for t in td.traces)
    mc = build_with(td, "c", timeline_buckets=97)
    mp = build_with(read_dir(b), "python", timeline_buckets=97)
    times = _times(mc, seed)
    sc, sp = snapshot(mc, times), snapshot(mp, times)
    for k in sc:
        assert sc[k] == sp[k], k


def test_damaged_blocks_decode_in_the_replay_as_in_the_scan(tmp_path):
    # one block gone (zeros: the thread's later blocks cannot be placed, unless a new thread
    # starts) and blocks cut inside their last event (the rest of each block skipped): the
    # replay's streams must skip exactly what the scan skipped
    _, b, blocks = blocks_run(tmp_path, 3)
    name = max(blocks, key=lambda n: len(blocks[n]))
    path = b / name
    data = bytearray(path.read_bytes())
    pos = blocks[name]
    assert len(pos) >= 8
    off, size = pos[2]
    data[off : off + size] = bytes(size)
    for off, _size in pos[4::3]:
        used = int.from_bytes(data[off + 8 : off + 12], "little")
        if used > 1:
            data[off + 8 : off + 12] = (used - 1).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    td = read_dir(b)
    t = next(t for t in td.traces if t.path.name == name)
    assert t.bad_events > 0 and t.gaps > 0
    assert t.source_blocks is not None
    mc = build_with(td, "c", timeline_buckets=97)
    mp = build_with(read_dir(b), "python", timeline_buckets=97)
    assert mc.n_events == sum(x.n_events for x in td.traces)
    times = _times(mc, 3)
    sc, sp = snapshot(mc, times), snapshot(mp, times)
    for k in sc:
        assert sc[k] == sp[k], k


def test_bytes_max_sees_no_moment_that_never_was(tmp_path, backend):
    # a free and an allocation at one time: the bytes never held both
    w = write(tmp_path)
    w.alloc(ts(1), 100, 0xA000)
    w.free(ts(2), 0xA000)
    w.alloc(ts(2), 300, 0xB000)
    w.alloc(ts(4), 50, 0xC000)
    w.free(ts(4.5), 0xC000)
    w.close(end_ts=ts(10))
    m = model_of(tmp_path, backend)
    assert m.bytes_max([ts(1.5), ts(3), ts(4.2)], [ts(2.5), ts(4.2), ts(5)]) == [300, 350, 350]
    # windows that overlap: each is its own maximum
    assert m.bytes_max([ts(0), ts(4.6)], [ts(4.6), ts(9)]) == [350, 300]
