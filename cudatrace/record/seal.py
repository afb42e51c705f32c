"""Sealed chunks of the traces compressed while the program runs, outside the target.

The shim writes a trace through shared mappings in 2 MiB chunks and, once no thread can write
a chunk again (it has unmapped it), raises `sealed_chunks` in the file header
(native/include/trace_format.h). The launcher's sealer thread compresses each sealed chunk
(zlib, the standard library) into the trace's sidecar `<name>.ctrace.z` (cudatrace/sidecar.py),
its raw events (format version 4: the shim writes fixed-size records, issue 42) first rewritten
as compact ones (native/reader/transcode.c: the same records, the same events, checked):
every byte written, synced and read back, and only then punches the chunk out of the trace
(FALLOC_FL_PUNCH_HOLE: the file keeps its size, the blocks go back). A write that fails (a full
disk) cuts the sidecar back to its last whole entry and leaves the chunk in the trace; the next
pass tries again. So at every moment each chunk is whole in one of the two files: a SIGKILL of
the target or of the launcher, or a full disk, loses nothing sealed; the reader puts the chunks
back (analyze/read/unseal.py). At the end of the run, the files of processes that are gone are
sealed whole (no mapping of them is left) but for chunk 0, which holds the header: their header
says so first (`sealed_chunks`, so a reader knows which chunks the sidecar must hold), and a
file a killed process left at its chunks' size is cut to its last record. Chunk 0's raw events
are then transcoded in a copy of the file renamed over it (`_rewrite_first`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from pathlib import Path
from typing import TypedDict, cast

from .. import native, sidecar
from .worker import Worker

_FALLOC_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


class SealInfo(TypedDict):
    """What the sealer did (run.json "sealed")."""

    chunks_bytes: int
    compressed_bytes: int
    error: str | None


def _field(name: str) -> int:
    """Offset of a field of struct ct_file_header (trace_format.h, through cffi)."""
    return int(native.ffi().offsetof("struct ct_file_header", name))


_defines: dict[str, int] = {}


def _define(name: str) -> int:
    """A #define of trace_format.h (no cffi: a short run never parses the layouts,
    tests/integration/test_startup.py)."""
    if not _defines:
        _defines.update(native.defines(native.header_text("trace_format.h")))
    return _defines[name]


def _min_chunk() -> int:
    return _define("CT_CHUNK_SIZE")


def _compacted(raw: bytes) -> bytes:
    """A sealed chunk of a version-4 trace with its raw events as compact ones (the same
    events: transcode.c decodes its output again and holds it to them), or the chunk as it is
    when it cannot be carried over exactly."""
    ffi, lib = native.tools()
    out = ffi.new("uint8_t[]", len(raw))
    if lib.ct_chunk_compact(ffi.from_buffer(raw), len(raw), out) == 0:
        return raw
    return cast(bytes, ffi.buffer(out, len(raw))[:])


def _punch(fd: int, off: int, length: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    f = libc.fallocate
    f.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    return bool(f(fd, _FALLOC_PUNCH, off, length) == 0)


def _sync_dir(d: Path) -> None:
    """fsync a directory: a file created in it is there after a crash."""
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _writer_gone(fd: int, flags: int, pid: int, start_ticks: int) -> bool:
    """No process writes the trace open as fd any more: its writer's lock is gone (a shim
    that takes one, CT_FH_LIVE_LOCK: true in any pid namespace), else its pid and start time
    name no process."""
    if flags & _define("CT_FH_LIVE_LOCK"):
        ffi, lib = native.tools()
        return lib.ct_file_locked(fd) == 0
    return _gone(pid, start_ticks)


def _gone(pid: int, start_ticks: int) -> bool:
    """The process that wrote the file has exited (pid reuse told by its start time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    try:
        return int(stat.rsplit(")", 1)[1].split()[19]) != start_ticks
    except (IndexError, ValueError):
        return False


class Sealer(Worker):
    """Compresses the sealed chunks of every trace in `out`, every `interval` seconds, and again
    after `busy` seconds while a pass found chunks to seal (a program writing raw records fast,
    ~24 bytes an event, fills a small disk before an idle interval is over)."""

    def __init__(self, out: Path, interval: float = 1.0, busy: float = 0.1):
        super().__init__("cudatrace-sealer")
        self.out = Path(out)
        self.interval = interval
        self.busy = busy
        self.done: dict[Path, int] = {}  # trace -> chunks below this are in the sidecar
        self.off: set[Path] = set()  # traces this filesystem cannot punch: left alone
        self.created: set[Path] = set()  # sidecars this sealer created
        self.side_len: dict[Path, int] = {}  # sidecar -> the end of its last whole entry
        self.last_raw: dict[Path, tuple[int, bytes]] = {}  # the last chunk sealed, to cut at
        self.compact: dict[Path, bool] = {}  # trace -> its raw events are transcoded
        self.rewritten: set[Path] = set()  # traces whose chunk 0 was transcoded
        self.raw_bytes = 0
        self.stored_bytes = 0
        self.error = ""

    def stop(self) -> None:
        """Stop the thread, then seal what the processes that are gone left (their whole files)."""
        self._halt()
        self.pass_once(final=True)

    def _run(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            wait = self.busy if self.pass_once() else self.interval

    def pass_once(self, final: bool = False) -> int:
        """One pass over the run's traces; the chunks it sealed."""
        n = 0
        for p in sorted(self.out.glob("*.ctrace")):
            if p in self.off:
                continue
            try:
                n += self.seal_file(p, final)
            except OSError as e:  # never stops the run: the trace stays as the shim wrote it
                self.error = f"{p.name}: {e.strerror or e}"
                self.off.add(p)
        return n

    def seal_file(self, p: Path, final: bool = False) -> int:
        """Compress the chunks of p sealed since the last pass; the number compressed."""
        fd = os.open(p, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < _min_chunk():
                return 0  # cut by the shim at its exit, within chunk 0: nothing to do
            head = os.pread(fd, 256, 0)
            if len(head) < 256 or head[:8] != b"CUDATRC\0":
                return 0

            def u32(f: str) -> int:
                return int(struct.unpack_from("<I", head, _field(f))[0])

            if u32("version") < 3:
                return 0  # no sealed_chunks before version 3
            chunk = u32("chunk_size")
            sealed = u32("sealed_chunks")
            pid = struct.unpack_from("<i", head, _field("pid"))[0]
            ticks = struct.unpack_from("<Q", head, _field("process_start_ticks"))[0]
            size = st.st_size
            total = -(-size // chunk)
            gone = final and _writer_gone(fd, u32("flags"), pid, ticks)
            if gone and sealed < total:
                # no process maps it any more: every chunk, said in the header first
                os.pwrite(fd, struct.pack("<I", total), _field("sealed_chunks"))
                sealed = total
            elif not gone:
                total = size // chunk  # a chunk still being written is never compressed
            self.compact[p] = u32("version") >= 4
            n = self._seal_chunks(p, fd, chunk, min(sealed, total), size, st.st_mode & 0o777, gone)
            if gone and p not in self.off and self.done.get(p, 1) >= total:
                self._cut(p, fd, chunk, size)
                if self.compact.get(p) and total >= 2 and p not in self.rewritten:
                    self.rewritten.add(p)
                    self._rewrite_first(p, fd, chunk, st)
            return n
        finally:
            os.close(fd)

    def _seal_chunks(
        self, p: Path, fd: int, chunk: int, upto: int, size: int, mode: int, final: bool
    ) -> int:
        """Chunks from where the last pass stopped up to `upto`, each compressed into the
        sidecar (durable, read back) before it is punched; the number sealed. A chunk whose
        entry cannot be written (a full disk) stays in the trace: the next pass tries it again,
        or, in the final pass of a gone process's file (`final`), the next chunk is tried."""
        n = 0
        side = Path(sidecar.path_of(p))
        for i in range(max(1, self.done.get(p, 1)), upto):
            raw = sidecar.pread_exact(fd, min(chunk, size - i * chunk), i * chunk)
            if not raw:
                break
            raw = raw.ljust(chunk, b"\0")  # the last chunk of a file cut to its records
            if final and i == upto - 1:
                self.last_raw[p] = (i, raw)  # where its records end: _cut
            entry = sidecar.entry(i, _compacted(raw) if self.compact.get(p) else raw)
            sfd = self._open_side(side, mode)
            try:
                self.side_len[side] = sidecar.append(sfd, self.side_len.get(side, 0), entry)
            except OSError as e:  # the chunk stays in the trace
                self.error = f"{side.name}: {e.strerror or e}"
                if not final:
                    return n
                self.done[p] = i + 1
                continue
            finally:
                os.close(sfd)
            if not _punch(fd, i * chunk, min(chunk, size - i * chunk)):
                self.off.add(p)  # e.g. a filesystem without hole punching: stop here
                return n
            self.done[p] = i + 1
            self.raw_bytes += chunk
            self.stored_bytes += len(entry)
            n += 1
        return n

    def _rewrite_first(self, p: Path, fd: int, chunk: int, st: os.stat_result) -> None:
        """Chunk 0 of a gone process's file (its header, then raw events: never sealed, as
        the header lives there) with its events transcoded, the file written again beside it
        and renamed over it once synced: whole in one form or the other at every moment, the
        sealed chunks' holes kept as holes. Only once every other chunk is in the sidecar; a
        failure (a full disk) leaves the file as it is."""
        size = os.fstat(fd).st_size
        try:  # only a file whose every other chunk is in the sidecar (a hole here) is copied
            os.lseek(fd, chunk, os.SEEK_DATA)
            return  # a chunk its sidecar could not take (a full disk) is still in it
        except OSError as e:
            if e.errno != errno.ENXIO:
                return  # holes cannot be told here: the copy would fill them in
        first = sidecar.pread_exact(fd, chunk, 0)
        hsize = _define("CT_HEADER_SIZE")
        if len(first) < chunk:
            return
        body = _compacted(first[hsize:])
        if body is first[hsize:] or len(body) != chunk - hsize:
            return  # nothing carried over (a hole, a record of another format)
        data = first[:hsize] + body.rstrip(b"\0")  # its rest: a hole (a PAD's body, zeros)
        tmp = p.with_name("." + p.name + ".tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            tfd = os.open(tmp, flags, st.st_mode & 0o777)
        except OSError:
            return
        try:
            if os.geteuid() == 0:
                os.fchown(tfd, st.st_uid, st.st_gid)  # the traced program's, not root's
            view, done = memoryview(data), 0
            while done < len(data):
                done += os.pwrite(tfd, view[done:], done)
            os.ftruncate(tfd, size)
            os.fsync(tfd)
            os.rename(tmp, p)
        except OSError as e:
            self.error = f"{p.name}: {e.strerror or e}"
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        finally:
            os.close(tfd)
        _sync_dir(p.parent)

    def _cut(self, p: Path, fd: int, chunk: int, size: int) -> None:
        """A gone process's file cut to its last record (a killed process's file keeps its
        chunks' size: the shim cuts it only at a clean exit). The records' end is found in the
        last chunk as the final pass read it, or in the trace when that is chunk 0."""
        last = (size - 1) // chunk
        if last == 0:
            raw, start = sidecar.pread_exact(fd, size, 0), 256
        elif self.last_raw.get(p, (0, b""))[0] == last:
            raw, start = self.last_raw.pop(p)[1], 0
        else:
            return
        ffi, lib = native.tools()
        used = last * chunk + int(lib.ct_scan_used(ffi.from_buffer(raw), len(raw), start))
        if used < size:
            os.ftruncate(fd, used)

    def _open_side(self, side: Path, mode: int) -> int:
        """The sidecar for writing: created new (O_EXCL, never through a link, the trace's
        mode, its directory synced) the first time; a file there that this sealer did not
        create is not ours."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        if side not in self.created:
            sfd = os.open(side, flags | os.O_CREAT | os.O_EXCL, mode)
            self.created.add(side)
            self.side_len[side] = 0
            _sync_dir(side.parent)
            return sfd
        sfd = os.open(side, flags)
        if not stat.S_ISREG(os.fstat(sfd).st_mode):
            os.close(sfd)
            raise OSError(f"{side.name} is not a regular file")
        return sfd

    def describe(self) -> SealInfo:
        return {
            "chunks_bytes": self.raw_bytes,
            "compressed_bytes": self.stored_bytes,
            "error": self.error or None,
        }
