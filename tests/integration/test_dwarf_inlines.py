"""The shim's DWARF reader (native/shim/dwarf.c, dwline.c): where a denial's line says "or a
function inlined into it" (docs/attribution.md), it must say so exactly where the offline
symbolizer (the reports) finds inlined code, and nowhere else: at -O0 never. Where it names the
code itself (no launcher, no hints), the calls inlined at an address and the file and line of
each must be the symbolizer's.

tests/progs/dwarf_inlines_cli.c and dwarf_frames_cli.c answer for addresses of one ELF file; each
answer is held to the symbolizer's frames at that address, over addresses spread through .text of a C++ program
built by GCC (DWARF 4 and 5, -O0 and -O2) and by clang (zig c++: DWARF 5's address and range
list indices). Compressed debug sections and a debug file elsewhere are "cannot tell"."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from cudatrace import __version__
from cudatrace.symbols import ModuleRef, Symbolizer
from support.paths import PROGS, REPO

SHIM = REPO / "native" / "shim"
SOURCE = PROGS / "attrib" / "trt_server.cpp"  # templates, CRTP, small helpers: much to inline


def compile_cli(out: Path, main: str, *modules: str) -> Path:
    """A test program over the shim's DWARF readers, under ASan and UBSan."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler: the suite needs one")
    exe = out / Path(main).stem
    r = subprocess.run(
        [cc, "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"]
        + ["-D_GNU_SOURCE", "-pthread", f"-I{SHIM}", f"-I{REPO / 'native' / 'include'}"]
        + [f'-DCT_SHIM_VERSION="{__version__}"']
        + ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-o", str(exe)]
        + [str(PROGS / main)]
        + [str(SHIM / m) for m in ("dwarf.c", "dwline.c", "util.c", *modules)]
        + ["-ldl"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return exe


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    exe = compile_cli(tmp_path_factory.mktemp("dwarf"), "dwarf_inlines_cli.c")

    def run(path: Path, addrs: list[int]) -> dict[int, int]:
        out = subprocess.run(
            [str(exe), str(path)],
            input="".join("%x\n" % a for a in addrs),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return {int(out[i], 16): int(out[i + 1]) for i in range(0, len(out), 2)}

    return run


def build(out: Path, compiler: list[str], *flags: str) -> Path:
    """SOURCE as a shared library. zig compiles only: its own link would first build libc++
    from source (40 s of CPU on a fresh cache); the DWARF is the compiler's, so the system's
    g++ links the object instead."""
    include = REPO / "native" / "include"
    linked = compiler == ["g++"]
    obj = out if linked else out.with_suffix(".o")
    r = subprocess.run(
        [*compiler, "-fPIC", "-shared" if linked else "-c", *flags, f"-I{include}"]
        + ["-o", str(obj), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    if not linked:
        r = subprocess.run(
            ["g++", "-shared", "-o", str(out), str(obj)], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
    return out


def text_addresses(path: Path, n: int = 300) -> list[int]:
    with open(path, "rb") as f:
        t = ELFFile(f).get_section_by_name(".text")
        lo, hi = t["sh_addr"], t["sh_addr"] + t["sh_size"]
    rnd = random.Random(path.name)
    return sorted({rnd.randrange(lo, hi) for _ in range(n)})


def symbolizer_inlined(path: Path, addrs: list[int]) -> dict[int, bool]:
    got = Symbolizer(cache_dir=None).symbolize(ModuleRef(str(path), None, 0), addrs) or {}
    return {a: len(got.get(a) or []) > 1 for a in addrs}


def zig() -> list[str]:
    r = subprocess.run([sys.executable, "-m", "ziglang", "version"], capture_output=True)
    if r.returncode != 0:
        pytest.fail("zig (pip install ziglang, in the test extra) is missing")
    return [sys.executable, "-m", "ziglang", "c++"]


BUILDS = {
    "gcc-O0-dwarf5": (["g++"], "-O0", "-gdwarf-5"),
    "gcc-O2-dwarf5": (["g++"], "-O2", "-gdwarf-5"),
    "gcc-O0-dwarf4": (["g++"], "-O0", "-gdwarf-4"),
    "gcc-O2-dwarf4": (["g++"], "-O2", "-gdwarf-4"),
    "clang-O2-dwarf5": (None, "-O2", "-gdwarf-5"),
    "clang-O2-dwarf4": (None, "-O2", "-gdwarf-4"),
}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_inlined_exactly_where_the_symbolizer_says(reader, tmp_path, name):
    compiler, opt, dwarf = BUILDS[name]
    lib = build(tmp_path / f"lib{name}.so", compiler or zig(), opt, dwarf)
    addrs = text_addresses(lib)
    mine = reader(lib, addrs)
    want = symbolizer_inlined(lib, addrs)
    wrong = [(hex(a), mine[a], want[a]) for a in addrs if mine[a] != int(want[a])]
    assert not wrong, wrong[:10]
    inlined = sum(want.values())
    assert (inlined == 0) == (opt == "-O0"), inlined


def test_what_cannot_be_told_is_said(reader, tmp_path):
    # compressed debug sections: the shim has no zlib
    z = build(tmp_path / "libz.so", ["g++"], "-O2", "-g", "-gz")
    assert set(reader(z, text_addresses(z, 20)).values()) == {-1}
    # the DWARF moved to a debug file the shim does not look for (a .gnu_debuglink)
    lib = build(tmp_path / "liblinked.so", ["g++"], "-O2", "-g")
    dbg = tmp_path / "liblinked.debug"
    for cmd in (
        ["objcopy", "--only-keep-debug", str(lib), str(dbg)],
        ["objcopy", "--strip-debug", f"--add-gnu-debuglink={dbg}", str(lib)],
    ):
        subprocess.run(cmd, check=True, capture_output=True)
    assert set(reader(lib, text_addresses(lib, 20)).values()) == {-1}
    # no DWARF at all: nothing is known to be inlined
    bare = build(tmp_path / "libbare.so", ["g++"], "-O2")
    assert set(reader(bare, text_addresses(bare, 20)).values()) == {0}
    # not a file, not an ELF file
    assert set(reader(tmp_path / "missing.so", [0x1000]).values()) == {0}
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF" + bytes(range(256)) * 8)
    assert set(reader(junk, [0x1000]).values()) == {0}


def test_damaged_dwarf_is_read_safely(reader, tmp_path):
    """Damaged debug sections (bytes overwritten, cut short) never crash the reader (built
    under ASan and UBSan) and give an answer of the three."""
    lib = build(tmp_path / "libok.so", ["g++"], "-O2", "-gdwarf-5")
    data = bytearray(lib.read_bytes())
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        spans = [
            (s["sh_offset"], s["sh_size"])
            for s in elf.iter_sections()
            if s.name in (".debug_info", ".debug_abbrev", ".debug_rnglists", ".debug_addr")
        ]
    addrs = text_addresses(lib, 40)
    rnd = random.Random(7)
    for i in range(40):
        bad = bytearray(data)
        off, size = spans[i % len(spans)]
        for _ in range(1 + i % 5):
            bad[off + rnd.randrange(size)] = rnd.randrange(256)
        if i % 8 == 7:  # the file ends inside the section
            bad = bad[: off + size // 2]
        p = tmp_path / f"lib{i}.so"
        p.write_bytes(bad)
        assert set(reader(p, addrs).values()) <= {-1, 0, 1}


# ---- the frames it names: inlined calls, files and lines --------------------------------------


@pytest.fixture(scope="module")
def frames_reader(tmp_path_factory):
    exe = compile_cli(tmp_path_factory.mktemp("dwframes"), "dwarf_frames_cli.c", "demangle.c")

    def run(path: Path, addrs: list[int]) -> dict[int, list[tuple[str, str, int]] | int]:
        out = subprocess.run(
            [str(exe), str(path)],
            input="".join("%x\n" % a for a in addrs),
            capture_output=True,
            text=True,
            errors="replace",  # names from damaged string sections
            check=True,
        ).stdout
        got: dict[int, list[tuple[str, str, int]] | int] = {}
        cur = 0
        for line in out.splitlines():
            if line.startswith("\t"):
                name, file, ln = line[1:].split("\t")
                frames = got[cur]
                assert isinstance(frames, list)
                frames.append((name, file, int(ln)))
            else:
                a, n = line.split()
                cur = int(a, 16)
                got[cur] = [] if int(n) >= 0 else -1
        return got

    return run


def symbolizer_frames(path: Path, addrs: list[int]) -> dict[int, list[tuple[str, str, int]]]:
    """The reports' frames at each address, as the shim's reader writes them: inlined calls by
    their short names, the concrete function as "-", each with its file's base name and line."""
    from cudatrace.analyze.sites.names import short_name

    got = Symbolizer(cache_dir=None).symbolize(ModuleRef(str(path), None, 0), addrs) or {}
    out = {}
    for a in addrs:
        fr = [
            (
                (short_name(f.function) or "-") if f.inlined else "-",
                os.path.basename(f.file) if f.file else "-",
                f.line or 0,
            )
            for f in got.get(a) or []
        ]
        out[a] = [] if fr == [("-", "-", 0)] else fr
    return out


def same_frame(mine: tuple[str, str, int], want: tuple[str, str, int]) -> bool:
    """One frame alike; a name the symbolizer's demangler left mangled (a newer libc++'s) the
    shim's own demangler may read."""
    return mine == want or (want[0].startswith("_Z") and mine[1:] == want[1:])


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_frames_and_lines_as_the_symbolizer_names_them(frames_reader, tmp_path, name):
    """Every inlined call at an address, innermost first, by the name the reports give it, and
    the file and line of each (the line table's row, then each call's call site), for GCC's
    DWARF 4 and 5 and clang's (address and string-offset indices), -O0 and -O2."""
    from cudatrace.analyze.sites.names import short_name

    compiler, opt, dwarf = BUILDS[name]
    lib = build(tmp_path / f"lib{name}.so", compiler or zig(), opt, dwarf)
    addrs = text_addresses(lib)
    mine = frames_reader(lib, addrs)
    want = symbolizer_frames(lib, addrs)
    wrong = []
    for a in addrs:
        got = mine[a]
        assert got != -1, hex(a)
        assert isinstance(got, list)
        got = [((short_name(n) or n) if n != "-" else "-", f, ln) for n, f, ln in got]
        if len(got) != len(want[a]) or not all(map(same_frame, got, want[a])):
            wrong.append((hex(a), got, want[a]))
    assert not wrong, wrong[:5]
    assert sum(1 for a in addrs if any(f[0] != "-" for f in want[a])) > 0 or opt == "-O0"
    assert sum(1 for a in addrs if want[a] and want[a][-1][2]) > len(addrs) // 2  # lines


def test_frames_where_nothing_can_be_told(frames_reader, tmp_path):
    z = build(tmp_path / "libz.so", ["g++"], "-O2", "-g", "-gz")
    assert set(map(str, frames_reader(z, text_addresses(z, 10)).values())) == {"-1"}
    bare = build(tmp_path / "libbare.so", ["g++"], "-O2")
    assert all(v == [] for v in frames_reader(bare, text_addresses(bare, 10)).values())


def test_damaged_line_tables_are_read_safely(frames_reader, tmp_path):
    """Damaged line programs, string sections and DIEs (bytes overwritten, the file cut short)
    never crash the reader (ASan, UBSan): an answer, or "cannot tell"."""
    for dwarf in ("-gdwarf-5", "-gdwarf-4"):
        lib = build(tmp_path / f"libok{dwarf}.so", ["g++"], "-O2", dwarf)
        data = bytearray(lib.read_bytes())
        with open(lib, "rb") as f:
            spans = [
                (s["sh_offset"], s["sh_size"])
                for s in ELFFile(f).iter_sections()
                if s.name
                in (".debug_line", ".debug_line_str", ".debug_str", ".debug_info", ".debug_abbrev")
            ]
        addrs = text_addresses(lib, 30)
        rnd = random.Random(dwarf)
        for i in range(40):
            bad = bytearray(data)
            off, size = spans[i % len(spans)]
            for _ in range(1 + i % 7):
                bad[off + rnd.randrange(size)] = rnd.randrange(256)
            if i % 8 == 7:  # the file ends inside the section
                bad = bad[: off + size // 2]
            p = tmp_path / f"lib{dwarf}{i}.so"
            p.write_bytes(bad)
            for v in frames_reader(p, addrs).values():
                assert v == -1 or (isinstance(v, list) and len(v) <= 16)
