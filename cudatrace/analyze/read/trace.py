"""Reading trace files (format: native/include/trace_format.h, read through cffi, so the layout lives in one place).

A trace directory holds one file per traced process image, `<pid>.<n>.ctrace`, plus the
launcher's `run.json` and `samples.jsonl`. `read_trace` reads one file as far as it goes and says
whether it ended cleanly; `read_dir` reads them all; `read_dirs` reads several directories (one
per host or launch, or a folder of them: `run_dirs`) as one run (docs/ranks.md).
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import native, tracedir
from ...errors import CudatraceError
from ...native_types import CData, ToolsLib
from ...symbols import python as pyframes
from ...units import lossless_data, shell_quote
from . import unseal

_TYPE_FMT = {
    "uint8_t": "B",
    "uint16_t": "H",
    "uint32_t": "I",
    "uint64_t": "Q",
    "int8_t": "b",
    "int16_t": "h",
    "int32_t": "i",
    "int64_t": "q",
}


class TraceError(CudatraceError):
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


class Source:
    """A trace file's bytes (a private read-only mapping, or the copy with sealed chunks put
    back) and its scan's index of event blocks (scan.h: struct ct_scan_index): what the C
    replay decodes the events from, without holding them."""

    __slots__ = ("buf", "size", "index", "droppable", "_keep")

    def __init__(
        self, buf: CData, size: int, index: CData, droppable: bool, keep: object = None
    ) -> None:
        self.buf = buf  # uint8_t * (cffi)
        self.size = size
        self.index = index  # struct ct_scan_index * (cffi, freed with it)
        self.droppable = droppable  # a file mapping: pages read may be dropped
        self._keep = keep

    def alloc_devices(self, kinds: set[int]) -> set[int]:
        """The devices of the successful allocations of these kinds (CT_KIND_*), decoded."""
        ffi, lib = native.tools()
        mask = 0
        for k in kinds:
            mask |= 1 << min(k, 63)
        n = lib.ct_scan_alloc_devices(self.buf, self.size, mask, ffi.NULL, 0)
        out = ffi.new("int32_t[]", max(n, 1))
        n = lib.ct_scan_alloc_devices(self.buf, self.size, mask, out, n)
        return set(ffi.unpack(out, n))

    def decode_all(self, n: int) -> CData:
        """Every event, decoded by the scanner into a `struct ct_event[]`."""
        ffi, lib = native.tools()
        evs = ffi.new("struct ct_event[]", max(n, 1))
        res = ffi.new("struct ct_scan_result *")
        lib.ct_scan(self.buf, self.size, evs, n, ffi.NULL, 0, res)
        return evs


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
    exit_seen_ns: int = 0  # when the launcher saw the process exit (run.json "exits"), 0: not
    exe: str = ""
    host: str = ""
    cwd: str = ""
    argv: list[str] = field(default_factory=list)
    apis: dict[int, Api] = field(default_factory=dict)
    modules: list[Module] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)
    parents: list[int] = field(default_factory=lambda: [0])  # node id -> parent id
    ips: list[int] = field(default_factory=lambda: [0])  # node id -> return address
    # A file of event blocks (format version 3) keeps no event: its bytes and the blocks the scan
    # found (Source) let the C replay (native/reader/replay.c) decode them again as it goes.
    # Other files: the scanner's `struct ct_event[]` (cffi), replayed as is. `raw_events` and
    # `events` (tuples) are made only when something asks for them.
    py: pyframes.PyTables | None = None  # Python code and stacks, if any
    _raw: object = field(default=None, repr=False)
    source_blocks: Source | None = field(default=None, repr=False)
    n_events: int = 0
    _events: list[tuple[Any, ...]] | None = field(default=None, repr=False)
    end: End | None = None
    status: str = "truncated"  # "complete" | "truncated"
    gaps: int = 0
    bad_events: int = 0  # compact events that could not be decoded (file damaged)
    threads: int = 0  # compact events: thread numbers in use (contexts kept)
    aggregate: object = field(default=None, repr=False)  # --aggregate: aggregate.Snapshot
    snap_slots: list[bytes] = field(default_factory=list, repr=False)  # SNAPSLOT records, as bytes
    size_bytes: int = 0
    stopped_ns: int = 0  # the shim stopped writing then (a full disk): later events lost
    stopped_errno: int = 0
    stopped_exit: int = -1  # exit status noted after stopping, -1: unknown
    source: str = ""  # the trace directory it was read from (a run of several: read_dirs)
    # sealed chunks neither the trace nor its sidecar holds (damaged, deleted): their events
    # are lost, and every report says so (unseal.py)
    lost_chunks: list[int] = field(default_factory=list)
    chunk_size: int = 0
    notes: list[str] = field(default_factory=list)  # what reading it met (sidecar damage)
    clock_shift_ns: int = 0  # added to its times to put several hosts on one clock (read_dirs)

    @property
    def stopped_why(self) -> str:
        """Why the shim stopped writing ('' if it never did)."""
        if not self.stopped_ns:
            return ""
        try:
            return os.strerror(self.stopped_errno) if self.stopped_errno else "unknown error"
        except ValueError:
            return "error %d" % self.stopped_errno

    @property
    def raw_events(self) -> CData:
        """The events as a cffi `struct ct_event[]` (decoded from the blocks on first use), or
        None when they were given as tuples."""
        if self._raw is None and self.source_blocks is not None and self._events is None:
            self._raw = self.source_blocks.decode_all(self.n_events)
        return self._raw

    @raw_events.setter
    def raw_events(self, value: CData) -> None:
        self._raw = value

    @property
    def events(self) -> list[tuple[Any, ...]]:
        """Events as tuples in event_fields() order (unpacked from raw_events on first use)."""
        if self._events is None:
            if self.raw_events is not None and self.n_events:
                es, _ = layout("struct ct_event")
                ffi = native.ffi()
                self._events = list(
                    es.iter_unpack(ffi.buffer(self.raw_events, es.size * self.n_events))
                )
            else:
                self._events = []
        return self._events

    @events.setter
    def events(self, value: Iterable[tuple[Any, ...]]) -> None:
        self._events = list(value)
        self._raw = None
        self.source_blocks = None
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

    def py_stack(self, leaf: int) -> list[pyframes.PyFrame]:
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
                best = m  # later records win (a library loaded at a reused address)
        return best

    def describe(self) -> str:
        state = {"complete": "complete", "exec": "replaced by exec (complete up to it)"}.get(
            self.status, "truncated (no clean exit record: killed, crashed or still running)"
        )
        return "%s: pid %d, %d events, %s" % (self.path.name, self.pid, self.n_events, state)


def event_fields() -> tuple[str, ...]:
    return layout("struct ct_event")[1]


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read one trace file as far as it goes. Raises TraceError if it is not a trace at all."""
    path = Path(path)
    ffi, lib = native.tools()
    try:
        # O_NONBLOCK: a FIFO named *.ctrace must not block the reader; it is refused below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TraceError(f"{path}: cannot open: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TraceError(f"{path} is not a regular file")
        size = st.st_size
        if size == 0:
            raise TraceError(f"{path} is empty (the process was killed before writing anything)")
        # mapped in C: no file descriptor stays open (Python's mmap keeps one a mapping);
        # holes never read, sealed chunks put back (unseal.py)
        try:
            view = unseal.open_view(path, fd, size)
        except OSError as e:
            raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    data = ffi.buffer(view.ptr, size)
    try:
        t = _parse(path, data, Source(view.ptr, size, None, True), ffi, lib)
    except (struct.error, ValueError, IndexError, OverflowError, MemoryError) as e:
        # a record that contradicts its own size: the file is corrupt (never a traceback)
        raise TraceError(f"{path} is corrupt: {e}") from None
    if view.suspects and (t.gaps or t.status != "complete"):  # zeros where records should be
        unseal.check_zeros(view, data)
    t.lost_chunks = view.lost
    t.chunk_size = view.chunk_size
    t.notes = view.notes + [x for x in [unseal.loss_note(view, path.name)] if x]
    if t.source_blocks is not None:  # read: out of memory until the replay reads it
        lib.ct_drop_pages(view.ptr, size)
    return t


def _parse(path: Path, data: CData, src: Source, ffi: Any, lib: ToolsLib) -> Trace:
    size = src.size
    hs, hn = layout("struct ct_file_header")
    if size < hs.size:
        raise TraceError("%s is too short to be a cudatrace trace (%d bytes)" % (path, size))
    h = dict(zip(hn, hs.unpack_from(data, 0)))
    if h["magic"] != b"CUDATRC\0":
        raise TraceError(f"{path} is not a cudatrace trace (bad magic)")
    if not C()["CT_FORMAT_VERSION_MIN"] <= h["version"] <= C()["CT_FORMAT_VERSION"]:
        raise TraceError(
            "%s has trace format version %d; this cudatrace reads versions %d to %d"
            % (path, h["version"], C()["CT_FORMAT_VERSION_MIN"], C()["CT_FORMAT_VERSION"])
        )
    ix = lib.ct_scan_index(src.buf, size)
    if ix == ffi.NULL:
        raise MemoryError("scanning the trace ran out of memory")
    ix = ffi.gc(ix, lib.ct_scan_index_free)
    res = ix.res
    n_ev, n_ot = res.n_events, res.n_other
    evs = None
    if ix.streamable:  # decoded again by the replay as it goes, never held
        src.index = ix
    elif n_ev:  # events the replay needs in an array (older formats, a thread out of order)
        evs = src.decode_all(n_ev)
    t = Trace(
        path=path,
        pid=h["pid"],
        ppid=h["ppid"],
        exec_index=h["exec_index"],
        stack_depth=h["stack_depth"],
        start_monotonic_ns=h["start_monotonic_ns"],
        start_realtime_ns=h["start_realtime_ns"],
        start_ticks=h["process_start_ticks"],
        arch=_text(h["arch"]),
        shim_version=_text(h["shim_version"]),
        size_bytes=size,
        stack_unwinds_full=h.get("stack_unwinds_full", 0),
        stack_cache_hits=h.get("stack_cache_hits", 0),
        stack_verified=h.get("stack_verified", 0),
        stack_mismatches=h.get("stack_mismatches", 0),
    )
    t.gaps = res.gaps
    t.bad_events = res.bad_events
    t.threads = res.threads
    t.stopped_ns = h["stopped_ns"]
    if t.stopped_ns:
        t.stopped_errno, t.stopped_exit = h["stopped_errno"], h["stopped_exit"]
    t.status = "complete" if res.status == C()["CT_SCAN_CLEAN"] else "truncated"
    t.raw_events = evs
    t.source_blocks = src if src.index is not None and n_ev else None
    t.n_events = n_ev
    _decode_others(t, data, ffi.unpack(ix.others, n_ot) if n_ot else [])
    return t


def _text(b: bytes) -> str:
    """A fixed-size NUL-padded header field as text (bytes that are not UTF-8 shown as U+FFFD)."""
    return b.split(b"\0", 1)[0].decode(errors="replace")


def _decode_others(t: Trace, data: CData, offsets: list[int]) -> None:
    """Decode the non-event records. Every length and id is checked against the record's own
    size and the number of records, so a corrupt field costs no more than the file's size."""
    K = C()
    nstack = 0
    for off in offsets:
        if struct.unpack_from("<H", data, off + 2)[0] == K["CT_REC_STACK"]:
            nstack += 1
    body_size = {
        K["CT_REC_PROCESS"]: "struct ct_rec_process",
        K["CT_REC_API"]: "struct ct_rec_api",
        K["CT_REC_MODULE"]: "struct ct_rec_module",
        K["CT_REC_STACK"]: "struct ct_rec_stack",
        K["CT_REC_INFO"]: "struct ct_rec_info",
        K["CT_REC_END"]: "struct ct_rec_end",
    }
    names = {
        v: k[len("CT_REC_") :]
        for k, v in K.items()
        if k.startswith("CT_REC_") and k != "CT_REC_MAGIC"
    }
    decoders = {K["CT_REC_" + name]: fn for name, fn in _RECORD_DECODERS.items()}
    hdr, _ = layout("struct ct_rec_hdr")
    stk_s, _ = layout("struct ct_rec_stack")
    rec_stack = K["CT_REC_STACK"]
    parents, ips = t.parents, t.ips
    for off in offsets:
        _magic, rtype, rsize = hdr.unpack_from(data, off)
        body = off + hdr.size
        if rtype in body_size and hdr.size + layout(body_size[rtype])[0].size > rsize:
            raise TraceError(
                "%s is corrupt: a %s record at offset %d is %d bytes, too short for "
                "its body" % (t.path, names.get(rtype, rtype), off, rsize)
            )
        if rtype == rec_stack:  # the many records: decoded here, without a call
            nid, parent, ip = stk_s.unpack_from(data, body)
            if nid == 0 or nid > nstack:
                raise TraceError(
                    "%s is corrupt: STACK node id %d at offset %d, but the file holds "
                    "%d stack records" % (t.path, nid, off, nstack)
                )
            if nid == len(ips):
                parents.append(parent)
                ips.append(ip)
            else:  # out of order (never written so, but be safe)
                while len(ips) <= nid:
                    parents.append(0)
                    ips.append(0)
                parents[nid], ips[nid] = parent, ip
        else:
            fn = decoders.get(rtype)
            if fn is not None:
                fn(t, data, off, body, off + rsize)


def _rec_module(t: Trace, data: CData, off: int, body: int, rec_end: int) -> None:
    mod_s, _ = layout("struct ct_rec_module")
    ts, base, start, end, blen, plen = mod_s.unpack_from(data, body)
    p = body + mod_s.size
    bid = bytes(data[p : min(p + blen, rec_end)]) if blen else None
    path = bytes(data[min(p + blen, rec_end) : min(p + blen + plen, rec_end)]).decode(
        errors="replace"
    )
    t.modules.append(Module(path, base, start, end, bid, ts))


def _rec_api(t: Trace, data: CData, off: int, body: int, rec_end: int) -> None:
    api_s, _ = layout("struct ct_rec_api")
    aid, layer, op, kind, space, nlen = api_s.unpack_from(data, body)
    name = bytes(data[body + api_s.size : min(body + api_s.size + nlen, rec_end)]).decode(
        errors="replace"
    )
    t.apis[aid] = Api(aid, name, layer, op, kind, space)


def _rec_process(t: Trace, data: CData, off: int, body: int, rec_end: int) -> None:
    ps, _ = layout("struct ct_rec_process")
    _pid, _ppid, nstr, argc = ps.unpack_from(data, body)
    raw = bytes(data[body + ps.size : rec_end])
    parts = raw.split(b"\0")
    if nstr < 3:
        raise TraceError(
            "%s is corrupt: the PROCESS record at offset %d holds %d strings "
            "(exe, host and cwd come first)" % (t.path, off, nstr)
        )
    # never believe a count beyond the strings the record holds; bytes that are not UTF-8 kept
    # as \xNN (units.lossless's form), never lost
    strs = [x.decode(errors="backslashreplace") for x in parts[: min(nstr, len(parts))]]
    strs += [""] * max(0, 3 - len(strs))
    t.exe, t.host, t.cwd = strs[0], strs[1], strs[2]
    t.argv = strs[3 : 3 + argc]


def _rec_info(t: Trace, data: CData, off: int, body: int, rec_end: int) -> None:
    inf_s, _ = layout("struct ct_rec_info")
    klen, vlen, _ = inf_s.unpack_from(data, body)
    p = body + inf_s.size
    key = bytes(data[p : min(p + klen, rec_end)]).decode(errors="replace")
    val = bytes(data[min(p + klen + 1, rec_end) : min(p + klen + 1 + vlen, rec_end)]).decode(
        errors="replace"
    )
    t.info[key] = val


def _rec_pyframe(t: Trace, data: CData, off: int, body: int, rec_end: int) -> None:
    if t.py is None:
        t.py = pyframes.PyTables()
    pyf_s, _ = layout("struct ct_rec_pyframe")
    nid, parent, code, lasti, flags, _ = pyf_s.unpack_from(data, body)
    t.py.add_node(nid, parent, code, lasti, flags)


def _rec_pycode(t: Trace, data: CData, off: int, body: int, rec_end: int) -> None:
    if t.py is None:
        t.py = pyframes.PyTables()
    pyc_s, _ = layout("struct ct_rec_pycode")
    addr, start, cid, first, units, ltlen, flen, qlen, _ = pyc_s.unpack_from(data, body)
    p = body + pyc_s.size
    fname = bytes(data[p : p + flen]).decode(errors="replace")
    qname = bytes(data[p + flen + 1 : p + flen + 1 + qlen]).decode(errors="replace")
    p += flen + qlen + 2
    t.py.add_code(
        pyframes.PyCode(cid, addr, fname, qname, first, units, bytes(data[p : p + ltlen]))
    )


def _rec_snapslot(t: Trace, data: CData, off: int, body: int, rec_end: int) -> None:
    t.snap_slots.append(bytes(data[off:rec_end]))  # --aggregate (read/aggregate.py reads it)


def _rec_end(t: Trace, data: CData, off: int, body: int, rec_end: int) -> None:
    end_s, _ = layout("struct ct_rec_end")
    ts, code, dropped, _nodes, events = end_s.unpack_from(data, body)
    t.end = End(ts, code, dropped, events)


# the non-event records other than STACK, by their CT_REC_ name: one decoder each
_RECORD_DECODERS = {
    "MODULE": _rec_module,
    "API": _rec_api,
    "PROCESS": _rec_process,
    "INFO": _rec_info,
    "PYFRAME": _rec_pyframe,
    "PYCODE": _rec_pycode,
    "SNAPSLOT": _rec_snapslot,
    "END": _rec_end,
}


@dataclass
class TraceDir:
    path: Path
    traces: list[Trace]
    run: dict[str, Any]
    errors: list[str]

    bad_samples: int = 0
    # a run of several trace directories (read_dirs): each directory and its run.json
    dirs: list[Path] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def samples(self) -> list[dict[str, Any]]:
        """The sampler's lines that are well formed, from every sample file there (an
        --aggregate run's bounded set: tracedir.py), in time order, each sample once; others
        are skipped and counted (bad_samples): a line cut by a crash, or a file edited by
        hand."""
        seen: dict[int, dict[str, Any]] = {}
        self.bad_samples = 0
        if len(self.dirs) > 1:  # each host sampled its own devices, on its own clock
            return []
        for name in tracedir.SAMPLE_FILES:
            p = self.path / name
            try:
                text = p.read_text(errors="replace") if p.is_file() else ""
            except OSError:
                text = ""
            for line in text.splitlines():
                try:
                    s = json.loads(line)
                except ValueError:
                    s = None
                if _valid_sample(s):
                    seen.setdefault(s["t"], s)
                else:
                    self.bad_samples += 1
        return [seen[t] for t in sorted(seen)]


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _valid_sample(s: object) -> bool:
    if not isinstance(s, dict) or not _int(s.get("t")):
        return False
    if not isinstance(s.get("pids", []), list) or not all(_int(x) for x in s.get("pids", [])):
        return False
    for k in ("mem_available", "tree_rss"):
        if s.get(k) is not None and not _int(s[k]):
            return False
    devs = s.get("devices")
    if devs is not None and not (
        isinstance(devs, list)
        and all(
            isinstance(d, dict)
            and all(_int(d.get(k)) or d.get(k) is None for k in ("index", "total", "free", "used"))
            for d in devs
        )
    ):
        return False
    tdb = s.get("tree_device_bytes")
    if tdb is not None and not (
        isinstance(tdb, dict) and all(isinstance(k, str) and _int(v) for k, v in tdb.items())
    ):
        return False
    return True


# run.json keys the analysis reads, and the types they must have (None is always allowed)
_RUN_TYPES: dict[str, type | tuple[type, ...]] = {
    "argv": list,
    "executable": str,
    "cwd": str,
    "dir": str,
    "stack_depth": int,
    "budget": dict,
    "group": str,
    "on_exceed": str,
    "start_monotonic_ns": int,
    "start_time": (int, float),
    "returncode": int,
    "exit_status": int,
    "end_monotonic_ns": int,
    "end_time": (int, float),
    "budget_aborted": bool,
    "sampler": dict,
    "ledger_final": dict,
    "pid": int,
    "exits": list,
}


def _valid_run(obj: object) -> tuple[dict[str, Any], list[str]]:
    """run.json checked like a trace: a JSON object whose known keys have their types; what
    does not fit is dropped and said."""
    if not isinstance(obj, dict):
        return {}, [
            f"run.json is not a JSON object ({type(obj).__name__}); its figures are ignored"
        ]
    bad = [
        k
        for k, t in _RUN_TYPES.items()
        if obj.get(k) is not None
        and (not isinstance(obj[k], t) or (t is int and isinstance(obj[k], bool)))
    ]
    if isinstance(obj.get("argv"), list) and not all(isinstance(a, str) for a in obj["argv"]):
        bad.append("argv")
    return {k: v for k, v in obj.items() if k not in bad}, (
        ["run.json: ignored malformed {}".format(", ".join(sorted(set(bad))))] if bad else []
    )


def trace_files(path: Path) -> list[Path]:
    return sorted(
        path.glob("*.ctrace"),
        key=lambda p: tuple(int(x) for x in p.name.split(".")[:2] if x.isdigit()) or (0,),
    )


def read_dir(path: str | os.PathLike[str]) -> TraceDir:
    """Read a trace directory (or a single .ctrace file). Unreadable files are reported in errors."""
    path = Path(path)
    if path.is_file():
        return TraceDir(path.parent, [read_trace(path)], {}, [])
    if not path.is_dir():
        raise TraceError(f"{path}: no such trace directory or file")
    traces, errors = [], []
    for p in trace_files(path):
        try:
            traces.append(read_trace(p))
        except TraceError as e:
            errors.append(str(e))
    run: dict[str, Any] = {}
    rp = path / tracedir.RUN
    if rp.exists():
        try:
            run, why = _valid_run(lossless_data(json.loads(rp.read_text())))
            errors += why
        except (ValueError, OSError) as e:
            errors.append(f"run.json unreadable: {e}")
    if not traces and not errors:
        raise TraceError(f"{path} holds no trace files (*.ctrace)")
    # An image that called exec after using CUDA writes no exit record; when the new image of the
    # same pid wrote a file too, the earlier one ended by exec, not by a kill.
    later: dict[int, int] = {}
    for t in traces:
        later[t.pid] = max(later.get(t.pid, -1), t.exec_index)
    for t in traces:
        if t.status == "truncated" and t.exec_index < later[t.pid]:
            t.status = "exec"
    _exits_seen(traces, run.get("exits") or [])
    return TraceDir(path, traces, run, errors)


def _exits_seen(traces: list[Trace], exits: list[Any]) -> None:
    """The launcher's record of when processes exited (record/exits.py), on their traces,
    matched by pid and start time."""
    seen = {}
    for x in exits:
        if isinstance(x, dict) and all(isinstance(x.get(k), int) for k in _EXIT_KEYS):
            seen[(x["pid"], x["start_ticks"])] = x["exit_monotonic_ns"]
    for t in traces:
        t.exit_seen_ns = max(0, seen.get((t.pid, t.start_ticks), 0))


_EXIT_KEYS = ("pid", "start_ticks", "exit_monotonic_ns")


def iter_events(t: Trace) -> Iterator[dict[str, Any]]:
    """Events as dicts (for tests and small traces)."""
    names = event_fields()
    for e in t.events:
        yield dict(zip(names, e))


# ---- a run of several trace directories (docs/ranks.md) ------------------------------------


def run_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """The trace directories a path names: itself (a trace directory or a .ctrace file), or,
    for a directory that holds no trace file but trace directories (one per host: `-o
    run/$(hostname)`), each of those, sorted by name."""
    p = Path(path)
    if not p.is_dir() or any(p.glob("*.ctrace")):
        return [p]
    subs = sorted(
        d for d in p.iterdir() if d.is_dir() and not d.is_symlink() and any(d.glob("*.ctrace"))
    )
    if subs and (p / SWEEP_JSON).is_file():
        raise TraceError(_sweep_folder(p, subs))
    return subs or [p]


SWEEP_JSON = "sweep.json"  # what `cudatrace sweep` writes beside its runs' trace directories


def _sweep_folder(p: Path, subs: list[Path]) -> str:
    """What to run on a sweep's folder, which holds separate runs (one per value), not the
    ranks of one run."""
    q = shell_quote
    out = [
        f"{p} is a sweep (`cudatrace sweep` wrote {SWEEP_JSON} there): its {len(subs)} trace "
        "directories are separate runs of the command, one per value, not the ranks of one run.",
        f"  the laws of the sweep:  cudatrace sweep --from {q([str(p)])}",
        f"  one run:                cudatrace report {q([str(subs[0])])}",
    ]
    if len(subs) > 1:
        out.append(f"  two runs compared:      cudatrace diff {q([str(subs[0]), str(subs[-1])])}")
    return "\n".join(out)


def read_dirs(paths: Iterable[str | os.PathLike[str]]) -> TraceDir:
    """Several trace directories read as one run: the traces of all, in the order given, each
    noting its directory (Trace.source); every error named with its directory. Processes on
    different hosts are put on one clock by load.align_clocks, which load() calls."""
    dirs = [d for p in paths for d in run_dirs(p)]
    if len(dirs) == 1:
        return read_dir(dirs[0])
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise TraceError("the same trace directory is named twice")
    traces: list[Trace] = []
    errors: list[str] = []
    runs: list[dict[str, Any]] = []
    for d in dirs:
        if not d.exists():
            raise TraceError(f"{d}: no such trace directory or file")
        try:
            td = read_dir(d)
        except TraceError as e:
            errors.append(str(e))
            runs.append({})
            continue
        for t in td.traces:
            t.source = str(d)
        traces += td.traces
        errors += [f"{d}: {e}" for e in td.errors]
        runs.append(td.run)
    run = dict(runs[0]) if runs else {}
    return TraceDir(dirs[0], traces, run, errors, dirs=dirs, runs=runs)


def host_of(t: Trace) -> str:
    """The host a process ran on: CUDATRACE_HOST when it was set (a container whose hostname is
    not the machine's), else the hostname the shim read."""
    return t.info.get("env.CUDATRACE_HOST") or t.host or "?"
