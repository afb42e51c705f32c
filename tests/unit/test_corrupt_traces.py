"""A corrupt trace costs work bounded by its size, and gives a clear error.

Each corruption is one record field changed in a valid file written by tracegen. Reads that could
blow up run in a subprocess under RLIMIT_AS and a timeout, so a regression fails the test instead
of exhausting the machine.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cudatrace.analyze.read.trace import C, TraceError, layout, read_dir, read_trace
from support.paths import REPO
from support.tracegen import TraceWriter, write_scenario

HDR = struct.Struct("<HHI")


def records(data: bytes):
    """(offset, type, size) of every record, walking sizes from the header on."""
    off = C()["CT_HEADER_SIZE"]
    out = []
    while off + 8 <= len(data):
        magic, rtype, size = HDR.unpack_from(data, off)
        if magic != C()["CT_REC_MAGIC"] or size < 8:
            break
        out.append((off, rtype, size))
        off += size
    return out


def first(data: bytes, name: str) -> tuple[int, int]:
    t = C()[name]
    for off, rtype, size in records(data):
        if rtype == t:
            return off, size
    raise AssertionError(name)


def small_trace(path: Path, pid: int = 4242) -> Path:
    w = TraceWriter(path, pid=pid, argv=["app", "--x"])
    s = w.stack([0x401000, 0x402000, 0x403000])
    w.alloc(w.start_ns + 1000, 1 << 20, 0x7000000, stack=s)
    w.free(w.start_ns + 2000, 0x7000000)
    return w.close()


READ_LIMITED = r"""
import resource, sys, json
resource.setrlimit(resource.RLIMIT_AS, (%d, %d))
from cudatrace.analyze.read.trace import read_dir
td = read_dir(sys.argv[1])
print(json.dumps({"traces": len(td.traces), "errors": td.errors}))
"""


def read_limited(d: Path, limit: int = 1 << 30, timeout: float = 60) -> dict:
    """read_dir in a subprocess whose address space is capped (the reader must never need much)."""
    code = READ_LIMITED % (limit, limit)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(
        [sys.executable, "-c", code, str(d)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def patch(path: Path, off: int, fmt: str, *vals) -> None:
    b = bytearray(path.read_bytes())
    struct.pack_into(fmt, b, off, *vals)
    path.write_bytes(bytes(b))


def with_good_neighbour(tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "run"
    d.mkdir()
    small_trace(d / "4242.0.ctrace")
    bad = small_trace(d / "4243.0.ctrace", pid=4243)
    return d, bad


def test_stack_node_id_far_out_of_range_is_bounded(tmp_path):
    d, bad = with_good_neighbour(tmp_path)
    off, _ = first(bad.read_bytes(), "CT_REC_STACK")
    patch(bad, off + 8, "<I", 0xFFFFFFF0)  # node id
    res = read_limited(d)
    assert res["traces"] == 1
    assert len(res["errors"]) == 1 and "4243.0.ctrace" in res["errors"][0]


def test_process_record_claiming_billions_of_strings_is_bounded(tmp_path):
    d, bad = with_good_neighbour(tmp_path)
    off, _ = first(bad.read_bytes(), "CT_REC_PROCESS")
    patch(bad, off + 8 + 8, "<I", 0xFFFFFFFF)  # nstrings
    res = read_limited(d)
    # the strings that are there are read; the claim of more is not believed
    assert res["traces"] + len(res["errors"]) == 2
    assert res["traces"] >= 1


def test_process_record_with_fewer_than_three_strings(tmp_path):
    d, bad = with_good_neighbour(tmp_path)
    off, _ = first(bad.read_bytes(), "CT_REC_PROCESS")
    patch(bad, off + 8 + 8, "<II", 2, 0)  # nstrings 2, argc 0
    td = read_dir(d)
    assert [t.pid for t in td.traces] == [4242]
    assert len(td.errors) == 1 and "4243.0.ctrace" in td.errors[0]
    assert "PROCESS" in td.errors[0]
    with pytest.raises(TraceError, match="4243.0.ctrace"):
        read_trace(bad)


def test_non_utf8_header_field(tmp_path):
    d, bad = with_good_neighbour(tmp_path)
    hs, hn = layout("struct ct_file_header")
    # offset of arch: sum of field sizes before it
    off = 8 + 4 * 8 + 8 * 3
    assert hs.unpack_from(bad.read_bytes(), 0)[hn.index("arch")].startswith(b"x86_64")
    patch(bad, off, "<4s", b"\xff\xfe\xfd\xfc")
    td = read_dir(d)
    # readable: a garbled architecture name is shown, not a crash
    assert len(td.traces) + len(td.errors) == 2
    assert not any("BufferError" in e for e in td.errors)


def test_header_only_record_at_end_of_file(tmp_path):
    d, bad = with_good_neighbour(tmp_path)
    data = bad.read_bytes()
    recs = records(data)
    last_off, last_type, _ = recs[-1]
    assert last_type == C()["CT_REC_END"]
    # the END record cut to its 8-byte header, as the file's last bytes
    b = bytearray(data[:last_off]) + HDR.pack(C()["CT_REC_MAGIC"], C()["CT_REC_END"], 8)
    bad.write_bytes(bytes(b))
    td = read_dir(d)
    assert [t.pid for t in td.traces] == [4242]
    assert len(td.errors) == 1 and "4243.0.ctrace" in td.errors[0]
    assert "BufferError" not in td.errors[0]


@pytest.mark.parametrize(
    "rtype,field_off,fmt,val",
    [
        ("CT_REC_MODULE", 8 + 32, "<I", 0xFFFFFFFF),  # build_id_len
        ("CT_REC_MODULE", 8 + 36, "<I", 0xFFFFFFFF),  # path_len
        ("CT_REC_API", 8 + 6, "<H", 0xFFFF),  # name_len
        ("CT_REC_INFO", 8 + 0, "<H", 0xFFFF),  # key_len
    ],
)
def test_lengths_beyond_their_record(tmp_path, rtype, field_off, fmt, val):
    d = tmp_path / "run"
    d.mkdir()
    w = TraceWriter(d / "4242.0.ctrace", pid=4242)
    w.module("/usr/lib/libx.so", 0x400000, 0x500000, build_id=b"\1\2\3\4")
    w.alloc(w.start_ns + 1000, 1 << 20, 0x7000000)
    p = w.close()
    off, _ = first(p.read_bytes(), rtype)
    patch(p, off + field_off, fmt, val)
    res = read_limited(d)
    assert res["traces"] + len(res["errors"]) == 1


def test_scenario_dir_with_one_corrupt_file_reports_the_rest(tmp_path):
    write_scenario(tmp_path / "s")
    bad = tmp_path / "s" / "1001.0.ctrace"
    off, _ = first(bad.read_bytes(), "CT_REC_STACK")
    patch(bad, off + 8, "<I", 0x7FFFFFFF)
    res = read_limited(tmp_path / "s")
    assert res["traces"] == 1 and len(res["errors"]) == 1


@pytest.mark.parametrize("kind", ["fifo", "dir", "dangling"])
def test_odd_files_named_ctrace_do_not_hang_or_abort(tmp_path, kind):
    d, _bad = with_good_neighbour(tmp_path)
    odd = d / "9999.0.ctrace"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "dir":
        odd.mkdir()
    else:
        odd.symlink_to(tmp_path / "nowhere")
    res = read_limited(d, timeout=20)  # a FIFO would block open() forever: the subprocess times out
    assert res["traces"] == 2
    assert len(res["errors"]) == 1 and "9999.0.ctrace" in res["errors"][0]
