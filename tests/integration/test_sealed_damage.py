"""A damaged, cut, emptied or deleted sidecar (`<trace>.ctrace.z`) costs only the chunks whose
entries it lost, and every report names them (text, JSON, stderr, exit status 3); an entry
that inflates past one chunk is refused without the memory it asks for (analyze/read/unseal.py,
cudatrace/sidecar.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib

import pytest

from cudatrace import sidecar
from cudatrace.analyze.read.trace import read_trace
from support.cli import checkout_env, cudatrace

CHUNK = 2 << 20


@pytest.fixture(scope="module")
def sealed(sim, tmp_path_factory):
    """One run whose trace was sealed into several chunks: (its directory, its trace, the
    sidecar's entries as (chunk, offset, length), its events)."""
    base = tmp_path_factory.mktemp("sealed")
    env = checkout_env(sim.env(), cache=base / "symcache")
    out = base / "run"
    r = cudatrace(env, "run", "-q", "-o", out, "--", sim.progs["threads"], 2, 400000, 4096)
    assert r.returncode == 0, r.stderr
    trace = next(out.glob("*.ctrace"))
    fd = os.open(sidecar.path_of(trace), os.O_RDONLY)
    try:
        ents = sidecar.Entries(fd, CHUNK)
        found = [(c, off) for c, _raw, off in ents]
        assert not ents.damaged and not ents.torn
    finally:
        os.close(fd)
    ends = [off for _, off in found[1:]] + [os.path.getsize(sidecar.path_of(trace))]
    entries = [(c, off, end - off) for (c, off), end in zip(found, ends)]
    assert len(entries) >= 3, entries
    t = read_trace(trace)
    assert t.status == "complete" and not t.lost_chunks and t.gaps == 0
    return out, trace, entries, t.n_events, env


def _copy(sealed, tmp_path, damage):
    """The run copied to tmp_path/run, its sidecar's bytes given to damage(bytes) -> bytes
    (None: the sidecar deleted)."""
    out, trace, _entries, _n, _env = sealed
    dst = tmp_path / "run"
    shutil.copytree(out, dst)
    side = dst / (trace.name + sidecar.SUFFIX)
    new = damage(side.read_bytes())
    if new is None:
        side.unlink()
    else:
        side.write_bytes(new)
    return dst, dst / trace.name


def _flip(blob: bytes, at: int) -> bytes:
    b = bytearray(blob)
    b[at] ^= 0x10
    return bytes(b)


def _cases(entries):
    """(name, damage, chunks it loses)"""
    c1, off1, len1 = entries[1]
    c_last, off_last, _ = entries[-1]
    return [
        ("a bit of one entry's data", lambda b: _flip(b, off1 + 16 + len1 // 2), [c1]),
        ("one entry's length", lambda b: _flip(b, off1 + 9), [c1]),
        ("one entry's crc", lambda b: _flip(b, off1 + 12), [c1]),
        ("cut inside the last entry", lambda b: b[: off_last + 100], [c_last]),
        ("cut inside the second entry", lambda b: b[: off1 + 40], [c for c, _, _ in entries[1:]]),
        ("emptied", lambda b: b"", [c for c, _, _ in entries]),
        ("deleted", lambda b: None, [c for c, _, _ in entries]),
    ]


@pytest.mark.parametrize("case", range(7))
def test_damage_costs_only_its_chunks_and_is_named(sealed, tmp_path, case):
    out, trace, entries, n_all, env = sealed
    name, damage, lost = _cases(entries)[case]
    dst, copy = _copy(sealed, tmp_path, damage)
    t = read_trace(copy)
    assert t.lost_chunks == sorted(lost), name
    # every other chunk read back: the events lost are those of the lost chunks alone
    per_chunk = n_all / (len(entries) + 1)
    assert n_all - t.n_events < (len(lost) + 1) * per_chunk * 1.6, (name, n_all, t.n_events)
    assert t.n_events > n_all - (len(lost) + 1.6) * per_chunk
    if len(lost) < len(entries):
        assert t.n_events > n_all - len(entries) * per_chunk
    # the report says so: text, JSON, stderr, and exit status 3
    r = cudatrace(env, "report", dst)
    assert r.returncode == 3, (name, r.returncode, r.stderr)
    assert "sealed chunk(s)" in r.stderr and "could not be read back" in r.stderr
    assert "Trace data lost" in r.stdout and copy.name in r.stdout, r.stdout
    assert "chunks " + ", ".join(map(str, sorted(lost))) in r.stdout, r.stdout
    j = json.loads(cudatrace(env, "report", dst, "--json").stdout)
    assert j["lost_chunks"] == [
        {"file": copy.name, "pid": t.pid, "chunks": sorted(lost), "bytes": len(lost) * CHUNK}
    ] or j["lost_chunks"][0]["chunks"] == sorted(lost)
    assert any("sealed chunk" in w for w in j["warnings"])


def test_intact_sidecar_reports_nothing_lost(sealed, tmp_path):
    out, trace, entries, n_all, env = sealed
    dst, copy = _copy(sealed, tmp_path, lambda b: b)
    assert read_trace(copy).n_events == n_all
    r = cudatrace(env, "report", dst)
    assert r.returncode == 0, r.stderr
    assert "Trace data lost" not in r.stdout


def _bomb(chunk: int, inflated: int) -> bytes:
    """A sidecar entry for chunk whose zlib data inflates to `inflated` zero bytes."""
    co = zlib.compressobj(9)
    block = bytes(16 << 20)
    z = b"".join(co.compress(block) for _ in range(inflated // len(block))) + co.flush()
    return sidecar.HEAD.pack(sidecar.MAGIC, chunk, len(z), zlib.crc32(b"")) + z


MAXRSS = r"""
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def test_an_entry_never_inflates_past_one_chunk(sealed, tmp_path):
    out, trace, entries, n_all, env = sealed
    c1, off1, len1 = entries[0]
    bomb = _bomb(c1, 1 << 30)  # 1 MiB of data that inflates to 1 GiB
    assert len(bomb) < 2 << 20

    def damage(blob):
        return blob[:off1] + bomb + blob[off1 + len1 :]

    dst, copy = _copy(sealed, tmp_path, damage)
    r = subprocess.run(
        [sys.executable, "-c", MAXRSS, sys.executable, "-m", "cudatrace", "report", dst],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    rc, maxrss_kib = map(int, r.stdout.split())
    assert rc == 3, r.stderr  # chunk c1 lost, said
    # bounded by one chunk: far below the 1 GiB the entry asks for
    assert maxrss_kib < 400 << 10, maxrss_kib
    assert read_trace(copy).lost_chunks == [c1]
