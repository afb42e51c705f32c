"""Synthetic cudatrace traces: a writer of valid files in the native/include/trace_format.h format.

Records are packed with the struct layouts cudatrace.analyze.read.trace derives from trace_format.h through cffi,
so a file written here is read by the same code (and the same C scanner) as a real trace. The
API table is taken from native/include/hooks.def, as the shim writes it. Used by the tests and by
tools/bench_report.py.

    w = TraceWriter(dir / "1000.0.ctrace", pid=1000)
    mod = w.module("/usr/bin/app", 0x400000, 0x500000)
    leaf = w.stack([0x401234, 0x405678])          # return addresses, innermost first
    w.alloc(ts, 1 << 20, 0x7f0000000000, stack=leaf)
    w.free(ts2, 0x7f0000000000)
    w.close()                                      # clean exit: END record
    write_run(dir, argv=[...], samples=[...])      # run.json and samples.jsonl
"""

from __future__ import annotations

import bisect
import json
import os
import re
import struct
from collections import namedtuple
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cudatrace import __version__, native, settings
from cudatrace.analyze.read.trace import C, event_fields, layout

BASE_TS = 1_000_000_000_000  # monotonic ns of a trace's start unless told otherwise
MS = 1_000_000
SEC = 1_000_000_000

_API_RE = re.compile(
    r"^CT_(DRIVER|RUNTIME|NVML)\((\w+)(?:,\s*\"\w+\",\s*\d+,\s*\d,\s*(CT_OP_\w+),\s*"
    r"(CT_KIND_\w+),\s*(CT_SPACE_\w+))?",
    re.M,
)


def api_table() -> list[tuple[int, str, int, int, int, int]]:
    """(id, name, layer, op, kind, space) for every hook of native/include/hooks.def, ids from 1."""
    src = native.source_dir()
    assert src is not None, "the native sources are not here"
    text = (src / "include" / "hooks.def").read_text()
    K = C()
    out: list[tuple[int, str, int, int, int, int]] = []
    for m in _API_RE.finditer(text):
        what, name = m.group(1), m.group(2)
        if what == "DRIVER":
            layer, op, kind, space = (
                K["CT_LAYER_DRIVER"],
                K[m.group(3)],
                K[m.group(4)],
                K[m.group(5)],
            )
        elif what == "RUNTIME":
            layer, op, kind, space = K["CT_LAYER_RUNTIME"], K["CT_OP_NONE"], 0, 0
        else:
            layer, op, kind, space = K["CT_LAYER_NVML"], K["CT_OP_MEMINFO"], 0, 0
        out.append((len(out) + 1, name, layer, op, kind, space))
    return out


class TraceWriter:
    """Writes one trace file, record by record, as the shim's writer lays them out: 8-byte
    aligned records that never cross a CT_CHUNK_SIZE boundary (PAD fills a chunk's rest), an END
    record on a clean close, and zeros after the last record up to the end of its chunk."""

    def __init__(
        self,
        path: str | Path,
        pid: int = 1000,
        ppid: int = 1,
        exe: str = "/usr/bin/app",
        argv: list[str] | None = None,
        host: str = "testhost",
        cwd: str = "/tmp",
        start_ns: int = BASE_TS,
        stack_depth: int = settings.default_int("STACK_DEPTH"),
        exec_index: int = 0,
        realtime_ns: int = 1_700_000_000 * SEC,
        driver_version: int | None = 12040,
        info: dict | None = None,
        arch: str = "x86_64",
        buffer_bytes: int = 8 << 20,
        version: int | None = None,
        header: dict | None = None,
    ):
        self.path = Path(path)
        self.K = C()
        self.chunk = self.K["CT_CHUNK_SIZE"]
        self.f = open(self.path, "wb")
        self.buf = bytearray()
        self.buffer_bytes = buffer_bytes
        self.pos = 0  # file offset of the next record
        self.start_ns = start_ns
        self.events = 0
        self.nodes: dict[tuple[int, int], int] = {}
        hs, hn = layout("struct ct_file_header")
        vals = {
            "magic": b"CUDATRC\0",
            "version": version or self.K["CT_FORMAT_VERSION"],
            "header_size": self.K["CT_HEADER_SIZE"],
            "chunk_size": self.chunk,
            "pointer_size": 8,
            "pid": pid,
            "ppid": ppid,
            "exec_index": exec_index,
            "stack_depth": stack_depth,
            "start_monotonic_ns": start_ns,
            "start_realtime_ns": realtime_ns,
            "process_start_ticks": 12345,
            "arch": arch.encode(),
            "shim_version": __version__.encode(),
            "reserved": b"",
            "stopped_ns": 0,
            "stopped_errno": 0,
            "stopped_exit": 0,
        }
        vals.update(header or {})  # e.g. the stack counters
        head = hs.pack(*[vals.get(n, 0) for n in hn])
        self._put(head + bytes(self.K["CT_HEADER_SIZE"] - len(head)))
        self.pos = self.K["CT_HEADER_SIZE"]
        self._hdr = layout("struct ct_rec_hdr")[0]
        es = layout("struct ct_event")[0]
        self._evrec = struct.Struct("<HHI" + es.format.lstrip("<@=!>"))
        assert self._evrec.size == 8 + es.size
        self._evsize = self._evrec.size
        self.apis = {
            name: (aid, layer, op, kind, space) for aid, name, layer, op, kind, space in api_table()
        }
        # the opening records, as ct_write_preamble writes them
        argv = list(argv) if argv is not None else [exe]
        strs = [exe, host, cwd] + argv
        ps = layout("struct ct_rec_process")[0]
        self._record(
            self.K["CT_REC_PROCESS"],
            ps.pack(pid, ppid, len(strs), len(argv)) + b"".join(s.encode() + b"\0" for s in strs),
        )
        api_s = layout("struct ct_rec_api")[0]
        for name, (aid, layer, op, kind, space) in self.apis.items():
            self._record(
                self.K["CT_REC_API"],
                api_s.pack(aid, layer, op, kind, space, len(name)) + name.encode() + b"\0",
            )
        self.info("stack_depth", str(stack_depth))
        self.info("shim_version", __version__)
        for k, v in (info or {}).items():
            self.info(k, str(v))
        if driver_version is not None:
            self.info("driver_version", str(driver_version))

    # ---- raw output ----
    def _put(self, b: bytes) -> None:
        self.buf += b
        if len(self.buf) >= self.buffer_bytes:
            self.f.write(self.buf)
            self.buf = bytearray()

    def _room(self, size: int) -> None:
        """Start a new chunk if a record of size bytes would cross the boundary."""
        rest = self.chunk - self.pos % self.chunk
        if size > rest:
            if rest >= 8:
                self._put(
                    self._hdr.pack(self.K["CT_REC_MAGIC"], self.K["CT_REC_PAD"], rest)
                    + bytes(rest - 8)
                )
            else:
                self._put(bytes(rest))
            self.pos += rest

    def _record(self, rtype: int, body: bytes) -> None:
        size = (8 + len(body) + 7) & ~7
        self._room(size)
        self._put(
            self._hdr.pack(self.K["CT_REC_MAGIC"], rtype, size) + body + bytes(size - 8 - len(body))
        )
        self.pos += size

    # ---- records ----
    def info(self, key: str, value: str) -> None:
        s = layout("struct ct_rec_info")[0]
        self._record(
            self.K["CT_REC_INFO"],
            s.pack(len(key.encode()), len(value.encode()), 0)
            + key.encode()
            + b"\0"
            + value.encode()
            + b"\0",
        )

    def module(
        self,
        path: str,
        start: int,
        end: int,
        base: int | None = None,
        build_id: bytes | None = None,
        ts: int | None = None,
    ) -> None:
        """A loaded ELF object: runtime address = file vaddr + base (base = start by default)."""
        s = layout("struct ct_rec_module")[0]
        bid = build_id or b""
        p = path.encode()
        self._record(
            self.K["CT_REC_MODULE"],
            s.pack(
                ts if ts is not None else self.start_ns,
                start if base is None else base,
                start,
                end,
                len(bid),
                len(p),
            )
            + bid
            + p
            + b"\0",
        )

    def stack(self, ips: Iterable[int]) -> int:
        """The leaf node id of a stack (return addresses, innermost first); nodes are written
        once, as the shim's stack tree does."""
        parent = 0
        for ip in reversed(list(ips)):
            key = (parent, ip)
            nid = self.nodes.get(key)
            if nid is None:
                nid = len(self.nodes) + 1
                self.nodes[key] = nid
                s = layout("struct ct_rec_stack")[0]
                self._record(self.K["CT_REC_STACK"], s.pack(nid, parent, ip))
            parent = nid
        return parent

    # ---- Python frames (docs/python-frames.md) ----
    def pycode(
        self,
        filename: str,
        qualname: str,
        firstlineno: int,
        lines: list[int],
        address: int | None = None,
    ) -> int:
        """A code object whose instruction i (2-byte units) runs line lines[i]; returns its id."""
        self.pycodes = getattr(self, "pycodes", 0) + 1
        table, prev = bytearray(), firstlineno
        for ln in lines:  # one "no column" entry per code unit
            d = ln - prev
            v = (d << 1) if d >= 0 else ((-d) << 1) | 1
            table.append(0x80 | (13 << 3))
            while True:
                b = v & 63
                v >>= 6
                table.append(b | (64 if v else 0))
                if not v:
                    break
            prev = ln
        s = layout("struct ct_rec_pycode")[0]
        f, q = filename.encode(), qualname.encode()
        addr = address if address is not None else 0x7F0000000000 + self.pycodes * 0x1000
        self._record(
            self.K["CT_REC_PYCODE"],
            s.pack(
                addr,
                addr + 0xC0,
                self.pycodes,
                firstlineno,
                len(lines),
                len(table),
                len(f),
                len(q),
                0,
            )
            + f
            + b"\0"
            + q
            + b"\0"
            + bytes(table),
        )
        return self.pycodes

    def pystack(self, frames: Iterable[tuple[int, int, int]]) -> int:
        """The Python leaf of frames [(code id, instruction index, entry)], innermost first."""
        nodes = self.__dict__.setdefault("pynodes", {})
        parent = 0
        for code, lasti, entry in reversed(list(frames)):
            key = (parent, code, lasti, int(entry))
            nid = nodes.get(key)
            if nid is None:
                nid = nodes[key] = len(nodes) + 1
                s = layout("struct ct_rec_pyframe")[0]
                self._record(
                    self.K["CT_REC_PYFRAME"], s.pack(nid, parent, code, lasti, int(entry), 0)
                )
            parent = nid
        return parent

    def pylink(
        self, native_ips: Iterable[int], py_leaf: int | None = None, why: int | None = None
    ) -> int:
        """A stack ending with the Python link node (frames, or the reason there are none)."""
        kind, value = (
            (self.K["CT_PYLINK_FRAMES"], py_leaf) if why is None else (self.K["CT_PYLINK_WHY"], why)
        )
        assert value is not None, "give py_leaf or why"
        return self.stack([self.K["CT_PYLINK_TAG"] | kind << 32 | value] + list(native_ips))

    def api_id(self, name: str | None) -> int:
        if not name:
            return 0
        return self.apis[name][0]

    def event(
        self,
        ts: int,
        api: str,
        size: int = 0,
        addr: int = 0,
        aux: int = 0,
        aux2: int = 0,
        tid: int = 1,
        device: int = 0,
        result: int = 0,
        stack: int = 0,
        rt: str | None = None,
        op: int | None = None,
        kind: int | None = None,
        space: int | None = None,
        flags: int = 0,
    ) -> None:
        """One EVENT; op, kind and space default to the API's own (hooks.def)."""
        aid, _layer, aop, akind, aspace = self.apis[api]
        rt_id = self.api_id(rt)
        if rt_id:
            flags |= self.K["CT_EF_RUNTIME_KNOWN"]
        self.raw_event(
            (
                ts,
                size,
                addr,
                aux,
                aux2,
                tid,
                device,
                result,
                stack,
                aid,
                rt_id,
                aop if op is None else op,
                akind if kind is None else kind,
                aspace if space is None else space,
                flags,
                0,
            )
        )

    def raw_event(self, fields: tuple) -> None:
        """An EVENT from a tuple in event_fields() order (reserved last): the fast path."""
        pos = self.pos
        if self.chunk - pos % self.chunk < self._evsize:
            self._room(self._evsize)
            pos = self.pos
        self._put(
            self._evrec.pack(self.K["CT_REC_MAGIC"], self.K["CT_REC_EVENT"], self._evsize, *fields)
        )
        self.pos = pos + self._evsize
        self.events += 1

    def raw_events(self, it: Iterable[tuple[int, ...]]) -> None:
        """Many EVENT tuples at once (tools/bench_report.py writes millions this way)."""
        pack_into = self._evrec.pack_into
        magic, rtype, size = self.K["CT_REC_MAGIC"], self.K["CT_REC_EVENT"], self._evsize
        chunk = self.chunk
        block = bytearray(size * 65536)
        n = 0
        pos = self.pos
        for fields in it:
            if chunk - pos % chunk < size:
                self._put(bytes(block[: n * size]))
                n = 0
                self.pos = pos
                self._room(size)
                pos = self.pos
            pack_into(block, n * size, magic, rtype, size, *fields)
            n += 1
            pos += size
            self.events += 1
            if n == 65536:
                self._put(bytes(block))
                n = 0
        self._put(bytes(block[: n * size]))
        self.pos = pos

    def compact_events(
        self, events: Sequence[tuple[int, ...]], threads: Sequence[int] | None = None
    ) -> None:
        """Events (tuples in event_fields() order) as compact records (CT_REC_CEVENT), encoded
        by the shim's own encoder (native/include/cevent.h, through ct_cevent_pack); event i
        written by thread number threads[i] (default: all thread 0)."""
        ffi, lib = native.tools()
        es = layout("struct ct_event")[0]
        events = list(events)
        n = len(events)
        raw = bytearray(es.size * max(n, 1))
        for k, e in enumerate(events):
            es.pack_into(raw, k * es.size, *e)
        evs = ffi.from_buffer("struct ct_event[]", raw)
        th = ffi.new("uint32_t[]", list(threads) if threads is not None else max(n, 1))
        # (a number with bit 31 set: a new thread takes it, as the shim reuses exited threads')
        need = lib.ct_cevent_pack(evs, n, th, ffi.NULL, 0)
        out = ffi.new("uint8_t[]", max(need, 1))
        lib.ct_cevent_pack(evs, n, th, out, need)
        data = ffi.buffer(out, need)[:]
        off = 0
        while off < need:
            size = struct.unpack_from("<I", data, off + 4)[0]
            self._room(size)
            self._put(data[off : off + size])
            self.pos += size
            off += size
        self.events += n

    def block_events(
        self,
        it: Iterable[tuple[int, Sequence[int]]],
        nthreads: int = 1,
        batch: int = 65536,
        raw: bool = False,
    ) -> None:
        """Events as the shim writes them: event blocks, each thread filling blocks of its own,
        encoded by the shim's encoder: compact (format version 3, CT_REC_CEBLOCK, cevent.h,
        through ct_ceblock_pack) or, with raw, raw records (version 4, CT_REC_RAWBLOCK,
        rawevent.h, through ct_rawblock_pack). it yields (thread number, event tuple in
        event_fields() order); thread numbers below nthreads, bit 31 set: a new thread takes
        that number. Streamed in batches: millions of events without holding them."""
        ffi, lib = native.tools()
        es = layout("struct ct_event")[0]
        size_of = lib.ct_rawblock_state_size if raw else lib.ct_ceblock_state_size
        pack = lib.ct_rawblock_pack if raw else lib.ct_ceblock_pack
        key = "_rb_state" if raw else "_cb_state"
        state = getattr(self, key, None)
        if state is None or len(state) < size_of(nthreads):
            state = ffi.new("uint8_t[]", size_of(nthreads))
            setattr(self, key, state)
        buf = bytearray(es.size * batch)
        ths = ffi.new("uint32_t[]", batch)
        cap = batch * 160 + (8 << 20)
        out = ffi.new("uint8_t[]", cap)
        pack_into = es.pack_into
        n = 0

        def flush() -> None:
            nonlocal n
            if not n:
                return
            evs = ffi.from_buffer("struct ct_event[]", buf)
            got = pack(evs, n, ths, state, nthreads, self.pos, out, cap)
            if got == 2**64 - 1:
                raise ValueError("packing the blocks failed (thread number out of range?)")
            self._put(ffi.buffer(out, got)[:])
            self.pos += got
            self.events += n
            n = 0

        for th, fields in it:
            pack_into(buf, n * es.size, *fields)
            ths[n] = th
            n += 1
            if n == batch:
                flush()
        flush()

    # ---- convenience ----
    def alloc(
        self,
        ts: int,
        size: int,
        addr: int,
        api: str = "cuMemAlloc_v2",
        rt: str | None = "cudaMalloc",
        device: int = 0,
        stack: int = 0,
        result: int = 0,
        **kw: Any,
    ) -> None:
        self.event(
            ts,
            api,
            size=size,
            addr=addr if result == 0 else 0,
            device=device,
            stack=stack,
            result=result,
            rt=rt,
            **kw,
        )

    def free(
        self,
        ts: int,
        addr: int,
        api: str = "cuMemFree_v2",
        rt: str | None = "cudaFree",
        device: int = 0,
        stack: int = 0,
        result: int = 0,
        size: int = 0,
        **kw: Any,
    ) -> None:
        self.event(
            ts, api, size=size, addr=addr, device=device, stack=stack, result=result, rt=rt, **kw
        )

    def meminfo(
        self,
        ts: int,
        free: int,
        total: int,
        real_free: int | None = None,
        real_total: int | None = None,
        virtualized: bool = False,
        api: str = "cuMemGetInfo_v2",
        rt: str | None = "cudaMemGetInfo",
        device: int = 0,
        stack: int = 0,
    ) -> None:
        self.event(
            ts,
            api,
            size=total,
            addr=free,
            aux=free if real_free is None else real_free,
            aux2=total if real_total is None else real_total,
            device=device,
            stack=stack,
            rt=rt,
            flags=self.K["CT_EF_VIRTUALIZED"] if virtualized else 0,
        )

    def deny(
        self,
        ts: int,
        size: int,
        limit: int,
        in_use: int,
        api: str = "cuMemAlloc_v2",
        rt: str | None = "cudaMalloc",
        device: int = 0,
        stack: int = 0,
    ) -> None:
        """A budget refusal, as ct_pre emits it (result CUDA_ERROR_OUT_OF_MEMORY = 2)."""
        self.event(
            ts,
            api,
            size=size,
            addr=0,
            aux=limit,
            aux2=in_use,
            device=device,
            stack=stack,
            result=2,
            rt=rt,
            op=self.K["CT_OP_DENY"],
        )

    def close(
        self,
        exit_code: int = 0,
        clean: bool = True,
        dropped: int = 0,
        end_ts: int | None = None,
        zero_tail: bool = True,
    ) -> Path:
        """clean=False leaves no END record: the file reads as truncated (killed)."""
        if clean:
            s = layout("struct ct_rec_end")[0]
            self._record(
                self.K["CT_REC_END"],
                s.pack(end_ts or self.start_ns, exit_code, dropped, len(self.nodes), self.events),
            )
        if zero_tail and self.pos % self.chunk:
            self._put(bytes(self.chunk - self.pos % self.chunk))
        self.f.write(self.buf)
        self.buf = bytearray()
        self.f.close()
        return self.path


def rewrite_as_blocks(
    src: str | Path, dst: str | Path, threads: Callable[[list[tuple[int, ...]]], list[int]]
) -> list[tuple[int, int]]:
    """The trace file src written again to dst as the shim of format version 3 would: its
    records in order, but its EVENT records as event blocks (the END record, if any, last).
    threads(events) gives each event's thread number (bit 31 set: a new thread takes it).
    Returns where each block record lies in dst: (offset, size)."""
    K = C()
    hdr = layout("struct ct_rec_hdr")[0]
    es = layout("struct ct_event")[0]
    chunk = K["CT_CHUNK_SIZE"]
    data = Path(src).read_bytes()
    out = bytearray(data[: K["CT_HEADER_SIZE"]])
    events: list[tuple] = []
    end = None

    def put(rec: bytes) -> None:
        rest = chunk - len(out) % chunk
        if len(rec) > rest:
            out.extend(hdr.pack(K["CT_REC_MAGIC"], K["CT_REC_PAD"], rest) + bytes(rest - 8))
        out.extend(rec)

    off = K["CT_HEADER_SIZE"]
    while off + 8 <= len(data):
        magic, rtype, size = hdr.unpack_from(data, off)
        if magic != K["CT_REC_MAGIC"] or size < 8:
            off = (off // chunk + 1) * chunk  # zeros to the end of the chunk
            continue
        rec = data[off : off + size]
        if rtype == K["CT_REC_EVENT"]:
            events.append(es.unpack_from(rec, 8))
        elif rtype == K["CT_REC_END"]:
            end = rec
        elif rtype != K["CT_REC_PAD"]:
            put(rec)
        off += size
    ths = list(threads(events))
    n = len(events)
    nthreads = max([t & 0x7FFFFFFF for t in ths], default=0) + 1
    ffi, lib = native.tools()
    raw = bytearray(es.size * max(n, 1))
    for k, e in enumerate(events):
        es.pack_into(raw, k * es.size, *e)
    state = ffi.new("uint8_t[]", max(lib.ct_ceblock_state_size(nthreads), 1))
    cap = n * 160 + (4 << 20)
    buf = ffi.new("uint8_t[]", cap)
    start = len(out)
    got = lib.ct_ceblock_pack(
        ffi.from_buffer("struct ct_event[]", raw),
        n,
        ffi.new("uint32_t[]", ths or [0]),
        state,
        nthreads,
        start,
        buf,
        cap,
    )
    assert got != 2**64 - 1
    blob = ffi.buffer(buf, got)[:]
    out.extend(blob)
    blocks = []
    p = 0
    while p < len(blob):
        _m, rtype, size = hdr.unpack_from(blob, p)
        if rtype == K["CT_REC_CEBLOCK"]:
            blocks.append((start + p, size))
        p += size
    if end is not None:
        put(end)
    Path(dst).write_bytes(bytes(out))
    return blocks


def write_run(
    d: str | Path,
    argv: list[str] | None = None,
    samples: list[dict[str, Any]] | None = None,
    nvml: bool = True,
    nvml_why: str = "",
    start_ns: int = BASE_TS - 50 * MS,
    budget: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """run.json (as the launcher writes it) and samples.jsonl."""
    d = Path(d)
    run = {
        "cudatrace_version": __version__,
        "argv": argv or ["app"],
        "executable": "/usr/bin/app",
        "cwd": "/tmp",
        "dir": str(d),
        "stack_depth": settings.default_int("STACK_DEPTH"),
        "budget": budget,
        "group": None,
        "on_exceed": "fail",
        "start_monotonic_ns": start_ns,
        "start_time": 1_700_000_000.0,
        "returncode": 0,
        "exit_status": 0,
        "end_monotonic_ns": start_ns + 10 * SEC,
        "end_time": 1_700_000_010.0,
        "budget_aborted": False,
        "sampler": {
            "samples": len(samples or []),
            "nvml": nvml,
            "nvml_why": nvml_why,
            "driver": "550.54" if nvml else None,
        },
    }
    run.update(extra or {})
    (d / "run.json").write_text(json.dumps(run, indent=2))
    if samples is not None:
        with open(d / "samples.jsonl", "w") as f:
            for s in samples:
                f.write(json.dumps(s) + "\n")


def sample(
    t: int,
    tree: dict[int, int] | None = None,
    used: Any = None,
    total: int = 80 << 30,
    mem_available: int = 64 << 30,
    rss: int = 1 << 30,
    pids: Sequence[int] = (1000,),
) -> dict[str, Any]:
    """One samples.jsonl line; tree None: no NVML (a Jetson)."""
    s = {"t": t, "pids": list(pids), "mem_available": mem_available, "tree_rss": rss}
    if tree is not None:
        used = used if isinstance(used, (list, tuple)) else [used if used is not None else 0]
        s["devices"] = [
            {"index": i, "total": total, "free": total - u, "used": u} for i, u in enumerate(used)
        ]
        s["tree_device_bytes"] = {str(k): v for k, v in tree.items()}
    return s


def fields() -> tuple[str, ...]:
    return event_fields()


def cut(path: str | Path, nbytes: int) -> None:
    """Keep only the first nbytes of a file (a process killed mid-way, a copy cut short)."""
    with open(path, "r+b") as f:
        f.truncate(nbytes)


def size_of(path: str | Path) -> int:
    return os.path.getsize(path)


# ---- a real ELF for symbolized frames, and a ready-made run ------------------------------

FIXTURE_C = r"""
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) void *load_weights(size_t n) { void *p = malloc(n); return p; }
__attribute__((noinline)) void *alloc_activations(size_t n) { void *p = malloc(n); return p; }
__attribute__((noinline)) void *make_workspace(size_t n) { void *p = malloc(n); return p; }
__attribute__((noinline)) void *grow_cache(size_t n) { void *p = malloc(n); return p; }
__attribute__((noinline)) void *query_memory(size_t n) { void *p = malloc(n); return p; }
__attribute__((noinline)) void forward(int i) { free(alloc_activations((size_t)i)); }
__attribute__((noinline)) void train_step(int i) { forward(i); free(make_workspace((size_t)i)); }
__attribute__((noinline)) void setup(void) { free(load_weights(1)); free(grow_cache(2)); }
int main(int argc, char **argv) { setup(); for (int i = 0; i < argc; i++) train_step(i);
  free(query_memory(3)); return 0; }
"""


def build_fixture_elf(
    directory: str | Path, name: str = "trainer", source: str = FIXTURE_C
) -> Path:
    """Compile a small non-PIE program with DWARF (gcc -g); its functions stand for call sites."""
    import subprocess

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    src = d / (name + ".c")
    out = d / name
    src.write_text(source)
    subprocess.run(
        ["gcc", "-g", "-O0", "-no-pie", "-fno-omit-frame-pointer", "-o", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    return out


def elf_symbols(path: str | Path) -> dict[str, int]:
    """function name -> address (st_value) of an ELF's .symtab."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    out = {}
    with open(path, "rb") as f:
        e = ELFFile(f)
        st = e.get_section_by_name(".symtab")
        assert isinstance(st, SymbolTableSection), f"{path} has no .symtab"
        for s in st.iter_symbols():
            if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]:
                out[s.name] = s["st_value"]
    return out


def elf_range(path: str | Path) -> tuple[int, int]:
    """(lowest, one past highest) vaddr of an ELF's PT_LOAD segments."""
    from elftools.elf.elffile import ELFFile

    lo, hi = None, 0
    with open(path, "rb") as f:
        for seg in ELFFile(f).iter_segments():
            if seg["p_type"] == "PT_LOAD":
                a = seg["p_vaddr"]
                lo = a if lo is None else min(lo, a)
                hi = max(hi, a + seg["p_memsz"])
    return lo or 0, hi


class Frames:
    """Return addresses for a stack made of an ELF's functions plus CUDA library frames.

    A return address points just after a call, inside the caller: function start + 8 here."""

    CUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    CUDART = "/usr/local/cuda/lib64/libcudart.so.12"
    SHIM = "/opt/cudatrace/_native/libcudatrace.so"
    CUDA_BASE, CUDART_BASE, SHIM_BASE = 0x7F1000000000, 0x7F2000000000, 0x7F3000000000

    def __init__(
        self, elf: str | Path | None = None, symbols: dict[str, int] | None = None, base: int = 0
    ):
        self.elf = str(elf) if elf else "/usr/bin/app"
        self.syms = symbols if symbols is not None else (elf_symbols(elf) if elf else {})
        self.base = base
        self.fake: dict[str, int] = {}

    def ip(self, function: str) -> int:
        if function in self.syms:
            return self.syms[function] + self.base + 8
        # a made-up function of an unsymbolizable app: stable addresses per name
        if function not in self.fake:
            self.fake[function] = 0x401000 + 0x100 * len(self.fake)
        return self.fake[function] + self.base + 8

    def stack(self, *functions: str, cuda: bool = True) -> list[int]:
        """innermost first: the shim, libcuda, libcudart, then the given functions"""
        ips = (
            [self.SHIM_BASE + 0x1234, self.CUDA_BASE + 0x5678, self.CUDART_BASE + 0x9ABC]
            if cuda
            else []
        )
        return ips + [self.ip(f) for f in functions]

    def write_modules(self, w: TraceWriter) -> None:
        if self.syms and Path(self.elf).exists():
            lo, hi = elf_range(self.elf)
            w.module(self.elf, lo + self.base, hi + self.base, base=self.base)
        else:
            w.module(self.elf, 0x400000, 0x800000, base=0)
        w.module(self.SHIM, self.SHIM_BASE, self.SHIM_BASE + 0x100000)
        w.module(self.CUDA, self.CUDA_BASE, self.CUDA_BASE + 0x2000000)
        w.module(self.CUDART, self.CUDART_BASE, self.CUDART_BASE + 0x1000000)


MiB = 1 << 20
GiB = 1 << 30


def write_scenario(
    d: Path,
    elf: str | Path | None = None,
    truncate_child: bool = True,
    nvml: bool = True,
    budget: int | None = 6 * GiB,
    frames: Frames | None = None,
) -> dict:
    """A two-process run on two devices with everything a report shows; returns the figures a
    test can check (computed by hand from the events below).

    parent pid 1000 (device 0): weights 4 x 1 GiB at 0.1..0.4 s, never freed; activations
      8 x 256 MiB at 1.0..1.7 s, freed at 2.0..2.7 s; a 16 GiB allocation that fails (OOM) at
      1.8 s; a budget denial of 2 GiB at 1.9 s; cuMemGetInfo (virtualized) at 0.05 s;
      pinned host 512 MiB at 0.5 s, freed at 3.0 s.
    child pid 1001 (device 1): workspace 2 x 512 MiB at 1.5 s and 1.6 s, freed at 2.9 s; no END
      record when truncate_child (killed).
    peak (device 0 + 1): at 1.7 s: 4 GiB + 2 GiB + 1 GiB = 7 GiB.
    frames: where the stacks' functions and CUDA libraries lie (default Frames(elf)).
    """
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    fr = frames or Frames(elf)
    t0 = BASE_TS
    info: dict[str, object] = {"ledger": "/dev/shm/cudatrace-0/x.ledger", "on_exceed": "fail"}
    if budget:
        info["budget.0"] = budget
    w = TraceWriter(
        d / "1000.0.ctrace",
        pid=1000,
        ppid=999,
        exe="/usr/bin/python3",
        argv=["python3", "train.py"],
        start_ns=t0,
        info=info,
    )
    fr.write_modules(w)
    s_weights = w.stack(fr.stack("load_weights", "setup", "main"))
    s_act = w.stack(fr.stack("alloc_activations", "forward", "train_step", "main"))
    s_cache = w.stack(fr.stack("grow_cache", "setup", "main"))
    s_query = w.stack(fr.stack("query_memory", "main"))
    w.meminfo(
        t0 + 50 * MS,
        free=6 * GiB,
        total=6 * GiB,
        real_free=79 * GiB,
        real_total=80 * GiB,
        virtualized=True,
        stack=s_query,
    )
    for i in range(4):
        w.alloc(t0 + (100 + 100 * i) * MS, GiB, 0x7E0000000000 + i * GiB, stack=s_weights)
    w.alloc(
        t0 + 500 * MS,
        512 * MiB,
        0x600000000,
        api="cuMemHostAlloc",
        rt="cudaHostAlloc",
        stack=s_cache,
    )
    for i in range(8):
        w.alloc(t0 + (1000 + 100 * i) * MS, 256 * MiB, 0x7D0000000000 + i * 256 * MiB, stack=s_act)
    w.alloc(t0 + 1800 * MS, 16 * GiB, 0, stack=s_cache, result=2)
    w.deny(t0 + 1900 * MS, 2 * GiB, limit=budget or 6 * GiB, in_use=6 * GiB, stack=s_cache)
    for i in range(8):
        w.free(t0 + (2000 + 100 * i) * MS, 0x7D0000000000 + i * 256 * MiB)
    w.free(t0 + 3000 * MS, 0x600000000, api="cuMemFreeHost", rt="cudaFreeHost")
    w.close(end_ts=t0 + 3200 * MS)

    c = TraceWriter(
        d / "1001.0.ctrace",
        pid=1001,
        ppid=1000,
        exe="/usr/bin/python3",
        argv=["python3", "-c", "worker"],
        start_ns=t0 + 1200 * MS,
        info=info,
    )
    fr.write_modules(c)
    s_ws = c.stack(fr.stack("make_workspace", "train_step", "main"))
    c.alloc(t0 + 1500 * MS, 512 * MiB, 0x7C0000000000, device=1, stack=s_ws)
    c.alloc(t0 + 1600 * MS, 512 * MiB, 0x7C0000000000 + 512 * MiB, device=1, stack=s_ws)
    c.free(t0 + 2900 * MS, 0x7C0000000000, device=1)
    c.free(t0 + 2900 * MS, 0x7C0000000000 + 512 * MiB, device=1)
    c.close(clean=not truncate_child, end_ts=t0 + 3100 * MS)

    # samples: NVML sees traced + 300 MiB of context per process, every 100 ms
    samples = []
    m = build_live_curve(d)
    for k in range(0, 34):
        t = t0 - 50 * MS + k * 100 * MS
        live0, live1 = m(t, 0), m(t, 1)
        ctx0 = 300 * MiB if t >= t0 else 0
        ctx1 = 300 * MiB if t >= t0 + 1200 * MS else 0
        if nvml:
            samples.append(
                sample(
                    t,
                    tree={0: live0 + ctx0, 1: live1 + ctx1},
                    used=[live0 + ctx0 + GiB, live1 + ctx1 + 200 * MiB],
                    mem_available=60 * GiB - live0 - live1,
                    rss=2 * GiB,
                    pids=(1000, 1001),
                )
            )
        else:
            samples.append(
                sample(
                    t,
                    tree=None,
                    mem_available=60 * GiB - live0 - live1 - ctx0,
                    rss=2 * GiB + live0 + live1,
                    pids=(1000, 1001),
                )
            )
    write_run(
        d,
        argv=["python3", "train.py"],
        samples=samples,
        nvml=nvml,
        nvml_why="" if nvml else "no NVIDIA driver here (libnvidia-ml.so.1 not found)",
        budget={"spec": "6GiB", "limits": {"0": budget}} if budget else None,
        start_ns=t0 - 50 * MS,
    )
    return {
        "peak_bytes": 7 * GiB,
        "peak_ts": t0 + 1700 * MS,
        "start_ns": t0 - 50 * MS,
        "end_bytes": 4 * GiB,
        "device_peaks": {0: (6 * GiB, t0 + 1700 * MS), 1: (GiB, t0 + 1600 * MS)},
    }


def build_live_curve(d: Path) -> Callable[[int, int | None], int]:
    """live(ts, device) of a directory, through the model (for samples that follow it)."""
    from cudatrace.analyze.read.rundir import read_dir
    from cudatrace.analyze.replay.model import build

    m = build(read_dir(d))
    return lambda ts, dev: m.live_bytes_at(ts, dev)[0]


FakeFrame = namedtuple("FakeFrame", "module function file line address offset inlined")


class FakeSymbolizer:
    """Resolves addresses of one ELF by its symbol table (nearest symbol at or below), with a
    made-up file and line: stands in for cudatrace.symbols in tests."""

    def __init__(self, elf: Path | str, symbols: dict[str, int]):
        self.elf = str(elf)
        self.items = sorted((a, n) for n, a in symbols.items())
        self.addrs = [a for a, _ in self.items]
        self.asked: list[Any] = []

    def symbolize(self, ref: Any, addresses: Iterable[int]) -> dict[int, list[FakeFrame]]:
        self.asked.append(ref)
        out: dict[int, list[FakeFrame]] = {}
        if ref.path != self.elf:
            return out
        for addr in addresses:
            vaddr = addr - ref.bias
            i = bisect.bisect_right(self.addrs, vaddr) - 1
            if i >= 0 and vaddr - self.addrs[i] < 0x200:
                name = self.items[i][1]
                out[addr] = [
                    FakeFrame(ref.path, name, "/src/trainer.c", 100 + i, addr, vaddr, False)
                ]
        return out

    def warnings(self) -> list[str]:
        return []
