"""Sealed chunks compressed by the launcher (record/seal.py; issue 25): the trace's chunks that
no thread writes again go into `<trace>.z` (zlib) and are punched out of the trace; the reader
puts them back, so every reader sees the same events; a torn sidecar entry or a SIGKILL loses
nothing sealed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from cudatrace import native, sidecar, tracedir
from cudatrace.analyze.read.trace import read_dir, read_trace
from cudatrace.record.seal import Sealer
from support import children


def _entries(side) -> list[tuple[int, bytes]]:
    """(chunk, raw) of each intact entry of a sidecar."""
    fd = os.open(side, os.O_RDONLY)
    try:
        return [(c, raw) for c, raw, _off in sidecar.Entries(fd, 2 << 20)]
    finally:
        os.close(fd)


def _disk(p) -> int:
    return os.stat(p).st_blocks * 512


def test_sealed_chunks_compressed_and_read_back(ct, sim, tmp_path):
    # 2 threads x 300000 pairs, 64-frame stacks: ~8 MiB of trace, 4 chunks
    r = ct.run([sim.progs["threads"], 2, 300000, 4096])
    assert r.returncode == 0, r.stderr
    trace = next(r.out.glob("*.ctrace"))
    side = trace.with_name(trace.name + sidecar.SUFFIX)
    assert side.is_file()
    entries = list(_entries(side))
    assert len(entries) >= 2 and all(c >= 1 for c, _ in entries)
    # the trace gave its sealed chunks' blocks back; the sidecar is far smaller than they were
    assert _disk(trace) < trace.stat().st_size - 2 * 2**20
    assert side.stat().st_size < len(entries) * 2**20
    t = read_trace(trace)
    assert t.status == "complete" and t.gaps == 0 and t.bad_events == 0
    assert t.n_events == 2 * 2 * 300000
    # the same events as the shim wrote: put the chunks back by hand, the file alone reads so
    data = bytearray(trace.read_bytes())
    for c, raw in entries:
        data[c * 2**20 * 2 : (c + 1) * 2**20 * 2] = raw
    plain = tmp_path / "plain.ctrace"
    plain.write_bytes(bytes(data))
    t2 = read_trace(plain)
    assert t2.n_events == t.n_events
    ev1, ev2 = t.raw_events, t2.raw_events
    assert all(ev1[i].ts_ns == ev2[i].ts_ns for i in range(0, t.n_events, 997))
    # a torn last entry (the launcher killed while appending) is ignored, nothing else is lost
    torn = tmp_path / "torn.ctrace"
    torn.write_bytes(trace.read_bytes())
    blob = side.read_bytes()
    last = blob.rindex(sidecar.MAGIC)
    (tmp_path / ("torn.ctrace" + sidecar.SUFFIX)).write_bytes(blob + blob[last : last + 40])
    assert read_trace(torn).n_events == t.n_events
    # a sidecar planted as a link is never written through; the trace is then left as it is
    planted = tmp_path / "planted"
    planted.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    copy = planted / trace.name
    copy.write_bytes(bytes(data))
    (planted / (trace.name + sidecar.SUFFIX)).symlink_to(victim)
    s = Sealer(planted)
    s.pass_once(final=True)
    assert victim.read_bytes() == b"keep" and s.error
    assert read_trace(copy).n_events == t.n_events
    # run.json says what was compressed
    assert '"sealed"' in (r.out / tracedir.RUN).read_text()


def test_sealed_while_running_and_sigkill_loses_nothing(ct, sim):
    # a long loop: chunks are sealed (the writer unmaps them) and compressed while it runs; then
    # it is killed, and the launcher seals the dead process's file whole
    out = ct.new_dir()
    cmd = [sys.executable, "-m", "cudatrace", "run", "-o", str(out), "-q", "--"]
    cmd += [str(sim.progs["threads"]), "1", "20000000", "4096"]
    p = children.popen(cmd, env=ct.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    side = None
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and p.poll() is None:
            found = list(out.glob("*.ctrace" + sidecar.SUFFIX))
            if found and list(_entries(found[0])):
                side = found[0]
                break
            time.sleep(0.1)
        assert side is not None, "no chunk was compressed while the program ran"
        trace = side.with_name(side.name[: -len(sidecar.SUFFIX)])
        off = native.ffi().offsetof("struct ct_file_header", "sealed_chunks")
        assert int.from_bytes(trace.read_bytes()[off : off + 4], "little") >= 1
        os.kill(int(trace.name.split(".")[0]), signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    t = read_dir(out).traces[0]
    assert t.status == "truncated" and t.bad_events == 0 and t.gaps == 0
    assert t.n_events > 5 * 2 * 2**20 / 8  # > 5 chunks of events, all read back
    # every chunk but the header's is in the sidecar now (the process is gone), the last one
    # (cut to its records) included, and the header says so
    # (killed just after it began a chunk, before a record there, the writer leaves that chunk
    # empty: it is sealed too, and the file cut to its records ends before it)
    chunks = {c for c, _ in _entries(side)}
    n = -(-trace.stat().st_size // (2 * 2**20))
    empty = chunks - set(range(1, n))
    assert set(range(1, n)) <= chunks and empty <= {n}, (chunks, n)
    assert int.from_bytes(trace.read_bytes()[off : off + 4], "little") == n + len(empty)
