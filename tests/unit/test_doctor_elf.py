"""record/doctor.py: what `doctor` reads of an ELF command. Sections named .dynamic, .dynsym or
.symtab that are not of their type (as in a debug-info file: objcopy --only-keep-debug leaves
them NOBITS) are not read as tags or symbols: the probe says what it found, never an
AttributeError."""

from __future__ import annotations

import os
import shutil
import struct
import sys

from elftools.elf.elffile import ELFFile

from cudatrace.record.doctor import _elf

SHT_NOBITS = 8
SHF_ALLOC = 0x2


def _debug_copy(src: str, dst: str) -> list[str]:
    """dst: a copy of the ELF src whose allocated sections are NOBITS, as in the debug-info file
    objcopy --only-keep-debug writes (section headers read here: pyelftools would check the
    links of the sections it makes). Returns the names made NOBITS."""
    shutil.copyfile(src, dst)
    with open(dst, "rb") as f:
        elf = ELFFile(f)
        end = "<" if elf.little_endian else ">"
        flags = "Q" if elf.elfclass == 64 else "I"
        shoff, size, n = elf["e_shoff"], elf["e_shentsize"], elf["e_shnum"]
        names = elf.get_section(elf["e_shstrndx"]).data()
        f.seek(shoff)
        table = f.read(size * n)
    made = []
    with open(dst, "r+b") as f:
        for i in range(n):
            name, _, flag = struct.unpack_from(end + "II" + flags, table, i * size)
            if flag & SHF_ALLOC:
                f.seek(shoff + i * size + 4)  # sh_type follows sh_name
                f.write(struct.pack(end + "I", SHT_NOBITS))
                made.append(names[name : names.index(b"\0", name)].decode())
    return made


def test_sections_not_of_their_type_are_not_read(tmp_path):
    path = str(tmp_path / "python.debug")
    made = _debug_copy(os.path.realpath(sys.executable), path)
    assert ".dynamic" in made and ".dynsym" in made
    out = _elf(path)
    assert out["kind"] == "elf"
    assert out["needed"] == []
