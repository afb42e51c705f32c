"""Reading trace files (format: shim/layout.h, read through cffi, so the layout lives in one place).

A trace directory holds one file per traced process image, `<pid>.<n>.ctrace`, plus the
launcher's `run.json` and `samples.jsonl`. `read_trace` reads one file as far as it goes and says
whether it ended cleanly; `read_dir` reads them all.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .. import native
from ..symbols import python as pyframes

_TYPE_FMT = {"uint8_t": "B", "uint16_t": "H", "uint32_t": "I", "uint64_t": "Q",
             "int8_t": "b", "int16_t": "h", "int32_t": "i", "int64_t": "q"}


class TraceError(Exception):
    """A file that is not a cudatrace trace, or one this version cannot read."""


def _struct_of(ctype: str) -> tuple[struct.Struct, tuple[str, ...]]:
    """A struct.Struct and field names for a cffi struct type: derived, never written by hand."""
    ffi = native.ffi()
    t = ffi.typeof(ctype)
    fmt, names, pos = "<", [], 0
    for name, f in t.fields:
        if f.offset > pos:
            fmt += "%dx" % (f.offset - pos)
        if f.type.kind == "array":
            fmt += "%ds" % ffi.sizeof(f.type)
            pos = f.offset + ffi.sizeof(f.type)
        else:
            fmt += _TYPE_FMT[f.type.cname]
            pos = f.offset + ffi.sizeof(f.type)
        names.append(name)
    if ffi.sizeof(t) > pos:
        fmt += "%dx" % (ffi.sizeof(t) - pos)
    s = struct.Struct(fmt)
    assert s.size == ffi.sizeof(t), ctype
    return s, tuple(names)


_cache: dict[str, tuple[struct.Struct, tuple[str, ...]]] = {}


def layout(ctype: str) -> tuple[struct.Struct, tuple[str, ...]]:
    if ctype not in _cache:
        _cache[ctype] = _struct_of(ctype)
    return _cache[ctype]


def C() -> dict[str, int]:
    """The integer constants of layout.h (CT_OP_ALLOC, ...)."""
    if "consts" not in _cache:
        _cache["consts"] = native.constants()  # type: ignore[assignment]
    return _cache["consts"]  # type: ignore[return-value]


@dataclass
class Api:
    id: int
    name: str
    layer: int
    op: int
    kind: int
    space: int


@dataclass
class Module:
    path: str
    base: int
    start: int
    end: int
    build_id: bytes | None
    ts_ns: int


@dataclass
class End:
    ts_ns: int
    exit_code: int
    dropped: int
    events: int


@dataclass
class Trace:
    path: Path
    pid: int
    ppid: int
    exec_index: int
    stack_depth: int
    start_monotonic_ns: int
    start_realtime_ns: int
    start_ticks: int
    arch: str
    shim_version: str
    # how the shim took each event's stack (header counters, current even after a kill)
    stack_unwinds_full: int = 0
    stack_cache_hits: int = 0
    stack_verified: int = 0
    stack_mismatches: int = 0
    exe: str = ""
    host: str = ""
    cwd: str = ""
    argv: list[str] = field(default_factory=list)
    apis: dict[int, Api] = field(default_factory=dict)
    modules: list[Module] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)
    parents: list[int] = field(default_factory=lambda: [0])   # node id -> parent id
    ips: list[int] = field(default_factory=lambda: [0])       # node id -> return address
    # The scanner's `struct ct_event[]` (cffi), kept as is: the model replays it in C
    # (shim/replay.c); `events` unpacks it into tuples only when something asks for them.
    py: pyframes.PyTables | None = None                       # Python code and stacks, if any
    raw_events: object = field(default=None, repr=False)
    n_events: int = 0
    _events: list | None = field(default=None, repr=False)
    end: End | None = None
    status: str = "truncated"      # "complete" | "truncated"
    gaps: int = 0
    bad_events: int = 0            # compact events that could not be decoded (file damaged)
    threads: int = 0               # compact events: thread numbers in use (contexts kept)
    aggregate: object = field(default=None, repr=False)   # --aggregate: aggregate.Snapshot
    snap_slots: list = field(default_factory=list, repr=False)  # SNAPSLOT records, as bytes
    size_bytes: int = 0

    @property
    def events(self) -> list[tuple]:
        """Events as tuples in event_fields() order (unpacked from raw_events on first use)."""
        if self._events is None:
            if self.raw_events is not None and self.n_events:
                es, _ = layout("struct ct_event")
                ffi = native.ffi()
                self._events = list(es.iter_unpack(ffi.buffer(self.raw_events, es.size * self.n_events)))
            else:
                self._events = []
        return self._events

    @events.setter
    def events(self, value) -> None:
        self._events = list(value)
        self.raw_events = None
        self.n_events = len(self._events)

    @property
    def complete(self) -> bool:
        """Readable to its end: a clean exit, or an image replaced by exec (no exit record, but
        nothing was cut short)."""
        return self.status in ("complete", "exec")

    def stack(self, leaf: int) -> list[int]:
        """Return addresses of a stack, innermost first (native frames only: a Python link node
        at the leaf is skipped, see py_link)."""
        out = []
        guard = 0
        if leaf and leaf < len(self.ips) and pyframes.is_link(self.ips[leaf]):
            leaf = self.parents[leaf]
        while leaf and leaf < len(self.ips) and guard < 4096:
            out.append(self.ips[leaf])
            leaf = self.parents[leaf]
            guard += 1
        return out

    def py_link(self, leaf: int) -> tuple[int, int] | None:
        """(kind, value) of the Python link node ending this stack (pyframes.LINK_FRAMES, Python
        leaf; or LINK_WHY, reason), None when the event has none (no Python in the process)."""
        if leaf and leaf < len(self.ips) and pyframes.is_link(self.ips[leaf]):
            return pyframes.link_parts(self.ips[leaf])
        return None

    def py_stack(self, leaf: int) -> list:
        """The Python frames of a stack (pyframes.PyFrame), innermost first."""
        link = self.py_link(leaf)
        if not link or link[0] != pyframes.LINK_FRAMES or self.py is None:
            return []
        return self.py.stack(link[1])

    def api_name(self, api_id: int) -> str:
        a = self.apis.get(api_id)
        return a.name if a else "api#%d" % api_id

    def module_for(self, ip: int) -> Module | None:
        best = None
        for m in self.modules:
            if m.start <= ip < m.end:
                best = m          # later records win (a library loaded at a reused address)
        return best

    def describe(self) -> str:
        state = {"complete": "complete", "exec": "replaced by exec (complete up to it)"}.get(
            self.status, "truncated (no clean exit record: killed, crashed or still running)")
        return "%s: pid %d, %d events, %s" % (self.path.name, self.pid, self.n_events, state)


def event_fields() -> tuple[str, ...]:
    return layout("struct ct_event")[1]


def read_trace(path: str | os.PathLike) -> Trace:
    """Read one trace file as far as it goes. Raises TraceError if it is not a trace at all."""
    path = Path(path)
    ffi, lib = native.tools()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise TraceError("%s is empty (the process was killed before writing anything)" % path)
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(path, data, size, ffi, lib)
    finally:
        data.close()


def _parse(path: Path, data, size: int, ffi, lib) -> Trace:
    hs, hn = layout("struct ct_file_header")
    if size < hs.size:
        raise TraceError("%s is too short to be a cudatrace trace (%d bytes)" % (path, size))
    h = dict(zip(hn, hs.unpack_from(data, 0)))
    if h["magic"] != b"CUDATRC\0":
        raise TraceError("%s is not a cudatrace trace (bad magic)" % path)
    if not C()["CT_FORMAT_VERSION_MIN"] <= h["version"] <= C()["CT_FORMAT_VERSION"]:
        raise TraceError("%s has trace format version %d; this cudatrace reads versions %d to %d"
                         % (path, h["version"], C()["CT_FORMAT_VERSION_MIN"],
                            C()["CT_FORMAT_VERSION"]))
    buf = ffi.from_buffer(data)
    res = ffi.new("struct ct_scan_result *")
    lib.ct_scan(buf, size, ffi.NULL, 0, ffi.NULL, 0, res)
    n_ev, n_ot = res.n_events, res.n_other
    evs = ffi.new("struct ct_event[]", max(n_ev, 1))
    others = ffi.new("uint64_t[]", max(n_ot, 1))
    lib.ct_scan(buf, size, evs, n_ev, others, n_ot, res)
    t = Trace(path=path, pid=h["pid"], ppid=h["ppid"], exec_index=h["exec_index"],
              stack_depth=h["stack_depth"], start_monotonic_ns=h["start_monotonic_ns"],
              start_realtime_ns=h["start_realtime_ns"], start_ticks=h["process_start_ticks"],
              arch=h["arch"].rstrip(b"\0").decode(), shim_version=h["shim_version"].rstrip(b"\0").decode(),
              size_bytes=size, stack_unwinds_full=h.get("stack_unwinds_full", 0),
              stack_cache_hits=h.get("stack_cache_hits", 0), stack_verified=h.get("stack_verified", 0),
              stack_mismatches=h.get("stack_mismatches", 0))
    t.gaps = res.gaps
    t.bad_events = res.bad_events
    t.threads = res.threads
    t.status = "complete" if res.status == C()["CT_SCAN_CLEAN"] else "truncated"
    t.raw_events = evs
    t.n_events = n_ev
    _decode_others(t, data, [others[i] for i in range(n_ot)])
    return t


def _decode_others(t: Trace, data, offsets: list[int]) -> None:
    K = C()
    hdr, _ = layout("struct ct_rec_hdr")
    ps, _ = layout("struct ct_rec_process")
    api_s, _ = layout("struct ct_rec_api")
    mod_s, _ = layout("struct ct_rec_module")
    stk_s, _ = layout("struct ct_rec_stack")
    inf_s, _ = layout("struct ct_rec_info")
    end_s, _ = layout("struct ct_rec_end")
    pyc_s, _ = layout("struct ct_rec_pycode")
    pyf_s, _ = layout("struct ct_rec_pyframe")
    parents, ips = t.parents, t.ips
    for off in offsets:
        _magic, rtype, rsize = hdr.unpack_from(data, off)
        body = off + hdr.size
        if rtype == K["CT_REC_STACK"]:
            nid, parent, ip = stk_s.unpack_from(data, body)
            if nid == len(ips):
                parents.append(parent)
                ips.append(ip)
            else:                            # out of order (never written so, but be safe)
                while len(ips) <= nid:
                    parents.append(0)
                    ips.append(0)
                parents[nid], ips[nid] = parent, ip
        elif rtype == K["CT_REC_MODULE"]:
            ts, base, start, end, blen, plen = mod_s.unpack_from(data, body)
            p = body + mod_s.size
            bid = bytes(data[p:p + blen]) if blen else None
            path = bytes(data[p + blen:p + blen + plen]).decode(errors="replace")
            t.modules.append(Module(path, base, start, end, bid, ts))
        elif rtype == K["CT_REC_API"]:
            aid, layer, op, kind, space, nlen = api_s.unpack_from(data, body)
            name = bytes(data[body + api_s.size: body + api_s.size + nlen]).decode(errors="replace")
            t.apis[aid] = Api(aid, name, layer, op, kind, space)
        elif rtype == K["CT_REC_PROCESS"]:
            _pid, _ppid, nstr, argc = ps.unpack_from(data, body)
            raw = bytes(data[body + ps.size: off + rsize])
            parts = raw.split(b"\0")
            strs = [x.decode(errors="replace") for x in parts[:nstr]]
            strs += [""] * (nstr - len(strs))
            t.exe, t.host, t.cwd = strs[0], strs[1], strs[2]
            t.argv = strs[3:3 + argc]
        elif rtype == K["CT_REC_INFO"]:
            klen, vlen, _ = inf_s.unpack_from(data, body)
            p = body + inf_s.size
            key = bytes(data[p:p + klen]).decode(errors="replace")
            val = bytes(data[p + klen + 1:p + klen + 1 + vlen]).decode(errors="replace")
            t.info[key] = val
        elif rtype == K["CT_REC_PYFRAME"]:
            if t.py is None:
                t.py = pyframes.PyTables()
            nid, parent, code, lasti, flags, _ = pyf_s.unpack_from(data, body)
            t.py.add_node(nid, parent, code, lasti, flags)
        elif rtype == K["CT_REC_PYCODE"]:
            if t.py is None:
                t.py = pyframes.PyTables()
            addr, start, cid, first, units, ltlen, flen, qlen, _ = pyc_s.unpack_from(data, body)
            p = body + pyc_s.size
            fname = bytes(data[p:p + flen]).decode(errors="replace")
            qname = bytes(data[p + flen + 1:p + flen + 1 + qlen]).decode(errors="replace")
            p += flen + qlen + 2
            t.py.add_code(pyframes.PyCode(cid, addr, fname, qname, first, units,
                                          bytes(data[p:p + ltlen])))
        elif rtype == K["CT_REC_SNAPSLOT"]:      # --aggregate (analyze/aggregate.py reads it)
            t.snap_slots.append(bytes(data[off:off + rsize]))
        elif rtype == K["CT_REC_END"]:
            ts, code, dropped, _nodes, events = end_s.unpack_from(data, body)
            t.end = End(ts, code, dropped, events)


@dataclass
class TraceDir:
    path: Path
    traces: list[Trace]
    run: dict
    errors: list[str]

    def samples(self) -> list[dict]:
        p = self.path / "samples.jsonl"
        out = []
        if p.exists():
            for line in p.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass                      # a sample cut by a crash: skip it
        return out


def trace_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.ctrace"), key=lambda p: tuple(int(x) for x in p.name.split(".")[:2]
                                                          if x.isdigit()) or (0,))


def read_dir(path: str | os.PathLike) -> TraceDir:
    """Read a trace directory (or a single .ctrace file). Unreadable files are reported in errors."""
    path = Path(path)
    if path.is_file():
        return TraceDir(path.parent, [read_trace(path)], {}, [])
    if not path.is_dir():
        raise TraceError("%s: no such trace directory or file" % path)
    traces, errors = [], []
    for p in trace_files(path):
        try:
            traces.append(read_trace(p))
        except TraceError as e:
            errors.append(str(e))
    run = {}
    rp = path / "run.json"
    if rp.exists():
        try:
            run = json.loads(rp.read_text())
        except ValueError as e:
            errors.append("run.json unreadable: %s" % e)
    if not traces and not errors:
        raise TraceError("%s holds no trace files (*.ctrace)" % path)
    # An image that called exec after using CUDA writes no exit record; when the new image of the
    # same pid wrote a file too, the earlier one ended by exec, not by a kill.
    later = {}
    for t in traces:
        later[t.pid] = max(later.get(t.pid, -1), t.exec_index)
    for t in traces:
        if t.status == "truncated" and t.exec_index < later[t.pid]:
            t.status = "exec"
    return TraceDir(path, traces, run, errors)


def iter_events(t: Trace) -> Iterator[dict]:
    """Events as dicts (for tests and small traces)."""
    names = event_fields()
    for e in t.events:
        yield dict(zip(names, e))
