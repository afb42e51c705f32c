"""A small ELF written byte by byte: an x86-64 executable (ET_EXEC, loaded at 0x400000) whose
.text holds one 0x100-byte function per name, listed in .symtab. The real symbolizer reads it
like a compiled program's symbol table (no DWARF: functions without file or line), and the bytes
are the same on every machine, unlike a program built by the local gcc: what golden outputs need.

    syms = write_elf(dir / "trainer", ["main", "setup", "load_weights"])
    syms["load_weights"]   # its address (st_value)
"""

from __future__ import annotations

import struct
from pathlib import Path

BASE = 0x400000  # vaddr of file offset 0 (one PT_LOAD from the start of the file)
TEXT_OFFSET = 0x1000
FUNC_SIZE = 0x100

_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB = 1, 2, 3
_SHF_ALLOC, _SHF_EXECINSTR = 0x2, 0x4
_STT_FUNC, _STB_GLOBAL = 2, 1


def _strtab(names: list[str]) -> tuple[bytes, dict[str, int]]:
    data = b"\0"
    offs = {}
    for n in names:
        offs[n] = len(data)
        data += n.encode() + b"\0"
    return data, offs


def write_elf(path: str | Path, functions: list[str]) -> dict[str, int]:
    """Write the ELF at path; returns function name -> address."""
    path = Path(path)
    text = b"\xcc" * (FUNC_SIZE * len(functions))  # int3: nothing runs it
    addrs = {f: BASE + TEXT_OFFSET + i * FUNC_SIZE for i, f in enumerate(functions)}
    strtab, name_off = _strtab(functions)
    symtab = bytes(24)  # the null symbol
    for f in functions:
        info = (_STB_GLOBAL << 4) | _STT_FUNC
        symtab += struct.pack("<IBBHQQ", name_off[f], info, 0, 1, addrs[f], FUNC_SIZE)
    shstrtab, sh_name = _strtab([".text", ".symtab", ".strtab", ".shstrtab"])

    # file: header, program header, (pad) .text at TEXT_OFFSET, .symtab, .strtab, .shstrtab,
    # then the section headers
    out = bytearray(TEXT_OFFSET)
    out += text
    sections = []  # (name, type, flags, addr, offset, size, link, info, align, entsize)
    sections.append((".text", _SHT_PROGBITS, _SHF_ALLOC | _SHF_EXECINSTR, BASE + TEXT_OFFSET,
                     TEXT_OFFSET, len(text), 0, 0, 16, 0))  # fmt: skip
    for name, typ, data, link, info, align, ent in (
        (".symtab", _SHT_SYMTAB, symtab, 3, 1, 8, 24),  # link: .strtab (section 3)
        (".strtab", _SHT_STRTAB, strtab, 0, 0, 1, 0),
        (".shstrtab", _SHT_STRTAB, shstrtab, 0, 0, 1, 0),
    ):
        while len(out) % align:
            out += b"\0"
        sections.append((name, typ, 0, 0, len(out), len(data), link, info, align, ent))
        out += data
    while len(out) % 8:
        out += b"\0"
    shoff = len(out)
    out += bytes(64)  # SHN_UNDEF
    for name, typ, flags, addr, off, size, link, info, align, ent in sections:
        out += struct.pack(
            "<IIQQQQIIQQ", sh_name[name], typ, flags, addr, off, size, link, info, align, ent
        )
    load_end = TEXT_OFFSET + len(text)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, SysV
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH",
        2,  # ET_EXEC
        62,  # EM_X86_64
        1,
        addrs[functions[-1]] if functions else BASE,  # e_entry: any function
        64,  # e_phoff
        shoff,
        0,
        64,  # e_ehsize
        56,  # e_phentsize
        1,  # e_phnum
        64,  # e_shentsize
        len(sections) + 1,
        len(sections),  # e_shstrndx: .shstrtab, the last
    )
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, BASE, BASE, load_end, load_end, 0x1000)  # PT_LOAD R+X
    out[0 : len(header)] = header
    out[64 : 64 + len(phdr)] = phdr
    path.write_bytes(bytes(out))
    return addrs
