"""One ELF file opened with pyelftools: sections and their bytes, build-id, .gnu_debuglink,
.gnu_debugaltlink."""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Iterable
from typing import Any, BinaryIO

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, Section
from elftools.elf.segments import NoteSegment

SHF_EXECINSTR = 0x4


def _note_build_id(notes: Iterable[Any], owner: str | None = "GNU") -> bytes | None:
    for note in notes:
        if note["n_type"] == "NT_GNU_BUILD_ID" and (owner is None or note["n_name"] == owner):
            desc = note["n_desc"]
            return bytes.fromhex(desc) if isinstance(desc, str) else bytes(desc)
    return None


class Elf:
    """close() releases the file descriptor; the file is reopened on the next access."""

    def __init__(self, path: str, data: bytes | None = None):
        self.path = path
        self._data = data
        self._f: BinaryIO | None = None
        self._elf: ELFFile | None = None
        self._sections: dict[str, Section] = {}
        elf = self._open()
        try:
            self.little = elf.little_endian
            self.endian = "<" if self.little else ">"
            self.elfclass = elf.elfclass
            self.machine = elf["e_machine"]
            self.build_id = self._read_build_id()
            self.debuglink = self._read_debuglink()
        except Exception:
            self.close()
            raise

    def _open(self) -> ELFFile:
        f: BinaryIO = io.BytesIO(self._data) if self._data is not None else open(self.path, "rb")
        try:
            elf = ELFFile(f)
            sections: dict[str, Section] = {}
            exec_sections = set()
            zero_is_code = False
            for i, sec in enumerate(elf.iter_sections()):
                sections.setdefault(sec.name, sec)
                if sec["sh_flags"] & SHF_EXECINSTR:
                    exec_sections.add(i)
                    if sec["sh_addr"] == 0 and sec["sh_size"] > 0:
                        zero_is_code = True
        except Exception:
            f.close()
            raise
        self._f, self._elf = f, elf
        self._sections, self.exec_sections, self.zero_is_code = (
            sections,
            exec_sections,
            zero_is_code,
        )
        return elf

    @property
    def elf(self) -> ELFFile:
        if self._elf is None:
            return self._open()
        return self._elf

    @property
    def sections(self) -> dict[str, Section]:
        if self._elf is None:
            self._open()
        return self._sections

    def close(self) -> None:
        f, self._f, self._elf, self._sections = self._f, None, None, {}
        if f is not None:
            try:
                f.close()
            except Exception:
                pass

    def has(self, name: str) -> bool:
        sec = self.sections.get(name)
        return sec is not None and sec["sh_type"] != "SHT_NOBITS" and sec["sh_size"] > 0

    def has_dwarf(self) -> bool:
        return (self.has(".debug_info") or self.has(".zdebug_info")) and (
            self.has(".debug_line") or self.has(".zdebug_line")
        )

    def section_data(self, name: str) -> bytes | None:
        sec = self.sections.get(name)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            if name.startswith(".debug_"):
                return self.section_data(".z" + name[1:])
            return None
        data = sec.data()  # pyelftools decompresses SHF_COMPRESSED (zlib)
        if name.startswith(".zdebug_") and data[:4] == b"ZLIB":
            data = zlib.decompress(data[12:])
        return bytes(data)

    def _read_build_id(self) -> bytes | None:
        secs = [self.sections.get(".note.gnu.build-id")]
        secs += [s for s in self.elf.iter_sections() if isinstance(s, NoteSection)]
        for sec in secs:
            if sec is None or not isinstance(sec, NoteSection) or sec["sh_type"] == "SHT_NOBITS":
                continue
            bid = _note_build_id(sec.iter_notes())
            if bid is not None:
                return bid
        if not self.sections or len(self.sections) <= 1:  # no section headers: look at PT_NOTE
            try:
                for seg in self.elf.iter_segments():
                    if seg["p_type"] == "PT_NOTE" and isinstance(seg, NoteSegment):
                        bid = _note_build_id(seg.iter_notes(), None)
                        if bid is not None:
                            return bid
            except Exception:
                pass
        return None

    def _link(self, section: str) -> tuple[str, bytes, int] | None:
        """A link section's file name (NUL-terminated), its bytes, and where the name ends."""
        sec = self.sections.get(section)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return None
        data = sec.data()
        end = data.find(b"\0")
        if end <= 0:
            return None
        return os.fsdecode(data[:end]), data, end

    def _read_debuglink(self) -> tuple[str, int] | None:
        link = self._link(".gnu_debuglink")
        if link is None:
            return None
        name, data, end = link
        crc_off = (end + 4) & ~3
        if crc_off + 4 > len(data):
            return None
        (crc,) = struct.unpack_from(self.endian + "I", data, crc_off)
        return name, crc

    def read_altlink(self) -> tuple[str, bytes] | None:
        link = self._link(".gnu_debugaltlink")
        if link is None:
            return None
        name, data, end = link
        return name, bytes(data[end + 1 :])


def file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                return crc & 0xFFFFFFFF
            crc = zlib.crc32(chunk, crc)
