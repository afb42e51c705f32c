"""Compact events (CT_REC_CEVENT, format version 2): the shim's encoder (native/include/cevent.h,
reached through ct_cevent_pack) and the C scanner agree on every field, whatever the threads'
interleaving; version-1 files (full EVENT records) are still read; a torn record stops no
other thread's decoding."""

from __future__ import annotations

import random

import pytest

from cudatrace.analyze.read.trace import C, TraceError, read_trace
from support.tracegen import BASE_TS, TraceWriter

U64 = (1 << 64) - 1


def _random_events(rng: random.Random, n: int, nthreads: int):
    K = C()
    ops = [
        K["CT_OP_ALLOC"],
        K["CT_OP_FREE"],
        K["CT_OP_MEMINFO"],
        K["CT_OP_DENY"],
        K["CT_OP_MAP"],
        K["CT_OP_UNMAP"],
    ]
    ts = [BASE_TS + i for i in range(nthreads)]
    evs, threads = [], []
    for _ in range(n):
        t = rng.randrange(nthreads)
        ts[t] += rng.choice([0, 1, 700, 90_000, 1 << 40]) if rng.random() < 0.95 else 0
        if rng.random() < 0.02:
            ts[t] -= rng.randrange(1000)  # never done by a real clock: still exact
        ev = (
            ts[t],
            rng.choice([0, 1 << 20, rng.getrandbits(64)]),
            rng.choice([0, 0x7F0000000000 + rng.randrange(1 << 30), rng.getrandbits(64)]),
            rng.choice([0, rng.getrandbits(64)]),
            rng.choice([0, 5, U64]),
            1000 + t if rng.random() < 0.99 else rng.getrandbits(32),
            rng.choice([-1, 0, 1, 7]),
            rng.choice([0, 2, -5, 999]),
            rng.choice([0, 1, 17, 0xFFFFFFFF]),
            rng.randrange(1 << 16),
            rng.randrange(3),
            rng.choice(ops),
            rng.randrange(256),
            rng.randrange(256),
            rng.randrange(256),
            rng.choice([0, 0, 0xFFFFFFFF]),
        )
        evs.append(ev)
        threads.append(t)
    return evs, threads


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_round_trip_random_interleavings(tmp_path, seed):
    rng = random.Random(seed)
    evs, threads = _random_events(rng, 5000, 1 + seed * 3)
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p)
    w.compact_events(evs, threads)
    w.close()
    t = read_trace(p)
    assert t.complete and t.gaps == 0
    assert t.events == evs


def test_repeated_sites_are_small(tmp_path):
    """A loop of alloc/free pairs from one site: well under 40 bytes an event."""
    K = C()
    evs, ts, addr = [], BASE_TS, 0x7F0000000000
    for _ in range(20000):
        ts += 3000
        evs.append((ts, 1 << 20, addr, 0, 0, 77, 0, 0, 5, 3, 1, K["CT_OP_ALLOC"], 4, 1, 1, 0))
        ts += 800
        evs.append((ts, 0, addr, 0, 0, 77, 0, 0, 6, 4, 2, K["CT_OP_FREE"], 0, 1, 1, 0))
        addr += 1 << 22
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p)
    start = w.pos
    w.compact_events(evs)
    per_event = (w.pos - start) / len(evs)
    w.close()
    assert per_event <= 24, per_event
    assert read_trace(p).events == evs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_blocks_of_repeated_sites_with_changes_round_trip(tmp_path, seed):
    """Event blocks as the shim writes them (ct_ce_write: a repeated site's short path, else the
    general encoder): loops of alloc/free pairs from a few sites over several threads, broken
    now and then by a changed field, a clock that goes back, a free of an old address or of
    none; every event reads back equal, and the repeated ones stay a few bytes."""
    K = C()
    rng = random.Random(seed)
    nthreads = 3
    ts = [BASE_TS + i for i in range(nthreads)]
    addr = [0x7F0000000000 + (i << 36) for i in range(nthreads)]
    live: list[list[int]] = [[] for _ in range(nthreads)]
    evs, items = [], []
    for _ in range(20000):
        t = rng.randrange(nthreads)
        ts[t] += rng.choice([700, 3000, 90_000])
        if rng.random() < 0.01:
            ts[t] -= rng.randrange(5000)  # never done by a real clock: the general path
        site = rng.choice([3, 3, 3, 9])
        size = 1 << 20 if rng.random() < 0.97 else rng.randrange(1, 1 << 30)
        stream = 0 if rng.random() < 0.98 else rng.getrandbits(64)
        if live[t] and rng.random() < 0.5:
            a = live[t].pop(rng.randrange(len(live[t]))) if rng.random() < 0.2 else live[t].pop()
            if rng.random() < 0.02:
                a = rng.getrandbits(64)  # a free of something never allocated
            ev = (
                ts[t],
                0,
                a,
                stream,
                0,
                1000 + t,
                0,
                0,
                site + 1,
                4,
                0,
                K["CT_OP_FREE"],
                0,
                1,
                1,
                0,
            )
        else:
            addr[t] += 1 << 22
            live[t].append(addr[t])
            ev = (
                ts[t],
                size,
                addr[t],
                stream,
                0,
                1000 + t,
                0,
                0,
                site,
                3,
                0,
                K["CT_OP_ALLOC"],
                4,
                1,
                1,
                0,
            )
        evs.append(ev)
        items.append((t, ev))
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p)
    start = w.pos
    w.block_events(iter(items), nthreads=nthreads)
    per_event = (w.pos - start) / len(evs)
    w.close()
    got = read_trace(p).events
    by_thread = lambda es: {t: [e for e in es if e[5] == 1000 + t] for t in range(nthreads)}
    assert by_thread(got) == by_thread(evs)  # each thread's events, in its order, exact
    assert sorted(got) == sorted(evs)
    assert per_event <= 12, per_event


def test_version_1_files_are_read(tmp_path):
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p, version=1)
    w.alloc(BASE_TS + 10, 4096, 0x1000)
    w.free(BASE_TS + 20, 0x1000)
    w.close()
    t = read_trace(p)
    assert [e[2] for e in t.events] == [0x1000, 0x1000] and t.complete


def test_unknown_version_is_refused(tmp_path):
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p, version=C()["CT_FORMAT_VERSION"] + 1)
    w.close()
    with pytest.raises(TraceError, match="format version"):
        read_trace(p)


def _packed(evs, threads) -> list[bytes]:
    """The compact records of evs, one bytes object each, as the shim's encoder writes them."""
    import struct

    from cudatrace import native
    from cudatrace.analyze.read.trace import layout

    ffi, lib = native.tools()
    es = layout("struct ct_event")[0]
    raw = bytearray(es.size * len(evs))
    for k, e in enumerate(evs):
        es.pack_into(raw, k * es.size, *e)
    arr = ffi.from_buffer("struct ct_event[]", raw)
    th = ffi.new("uint32_t[]", threads)
    n = lib.ct_cevent_pack(arr, len(evs), th, ffi.NULL, 0)
    out = ffi.new("uint8_t[]", n)
    lib.ct_cevent_pack(arr, len(evs), th, out, n)
    data, recs, off = ffi.buffer(out, n)[:], [], 0
    while off < n:
        size = struct.unpack_from("<I", data, off + 4)[0]
        recs.append(data[off : off + size])
        off += size
    return recs


def test_torn_record_of_one_thread_leaves_the_others_exact(tmp_path):
    """Thread 2 is killed while writing a record (reserved, never published: zeros), the other
    threads' later records follow: the hole is skipped and counted, every published record
    decodes to its exact event."""
    rng = random.Random(7)
    evs, threads = _random_events(rng, 400, 3)
    cut = [i for i, t in enumerate(threads) if t == 2][40]
    keep = [i for i in range(len(evs)) if threads[i] != 2 or i < cut]
    recs = _packed(evs, threads)
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p)
    for i, r in enumerate(recs):
        if i == cut:
            r = bytes(len(r))  # the torn record
        elif threads[i] == 2 and i > cut:
            continue  # thread 2 is dead: wrote nothing more
        w._room(len(r))
        w._put(r)
        w.pos += len(r)
    w.close(clean=False)  # no END: killed
    t = read_trace(p)
    assert not t.complete and t.gaps == 1
    assert t.events == [evs[i] for i in keep]


def test_a_record_missing_in_the_middle_is_never_guessed(tmp_path):
    """Damage a kill cannot cause (a record of a thread that wrote more later, zeroed): that
    thread's later records are counted as undecodable, never decoded against the wrong
    reference; the other threads' records stay exact."""
    rng = random.Random(11)
    evs, threads = _random_events(rng, 300, 2)
    hole = [i for i, t in enumerate(threads) if t == 1][10]
    recs = _packed(evs, threads)
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p)
    for i, r in enumerate(recs):
        w._room(len(r))
        w._put(bytes(len(r)) if i == hole else r)
        w.pos += len(r)
    w.close()
    t = read_trace(p)
    lost = [i for i in range(len(evs)) if threads[i] == 1 and i > hole]
    assert t.gaps == 1 and t.bad_events == len(lost)
    assert t.events == [evs[i] for i in range(len(evs)) if i != hole and i not in lost]


def test_thread_numbers_reused(tmp_path):
    """A thread that exited gives its number to the next one, whose first record starts the
    context anew (START): both threads' events exact, one context kept."""
    K = C()
    a = [
        (
            BASE_TS + 10 * i,
            4096 * (i + 1),
            0x1000 * i,
            0,
            0,
            101,
            0,
            0,
            3,
            5,
            0,
            K["CT_OP_ALLOC"],
            1,
            1,
            0,
            0,
        )
        for i in range(5)
    ]
    b = [
        (
            BASE_TS + 5 + 7 * i,
            512,
            0x9000 + i,
            0,
            0,
            202,
            1,
            0,
            4,
            5,
            0,
            K["CT_OP_ALLOC"],
            1,
            1,
            0,
            0,
        )
        for i in range(5)
    ]
    threads = [0] * 5 + [0x80000000] + [0] * 4
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p)
    w.compact_events(a + b, threads)
    w.close()
    t = read_trace(p)
    assert t.events == a + b and t.bad_events == 0 and t.threads == 1
