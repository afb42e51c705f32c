"""Raw events (CT_REC_RAWBLOCK, format version 4; issue 42): the shim's encoder
(native/include/rawevent.h, reached through ct_rawblock_pack, which lays blocks out as the
writer does) and the C scanner and replay agree on every field, whatever the threads'
interleaving; a chunk reads on its own; the sealer's transcoder (native/reader/transcode.c)
turns a chunk's raw blocks into compact ones holding the very same events, and keeps a chunk it
cannot carry over exactly as it is."""

from __future__ import annotations

import random
import struct

import pytest

from cudatrace import native
from cudatrace.analyze.read.trace import C, layout, read_trace
from support.tracegen import BASE_TS, TraceWriter

U64 = (1 << 64) - 1


def _events(rng: random.Random, n: int, nthreads: int, repeat: float = 0.9, back: bool = True):
    """(thread number, event) pairs: mostly a repeated site (short records), with every field
    changing now and then (full records): sizes of 2^48 and more, times going back or jumping
    more than 2^32 ns, other streams, devices, results, tids and runtime APIs."""
    K = C()
    ts = [BASE_TS + i for i in range(nthreads)]
    addr = [0x7F0000000000 + (i << 36) for i in range(nthreads)]
    out = []
    for _ in range(n):
        t = rng.randrange(nthreads)
        common = rng.random() < repeat
        ts[t] += rng.choice([300, 1000, 90_000]) if common else rng.choice([0, 1, 1 << 33])
        if back and not common and rng.random() < 0.1:
            ts[t] -= rng.randrange(5000)  # never done by a real clock: still exact
        addr[t] += 1 << 21
        alloc = rng.random() < 0.5
        ev = (
            ts[t],
            (1 << 20 if common else rng.choice([0, 1 << 48, rng.getrandbits(64)])) if alloc else 0,
            addr[t] if common else rng.getrandbits(64),
            0 if common else rng.choice([0, rng.getrandbits(64)]),
            0 if common else rng.choice([0, 5, U64]),
            1000 + t if common or rng.random() < 0.9 else rng.getrandbits(32),
            0 if common else rng.choice([-1, 0, 1, 7]),
            0 if common else rng.choice([0, 2, -5, 999]),
            rng.choice([3, 3, 4, 0xFFFFFFFF]),
            (5 if alloc else 7) if common else rng.randrange(1 << 9),
            0 if common else rng.randrange(3),
            K["CT_OP_ALLOC"] if alloc else K["CT_OP_FREE"],
            4 if alloc else 0,
            1,
            0 if common else rng.randrange(256),
            rng.choice([0, K["CT_EV_STACK_CACHED"]]),
        )
        out.append((t, ev))
    return out


def _write(path, items, nthreads: int, clean: bool = True) -> TraceWriter:
    w = TraceWriter(path)
    w.block_events(iter(items), nthreads=nthreads, raw=True)
    w.close(clean=clean)
    return w


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_round_trip_random_interleavings(tmp_path, seed):
    rng = random.Random(seed)
    items = _events(rng, 30000, 4)
    p = tmp_path / "1.0.ctrace"
    _write(p, items, 4)
    t = read_trace(p)
    assert t.complete and t.bad_events == 0 and t.gaps == 0 and t.threads == 4
    assert sorted(t.events) == sorted(e for _, e in items)
    order = {}
    for _, e in items:  # a thread's events keep its order (ts ties aside: exact tuples)
        order.setdefault(e[5], []).append(e)
    seen = {}
    for e in t.events:
        seen.setdefault(e[5], []).append(e)
    assert all(seen[k] == v for k, v in order.items() if len(set(map(tuple, v))) == len(v))
    cached = sum(1 for _, e in items if e[15] & C()["CT_EV_STACK_CACHED"])
    assert t.stack_cache_hits == cached


def test_the_replay_streams_raw_blocks(tmp_path):
    # the replay decodes the blocks again as it goes (each thread's times in order): the same
    # figures as from the events given whole (version 1 records, replayed from an array)
    from cudatrace.analyze.replay.model import build

    items = _events(random.Random(8), 30000, 3, back=False)
    p = tmp_path / "1.0.ctrace"
    _write(p, items, 3)
    t = read_trace(p)
    assert t.source_blocks is not None  # streamed from its blocks, never held
    v1 = tmp_path / "v1" / "1.0.ctrace"
    v1.parent.mkdir()
    w = TraceWriter(v1, version=1)
    w.raw_events(e for _, e in items)
    w.close()
    a, b = build([t]), build([read_trace(v1)])
    key = lambda m: (m.peak_bytes, m.peak_ts, m.end_bytes, sorted(m.backend.stack_totals().items()))
    assert key(a) == key(b) and a.peak_bytes > 0


def test_repeated_sites_take_a_short_record(tmp_path):
    items = _events(random.Random(5), 20000, 1, repeat=1.0)
    p = tmp_path / "1.0.ctrace"
    w = TraceWriter(p)
    start = w.pos
    w.block_events(iter(items), nthreads=1, raw=True)
    per_event = (w.pos - start) / len(items)
    w.close()
    assert read_trace(p).events == [e for _, e in items]
    # the block headers, a block's last bytes, one full record an API a chunk
    assert 24 <= per_event <= 25, per_event


def _chunks(data: bytes, cs: int) -> list[bytes]:
    return [data[i : i + cs] for i in range(0, len(data), cs)]


def _compact(chunk: bytes) -> tuple[int, bytes]:
    ffi, lib = native.tools()
    out = ffi.new("uint8_t[]", len(chunk))
    n = lib.ct_chunk_compact(ffi.from_buffer(chunk), len(chunk), out)
    return n, ffi.buffer(out, len(chunk))[:]


def test_transcoded_chunks_hold_the_same_events(tmp_path):
    items = _events(random.Random(9), 200000, 3)
    p = tmp_path / "1.0.ctrace"
    _write(p, items, 3)
    before = read_trace(p)
    cs = C()["CT_CHUNK_SIZE"]
    data = p.read_bytes()
    parts = _chunks(data, cs)
    assert len(parts) >= 3
    ends = []
    for i in range(1, len(parts)):
        n, out = _compact(parts[i])
        assert n, i
        ends.append(len(out.rstrip(b"\0")))  # (a PAD to the chunk's end, if its input had one)
        parts[i] = out[: len(parts[i])]
    assert max(ends) < cs / 2  # compact events: far smaller than the raw ones
    q = tmp_path / "t" / "1.0.ctrace"
    q.parent.mkdir()
    q.write_bytes(b"".join(parts))
    after = read_trace(q)
    assert after.complete and after.bad_events == 0 and after.gaps == 0
    assert after.events == before.events
    assert after.stack_cache_hits == before.stack_cache_hits > 0
    # every chunk reads on its own: chunk 1 alone (the others zeros) gives its own events
    alone = tmp_path / "a" / "1.0.ctrace"
    alone.parent.mkdir()
    alone.write_bytes(b"".join(x if i in (0, 1) else bytes(len(x)) for i, x in enumerate(parts)))
    t1 = read_trace(alone)
    assert t1.bad_events == 0 and 0 < t1.n_events < before.n_events
    assert set(t1.events) <= set(before.events)


def test_chunks_the_transcoder_cannot_carry_over_are_kept(tmp_path):
    items = _events(random.Random(4), 150000, 2)
    p = tmp_path / "1.0.ctrace"
    _write(p, items, 2)
    cs = C()["CT_CHUNK_SIZE"]
    chunk = bytearray(_chunks(p.read_bytes(), cs)[1])
    hdr = layout("struct ct_rec_hdr")[0]
    # a hole a killed writer left (a record reserved, never published): not carried over
    off, holes = 0, bytearray(chunk)
    while off < len(holes):
        magic, rtype, size = hdr.unpack_from(holes, off)
        if rtype == C()["CT_REC_RAWBLOCK"] and off > 0:
            holes[off : off + size] = bytes(size)
            break
        off += size
    assert _compact(bytes(holes))[0] == 0
    # a block whose records do not decode: not carried over
    bad = bytearray(chunk)
    off = 0
    while off < len(bad):
        magic, rtype, size = hdr.unpack_from(bad, off)
        if rtype == C()["CT_REC_RAWBLOCK"]:
            struct.pack_into("<Q", bad, off + 8 + 16, 0xF << 56)  # no kind of record
            break
        off += size
    assert _compact(bytes(bad))[0] == 0
    assert _compact(bytes(chunk))[0] > 0
    # compact blocks (version 3): not this function's (its records, as if a chunk)
    v3 = tmp_path / "2.0.ctrace"
    w = TraceWriter(v3)
    w.block_events(iter(items[:20000]), nthreads=2)
    w.close(clean=False)
    recs = v3.read_bytes()[C()["CT_HEADER_SIZE"] :]
    assert _compact(recs + bytes(cs - len(recs)))[0] == 0


def test_a_block_missing_in_the_middle_loses_its_thread_to_the_next_chunk(tmp_path):
    """Damage a kill cannot cause (a block of a thread that wrote more later, zeroed): that
    thread's later blocks of the chunk are not decoded (counted, never guessed); from its
    next chunk on it reads again; the other thread stays exact."""
    items = _events(random.Random(21), 150000, 2, repeat=1.0)
    p = tmp_path / "1.0.ctrace"
    _write(p, items, 2)
    full = read_trace(p)
    data = bytearray(p.read_bytes())
    hdr = layout("struct ct_rec_hdr")[0]
    K = C()
    off, blocks = K["CT_HEADER_SIZE"], []
    while off < K["CT_CHUNK_SIZE"]:
        magic, rtype, size = hdr.unpack_from(data, off)
        if magic != K["CT_REC_MAGIC"]:
            break
        if rtype == K["CT_REC_RAWBLOCK"]:
            blocks.append((off, size, struct.unpack_from("<I", data, off + 12)[0]))
        off += size
    ones = [b for b in blocks if b[2] == 1]
    hole_off, hole_size, _ = ones[len(ones) // 2]
    data[hole_off : hole_off + hole_size] = bytes(hole_size)
    q = tmp_path / "d" / "1.0.ctrace"
    q.parent.mkdir()
    q.write_bytes(bytes(data))
    t = read_trace(q)
    assert t.gaps == 1 and t.bad_events > 0
    zero = [e for e in full.events if e[5] == 1000]
    assert [e for e in t.events if e[5] == 1000] == zero  # thread 0: exact
    one = [e for e in t.events if e[5] == 1001]
    all_one = [e for e in full.events if e[5] == 1001]
    assert one and one[-1] == all_one[-1]  # thread 1 read again in the next chunk
    assert len(one) + t.bad_events < len(all_one)


def _gone_trace(d, items, nthreads):
    """A version-4 trace of a process that is gone (pid 1 with another start time), written
    as the shim would have and left at its chunks' size (killed)."""
    p = d / "1.0.ctrace"
    w = TraceWriter(p, pid=1)
    w.block_events(iter(items), nthreads=nthreads, raw=True)
    w.close(clean=False)
    return p


def test_the_sealer_transcodes_every_chunk_and_rewrites_the_first(tmp_path):
    from cudatrace.record.seal import Sealer

    items = _events(random.Random(13), 250000, 2, repeat=1.0)
    d = tmp_path / "run"
    d.mkdir()
    p = _gone_trace(d, items, 2)
    before = read_trace(p).events
    raw_disk = p.stat().st_blocks * 512
    s = Sealer(d)
    s.pass_once(final=True)
    assert not s.error, s.error
    t = read_trace(p)
    assert t.events == before and t.gaps == 0 and t.bad_events == 0
    # chunk 0 holds compact blocks now, its rest a hole; every other chunk is in the sidecar
    cs = C()["CT_CHUNK_SIZE"]
    first = p.read_bytes()[:cs]
    hdr = layout("struct ct_rec_hdr")[0]
    off, types = C()["CT_HEADER_SIZE"], set()
    while off < cs:
        magic, rtype, size = hdr.unpack_from(first, off)
        types.add(rtype)
        off += size
    assert C()["CT_REC_CEBLOCK"] in types and C()["CT_REC_RAWBLOCK"] not in types
    disk = p.stat().st_blocks * 512 + (d / (p.name + ".z")).stat().st_blocks * 512
    assert disk < raw_disk / 3, (disk, raw_disk)  # (random fields: no repeated site's 2 B)
    assert not list(d.glob(".*.tmp"))


def test_a_chunk_the_sidecar_could_not_take_keeps_the_first_raw(tmp_path):
    from cudatrace.record.seal import Sealer

    items = _events(random.Random(14), 120000, 1, repeat=1.0)
    d = tmp_path / "run"
    d.mkdir()
    p = _gone_trace(d, items, 1)
    before = read_trace(p).events
    (d / (p.name + ".z")).mkdir()  # no sidecar can be written: every chunk stays
    s = Sealer(d)
    s.pass_once(final=True)
    assert s.error
    t = read_trace(p)
    assert t.events == before and not t.lost_chunks
    cs = C()["CT_CHUNK_SIZE"]
    raw_type = struct.pack("<H", C()["CT_REC_RAWBLOCK"])
    assert raw_type in p.read_bytes()[C()["CT_HEADER_SIZE"] : cs]  # chunk 0 as the shim wrote it
