"""A trace file's bytes in memory, its sealed chunks put back, without ever reading a hole.

The launcher punches sealed chunks out of a trace once their compressed copies are in the
sidecar (record/seal.py, cudatrace/sidecar.py). The view this module builds (`open_view`) is one
read-only range of the file's size, made of (native/reader/scan.c, ct_map_parts):

- the file's data, mapped from it (pages the scan and the replay read are dropped and come back
  from the page cache), or, while a sealer may still punch it (its run is going on), copied
  with pread: a punch under a mapping would leave the reader faulting a hole;
- each sealed chunk whose data the file no longer holds, inflated from its sidecar entry (one
  chunk at a time, never past a chunk's size) into a memfd mapped in its place;
- zeros elsewhere (anonymous: reading them costs nothing).

Reading a hole of a tmpfs file through a mapping would allocate its page again (undoing the
punch) or, on a full tmpfs, raise SIGBUS; pread of a hole and the anonymous zeros never do.
A chunk the header says was sealed (or that lies before data the file still holds) and that
neither file holds intact is lost: named in the view (`lost`), never read as silent zeros.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ... import native, sidecar, tracedir

PAGE = mmap.PAGESIZE
_MAX_PARTS = 16384  # mappings per view (the kernel's map count is ~65530 a process)
_COPY = 1 << 20
_consts: dict[str, int] = {}


@dataclass
class View:
    ptr: object  # uint8_t * (cffi), unmapped when collected
    size: int
    chunk_size: int
    lost: list[int] = field(default_factory=list)  # chunks neither file holds
    notes: list[str] = field(default_factory=list)  # what the sidecar's damage cost, said
    suspects: list[int] = field(default_factory=list)  # sealed chunks the file holds as data


def _extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The file's data as page-aligned [start, end) ranges (the whole file where the
    filesystem cannot tell its holes)."""
    out: list[tuple[int, int]] = []
    off = 0
    while off < size:
        try:
            a = os.lseek(fd, off, os.SEEK_DATA)
            b = os.lseek(fd, a, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break
            return [(0, size)]
        a = a // PAGE * PAGE
        b = min(-(-min(b, size) // PAGE) * PAGE, -(-size // PAGE) * PAGE)
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
        off = b
    return _fewer(out)


def _fewer(ext: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """At most _MAX_PARTS ranges: the smallest gaps closed first (a file shredded into more
    pieces than a process may map is read with a few of its holes)."""
    gap = PAGE
    while len(ext) > _MAX_PARTS:
        merged = [ext[0]]
        for a, b in ext[1:]:
            if a - merged[-1][1] <= gap:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        ext, gap = merged, gap * 2
    return ext


def _settled(path: Path, has_side: bool) -> bool:
    """No sealer can punch the file any more: its run's launcher has ended (run.json says so),
    or it never had one (no run.json and no sidecar)."""
    try:
        info = json.loads((path.parent / tracedir.RUN).read_text())
    except FileNotFoundError:
        return not has_side
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and ("exit_status" in info or "end_monotonic_ns" in info)


def _header(fd: int) -> tuple[int, int]:
    """(chunk size, sealed_chunks) of the file's header; (CT_CHUNK_SIZE, 0) where it has none."""
    ffi = native.ffi()
    if not _consts:
        _consts.update(native.constants())
    consts = _consts
    head = os.pread(fd, consts["CT_HEADER_SIZE"], 0)
    off = ffi.offsetof("struct ct_file_header", "sealed_chunks")
    cs = consts["CT_CHUNK_SIZE"]
    if len(head) < off + 4 or head[:8] != b"CUDATRC\0" or struct.unpack_from("<I", head, 8)[0] < 3:
        return cs, 0
    chunk = struct.unpack_from("<I", head, ffi.offsetof("struct ct_file_header", "chunk_size"))[0]
    if chunk != cs:
        return cs, 0  # a header that is not ours to trust: refused by the parse anyway
    return cs, struct.unpack_from("<I", head, off)[0]


def _open_side(path: Path, notes: list[str]) -> int | None:
    side = sidecar.path_of(path)
    try:
        sfd = os.open(side, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        notes.append(f"{Path(side).name}: cannot open: {e.strerror or e}")
        return None
    if not stat.S_ISREG(os.fstat(sfd).st_mode):
        os.close(sfd)
        notes.append(f"{Path(side).name} is not a regular file: not read")
        return None
    return sfd


class _Builder:
    """The pieces of one view: which chunk comes from where."""

    def __init__(self, path: Path, fd: int, size: int):
        self.path, self.fd, self.size = path, fd, size
        self.cs, self.mark = _header(fd)
        self.nchunks = -(-size // self.cs)
        self.notes: list[str] = []
        self.side = _open_side(path, self.notes)
        self.settled = _settled(path, self.side is not None)
        self.filled: set[int] = set()
        self.memfd: int | None = None
        self.mem: list[tuple[int, int]] = []  # ranges of the memfd to map
        self.file: list[tuple[int, int]] = []  # ranges of the trace to map

    def close(self) -> None:
        for f in (self.side, self.memfd):
            if f is not None:
                os.close(f)

    def _mem_fd(self) -> int:
        if self.memfd is None:
            try:
                self.memfd = os.memfd_create("cudatrace-unsealed", os.MFD_CLOEXEC)
            except (AttributeError, OSError):  # no memfd here: an unlinked temporary file
                import tempfile

                with tempfile.TemporaryFile() as f:
                    self.memfd = os.dup(f.fileno())
            os.ftruncate(self.memfd, self.size)
        return self.memfd

    def _put(self, off: int, data: bytes) -> None:
        refused = OSError(errno.ENOSPC, "no room to put a sealed chunk back")
        sidecar.pwrite_all(self._mem_fd(), data, off, refused)

    def inflate(self, want: Callable[[int], bool]) -> None:
        """Put back the chunks `want(c)` accepts from the sidecar's intact entries."""
        if self.side is None:
            return
        ents = sidecar.Entries(self.side, self.cs)
        for c, raw, _off in ents:
            if not 1 <= c < self.nchunks or c in self.filled or not want(c):
                continue
            self.filled.add(c)
            a = c * self.cs
            n = min(self.cs, self.size - a)
            if raw.count(0, 0, n) != n:  # an empty chunk: the anonymous zeros are it
                self._put(a, raw[:n])
                self.mem.append((a, n))
        for off, n in ents.damaged:
            self.notes.append(
                "%s: %d damaged byte(s) at offset %d skipped"
                % (Path(sidecar.path_of(self.path)).name, n, off)
            )

    def copy(self, ext: list[tuple[int, int]]) -> None:
        """The file's data outside the chunks put back, copied with pread (never mapped)."""
        for a, b in self._outside_filled(ext):
            off = a
            while off < b:
                data = os.pread(self.fd, min(_COPY, b - off), off)
                if not data:
                    break
                self._put(off, data)
                off += len(data)
            if off > a:
                self.mem.append((a, off - a))

    def _outside_filled(self, ext: list[tuple[int, int]]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for a, b in ext:
            while a < b:
                c = a // self.cs
                end = min(b, (c + 1) * self.cs)
                if c not in self.filled:
                    if out and out[-1][1] == a:
                        out[-1] = (out[-1][0], end)
                    else:
                        out.append((a, end))
                a = end
        return out

    def zeros(self, c: int) -> bool:
        """Chunk c of the file reads as zeros only."""
        a = c * self.cs
        n = min(self.cs, self.size - a)
        raw = sidecar.pread_exact(self.fd, n, a)
        return raw.count(0) == len(raw)

    def has_data(self, ext: list[tuple[int, int]]) -> set[int]:
        """Chunks where the file holds any data."""
        out: set[int] = set()
        for a, b in ext:
            out.update(range(a // self.cs, (b - 1) // self.cs + 1))
        return out

    def lost(self, data: set[int]) -> tuple[list[int], list[int]]:
        """(chunks lost, chunks to look at): chunks sealed (below the header's mark, or before
        data the file still holds) that neither the file nor the sidecar holds; and those the
        file holds as data, which are lost too if they read as zeros only (a copy of the trace
        that filled its holes in, without the sidecar or with a damaged one)."""
        last = max(data, default=0)
        sealed = [
            c
            for c in range(1, self.nchunks)
            if c not in self.filled and (c < self.mark or c < last)
        ]
        return [c for c in sealed if c not in data], [c for c in sealed if c in data]


def _build(b: _Builder) -> tuple[list[tuple[int, int, int]], tuple[list[int], list[int]]]:
    """(parts to map: (offset, length, fd)), (lost chunks, suspect chunks)) of the view."""
    ext = _extents(b.fd, b.size)
    data = b.has_data(ext)
    if b.settled:
        # the file's own bytes where it still has them (zeros there: a copy that filled the
        # holes in, e.g. by cp or scp, so the entry is the chunk)
        b.inflate(lambda c: c not in data or b.zeros(c))
        b.file = b._outside_filled(ext)
    else:
        b.inflate(lambda c: True)
        b.copy(ext)
        # chunks punched while they were copied: their entries were synced before the punch
        after = _extents(b.fd, b.size)
        gone = data - b.has_data(after) - b.filled
        if gone:
            b.mem = [(a, n) for a, n in b.mem if a // b.cs not in gone]
            b.inflate(lambda c: c in gone)
            data -= gone
    parts = [(a, e - a, b.fd) for a, e in b.file]
    parts += [(a, n, b.memfd) for a, n in b.mem if b.memfd is not None]
    return sorted(parts), b.lost(data)


def open_view(path: Path, fd: int, size: int) -> View:
    """The view of the trace open as fd (size bytes). OSError when it cannot be mapped."""
    ffi, lib = native.tools()
    b = _Builder(path, fd, size)
    try:
        parts, (lost, suspects) = _build(b)
        arr = ffi.new("struct ct_map_part[]", max(len(parts), 1))
        for i, (off, n, pfd) in enumerate(parts):
            arr[i].off, arr[i].len, arr[i].fd = off, n, pfd
        ptr = lib.ct_map_parts(size, arr, len(parts))
        if ptr == ffi.NULL:
            raise OSError(errno.ENOMEM, f"cannot map {size} bytes")
    finally:
        b.close()
    # the destructor runs inside a garbage collection, which may come while cffi holds its own
    # lock (parsing a type): it must not look a function up in lib then (that takes the lock)
    unmap = lib.ct_unmap
    mapping = ffi.gc(ffi.cast("uint8_t *", ptr), lambda p: unmap(p, size), size)
    return View(mapping, size, b.cs, lost, list(b.notes), suspects)


def trace_bytes(path: str | os.PathLike[str]) -> bytes:
    """A trace file's whole bytes, sealed chunks put back (for tests and tools: a copy)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        v = open_view(Path(path), fd, size)
    finally:
        os.close(fd)
    return bytes(native.ffi().buffer(v.ptr, size))


def check_zeros(v: View, data: Any) -> None:
    """The suspect chunks that read as zeros only, lost too (called when the scan met zeros
    where records should be); then the loss said in the view's notes."""
    for c in v.suspects:
        a = c * v.chunk_size
        n = min(v.chunk_size, v.size - a)
        if bytes(data[a : a + n]).count(0) == n:
            v.lost.append(c)
    v.lost.sort()


def loss_note(v: View, name: str) -> str | None:
    if not v.lost:
        return None
    return (
        "%d sealed chunk(s) of %s are in neither the trace nor its sidecar (%s): their "
        "events are lost" % (len(v.lost), name, _chunk_list(v.lost))
    )


def _chunk_list(chunks: list[int]) -> str:
    text = ", ".join(str(c) for c in chunks[:8])
    return "chunk " + text + (" and %d more" % (len(chunks) - 8) if len(chunks) > 8 else "")
