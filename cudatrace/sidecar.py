"""The compressed copy of a trace's sealed chunks, `<pid>.<n>.ctrace.z` (docs/format.md,
"Sealed chunks"): written by the launcher's sealer (record/seal.py), read back by the reader
(analyze/read/unseal.py). A leaf: imports nothing from cudatrace.

Entries back to back, each

    magic b"CTZ1" | chunk index (u32) | compressed length (u32) | crc32 of the chunk (u32) | zlib

Writing (`append`): every byte is written (a short count goes on from where it stopped), the
file synced, and the entry read back and compared, before the caller may punch the chunk out of
the trace; a failure (a full disk) cuts the sidecar back to its last whole entry and raises, so
the chunk stays in the trace.

Reading (`Entries`): each entry stands alone. One whose header, length, data or checksum is
wrong is skipped by looking for the next magic, so damage costs only the chunks whose entries it
hit, and those are counted; no entry inflates past one chunk, whatever its data says. The look
never reads a hole of the file (SEEK_DATA): a tail of zeros or holes (a size a crash or a copy
left, never written) costs what its data costs, not its size, and is no damage.
"""

from __future__ import annotations

import errno
import os
import struct
import zlib
from collections.abc import Iterator

SUFFIX = ".z"
MAGIC = b"CTZ1"
HEAD = struct.Struct("<4sIII")  # magic, chunk, compressed length, crc32 of the raw chunk
_WINDOW = 1 << 20  # bytes read at a time while looking for the next entry after damage


def path_of(trace: os.PathLike[str] | str) -> str:
    """The sidecar of a trace file."""
    return os.fspath(trace) + SUFFIX


def entry(chunk: int, raw: bytes, level: int = 1) -> bytes:
    """One entry for chunk `chunk` whose bytes are `raw`."""
    z = zlib.compress(raw, level)
    return HEAD.pack(MAGIC, chunk, len(z), zlib.crc32(raw)) + z


def max_stored(chunk_size: int) -> int:
    """The most a chunk's compressed data can take (zlib's worst case, with room to spare): a
    longer entry is damage, never read."""
    return chunk_size + chunk_size // 1000 + 1024


def pread_exact(fd: int, n: int, off: int) -> bytes:
    """n bytes at off (fewer only at the end of the file)."""
    parts = []
    while n > 0:
        b = os.pread(fd, min(n, 1 << 24), off)
        if not b:
            break
        parts.append(b)
        n -= len(b)
        off += len(b)
    return b"".join(parts)


def pwrite_all(fd: int, data: bytes, off: int, refused: OSError) -> None:
    """Every byte of data at off: a short count goes on from where it stopped; `refused` is
    raised when a write takes no byte."""
    view = memoryview(data)
    done = 0
    while done < len(data):
        n = os.pwrite(fd, view[done:], off + done)
        if n <= 0:
            raise refused
        done += n


def append(fd: int, at: int, data: bytes) -> int:
    """Write entry `data` at offset `at` (the end of the sidecar's last whole entry), sync it
    and read it back; the new end. OSError when any step fails: the sidecar is cut back to
    `at` first (as far as it can be), and the caller must not punch the chunk."""
    try:
        pwrite_all(fd, data, at, OSError(errno.EIO, "the sidecar took no bytes"))
        os.fsync(fd)
        if pread_exact(fd, len(data), at) != data:
            raise OSError(errno.EIO, "the sidecar reads back other bytes than were written")
    except OSError:
        try:
            os.ftruncate(fd, at)
            os.fsync(fd)
        except OSError:
            pass  # the next entry is written at `at` again, over what is left
        raise
    return at + len(data)


def inflate(z: bytes, chunk_size: int, crc: int) -> bytes | None:
    """The chunk an entry's data holds: exactly chunk_size bytes whose crc32 is crc, or None.
    Never produces more than chunk_size bytes, whatever the data claims."""
    d = zlib.decompressobj()
    try:
        raw = d.decompress(z, chunk_size)
    except zlib.error:
        return None
    if len(raw) != chunk_size or d.unconsumed_tail or not d.eof or d.unused_data:
        return None
    return raw if zlib.crc32(raw) == crc else None


class Entries:
    """The intact entries of an open sidecar, read with pread one at a time: iterate for
    (chunk index, raw chunk, offset of the entry). After the iteration, `damaged` holds the
    (offset, length) of every stretch that was not an intact entry and `end` the end of the
    last intact one; a torn last entry (an append the launcher could not finish) is `torn`
    bytes, not damage: its chunk was never punched."""

    def __init__(self, fd: int, chunk_size: int, start: int = 0):
        self.fd = fd
        self.chunk_size = chunk_size
        self.start = start
        self.end = start
        self.damaged: list[tuple[int, int]] = []
        self.torn = 0

    def __iter__(self) -> Iterator[tuple[int, bytes, int]]:
        size = os.fstat(self.fd).st_size
        off = self.start
        limit = max_stored(self.chunk_size)
        while off < size:
            head = pread_exact(self.fd, HEAD.size, off)
            raw, length, cut = None, 0, len(head) < HEAD.size
            if not cut:
                magic, chunk, length, crc = HEAD.unpack(head)
                if magic == MAGIC and length <= limit:
                    cut = off + HEAD.size + length > size
                    if not cut:
                        raw = inflate(
                            pread_exact(self.fd, length, off + HEAD.size), self.chunk_size, crc
                        )
            if raw is None:
                nxt = self._next_magic(off + 1, size)
                begun = cut and head.startswith(MAGIC[: len(head)])
                if nxt == size and (begun or self._zeros(off, size)):
                    self.torn = size - off  # an append begun and never finished, last
                    return
                self.damaged.append((off, nxt - off))
                off = nxt
                continue
            yield chunk, raw, off
            off += HEAD.size + length
            self.end = off

    def _data(self, off: int, size: int) -> int:
        """The first offset at or after off where the file holds data (size: only holes
        from off on); off where the filesystem cannot tell its holes."""
        try:
            return min(os.lseek(self.fd, off, os.SEEK_DATA), size)
        except OSError as e:
            return size if e.errno == errno.ENXIO else off

    def _next_magic(self, off: int, size: int) -> int:
        """The offset of the next magic at or after off, or size. Holes are skipped, never
        read: the magic has no zero byte, so none starts in or runs into one."""
        while off < size:
            off = self._data(off, size)
            if off >= size:
                break
            block = pread_exact(self.fd, _WINDOW + len(MAGIC) - 1, off)
            i = block.find(MAGIC)
            if i >= 0:
                return off + i
            if len(block) < _WINDOW + len(MAGIC) - 1:
                return size
            off += _WINDOW
        return size

    def _zeros(self, off: int, size: int) -> bool:
        """The file from off to size is zeros or holes (its data read, never its holes)."""
        while off < size:
            off = self._data(off, size)
            if off >= size:
                return True
            block = pread_exact(self.fd, min(_WINDOW, size - off), off)
            if not block or block.count(0) != len(block):
                return False
            off += len(block)
        return True
