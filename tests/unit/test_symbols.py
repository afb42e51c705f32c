"""Tests for cudatrace.symbols: programs are built with gcc/g++ into tmp_path, print the runtime
addresses of call sites (return addresses captured with __builtin_return_address) and their load
bias (dl_iterate_phdr), and the symbolized frames are checked against marker comments in the
source and against binutils addr2line."""

import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cudatrace.symbols import (  # noqa: E402
    Frame,
    ModuleRef,
    Symbolizer,
    demangle,
    lines,  # noqa: E402
)
from cudatrace.symbols.dwarf import Dwarf  # noqa: E402
from cudatrace.symbols.elf import Elf  # noqa: E402
from cudatrace.symbols.progress import Progress  # noqa: E402
from cudatrace.symbols.symtab import SymTab  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("objcopy") is None, reason="needs gcc and binutils"
)

HELPERS = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <link.h>
#include <dlfcn.h>

struct find { unsigned long addr, bias; int found; };
static int find_cb(struct dl_phdr_info *info, size_t size, void *data) {
    struct find *f = (struct find *)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        unsigned long lo = info->dlpi_addr + ph->p_vaddr;
        if (f->addr >= lo && f->addr < lo + ph->p_memsz) { f->bias = info->dlpi_addr; f->found = 1; return 1; }
    }
    return 0;
}
static unsigned long bias_of(const void *addr) {
    struct find f = { (unsigned long)addr, 0, 0 };
    dl_iterate_phdr(find_cb, &f);
    return f.bias;
}
"""

C_PROG = (
    HELPERS
    + r"""
volatile int sink;
void *ret_addrs[8];

__attribute__((noinline)) void record(int i) { ret_addrs[i] = __builtin_return_address(0); sink++; }

static inline __attribute__((always_inline)) void inner(int n) {
    record(0); /* MARK:inner */
    sink += n;
}
static inline __attribute__((always_inline)) void mid(int n) {
    inner(n + 1); /* MARK:mid */
    sink += n;
}
__attribute__((noinline)) void outer(int n) {
    mid(n); /* MARK:outer */
    sink += n;
}
__attribute__((noinline)) void plain(void) {
    record(1); /* MARK:plain */
    sink++;
}
static __attribute__((noinline)) void hidden_static(void) {
    record(2); /* MARK:static */
    sink++;
}
#ifdef WITH_ASM
void asm_func(void);
__asm__(".text\n.globl asm_func\nasm_func:\n  sub $8, %rsp\n  mov $3, %edi\n  call record\n"
        "  add $8, %rsp\n  ret\n");
#endif
int main(int argc, char **argv) {
    outer(argc);
    plain();
    hidden_static();
#ifdef WITH_ASM
    asm_func();
#endif
    printf("bias %lx\n", bias_of((const void *)&record));
    for (int i = 0; i < 4; i++) printf("ret%d %lx\n", i, (unsigned long)ret_addrs[i]);
    return VARIANT;
}
"""
)

CXX_PROG = (
    HELPERS
    + r"""
volatile int sink;
void *ret_addrs[8];
extern "C" __attribute__((noinline)) void record(int i) { ret_addrs[i] = __builtin_return_address(0); sink++; }

namespace ns {
template <typename T> struct Box {
    __attribute__((noinline)) static void put(T v);
};
template <typename T> void Box<T>::put(T v) {
    record(0); /* MARK:box */
    sink += (int)v;
}
__attribute__((noinline)) void over(int x) {
    record(1); /* MARK:over_int */
    sink += x;
}
__attribute__((noinline)) void over(double x) {
    record(2); /* MARK:over_double */
    sink += (int)x;
}
}  // namespace ns

int main(int argc, char **argv) {
    ns::Box<long>::put(argc);
    ns::over(argc);
    ns::over(2.5 * argc);
    printf("bias %lx\n", bias_of((const void *)&record));
    for (int i = 0; i < 3; i++) printf("ret%d %lx\n", i, (unsigned long)ret_addrs[i]);
    return 0;
}
"""
)

LIB_SRC = (
    HELPERS
    + r"""
volatile int lib_sink;
void *lib_ret;
__attribute__((noinline)) void lib_record(void) { lib_ret = __builtin_return_address(0); lib_sink++; }
static inline __attribute__((always_inline)) void lib_inl(void) {
    lib_record(); /* MARK:lib_inl */
    lib_sink++;
}
__attribute__((noinline)) void lib_entry(void) {
    lib_inl(); /* MARK:lib_entry */
    lib_sink++;
}
void *lib_get_ret(void) { return lib_ret; }
unsigned long lib_bias(void) { return bias_of((const void *)&lib_entry); }
"""
)

LIB_MAIN = r"""
#include <stdio.h>
#include <dlfcn.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    ((void (*)(void))dlsym(h, "lib_entry"))();
    void *ret = ((void *(*)(void))dlsym(h, "lib_get_ret"))();
    unsigned long bias = ((unsigned long (*)(void))dlsym(h, "lib_bias"))();
    printf("bias %lx\nret0 %lx\n", bias, (unsigned long)ret);
    return 0;
}
"""


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def sh(*cmd, cwd=None):
    subprocess.run([str(c) for c in cmd], check=True, cwd=cwd, capture_output=True)


def markers(src: Path):
    out = {}
    for i, line in enumerate(src.read_text().splitlines(), 1):
        m = re.search(r"MARK:(\w+)", line)
        if m:
            out[m.group(1)] = i
    return out


def build(tmp, name, source, compiler="gcc", flags=(), suffix=".c"):
    src = tmp / (name + suffix)
    src.write_text(source)
    exe = tmp / name
    sh(compiler, *flags, "-Wl,--build-id", src, "-o", exe, "-ldl")
    return src, exe


def run_prog(exe, *args):
    out = subprocess.run(
        [str(exe)] + [str(a) for a in args], check=False, capture_output=True, text=True
    ).stdout
    vals = dict(line.split() for line in out.splitlines())
    return {k: int(v, 16) for k, v in vals.items()}


def build_id(path) -> bytes:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True).stdout
    m = re.search(r"Build ID:\s*([0-9a-f]+)", out)
    assert m, out
    return bytes.fromhex(m.group(1))


def addr2line(path, offset):
    out = subprocess.run(
        ["addr2line", "-f", "-i", "-C", "-e", str(path), hex(offset)],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    frames = []
    for fn, loc in zip(out[0::2], out[1::2]):
        f, _, ln = loc.rpartition(":")
        ln = ln.split()[0]
        frames.append(
            (
                None if fn == "??" else fn,
                None if f == "??" else f,
                int(ln) if ln.isdigit() and int(ln) else None,
            )
        )
    return frames


def triples(frames):
    return [(f.function, f.file, f.line) for f in frames]


def sym1(sym, path, bid, bias, addr):
    res = sym.symbolize(ModuleRef(str(path), bid, bias), [addr])
    assert list(res) == [addr]
    frames = res[addr]
    for f in frames:
        assert isinstance(f, Frame)
        assert f.address == addr and f.offset == addr - bias and f.module == str(path)
    return frames


C_CONFIGS = [
    ("O0-dwarf5-pie", ["-O0", "-g", "-gdwarf-5", "-fPIE", "-pie"]),
    ("O2-dwarf5-pie", ["-O2", "-g", "-gdwarf-5", "-fPIE", "-pie"]),
    ("O2-dwarf4-pie", ["-O2", "-g", "-gdwarf-4", "-fPIE", "-pie"]),
    ("O0-dwarf4-nopie", ["-O0", "-g", "-gdwarf-4", "-fno-PIE", "-no-pie"]),
    ("O2-dwarf5-nopie", ["-O2", "-g", "-gdwarf-5", "-fno-PIE", "-no-pie"]),
]


@pytest.fixture(scope="module")
def cprogs(tmp_path_factory):
    """The C program built in each configuration: name -> (src, exe, run output)."""
    tmp = tmp_path_factory.mktemp("cprogs")
    out = {}
    for name, flags in C_CONFIGS:
        src, exe = build(
            tmp, "prog_" + name.replace("-", "_"), C_PROG, flags=flags + ["-DVARIANT=0"]
        )
        out[name] = (src, exe, run_prog(exe))
    return out


def check_c_frames(sym, src, exe, vals, bid):
    m = markers(src)
    bias = vals["bias"]
    # ret0: record() called from inner(), inlined into mid(), inlined into outer()
    f0 = sym1(sym, exe, bid, bias, vals["ret0"] - 1)
    assert triples(f0) == [
        ("inner", str(src), m["inner"]),
        ("mid", str(src), m["mid"]),
        ("outer", str(src), m["outer"]),
    ]
    assert [f.inlined for f in f0] == [True, True, False]
    f1 = sym1(sym, exe, bid, bias, vals["ret1"] - 1)
    assert triples(f1) == [("plain", str(src), m["plain"])]
    assert f1[0].inlined is False
    f2 = sym1(sym, exe, bid, bias, vals["ret2"] - 1)
    assert triples(f2) == [("hidden_static", str(src), m["static"])]
    return f0, f1, f2


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------


def test_demangle():
    assert demangle("_ZN2ns3BoxIlE3putEl") == "ns::Box<long>::put(long)"
    assert demangle("_ZN2ns4overEi") == "ns::over(int)"
    assert demangle("_ZN2ns4overEd") == "ns::over(double)"
    assert demangle("_Z3fooi.constprop.0") == "foo(int) [clone .constprop.0]"
    assert demangle("main") == "main"
    assert demangle("_Znot a name") == "_Znot a name"
    assert demangle("") == ""


@pytest.mark.parametrize("config", [c[0] for c in C_CONFIGS])
def test_c_program(cprogs, config):
    src, exe, vals = cprogs[config]
    if "nopie" in config:
        assert vals["bias"] == 0
    else:
        assert vals["bias"] != 0
    sym = Symbolizer(debug_dirs=())
    frames = check_c_frames(sym, src, exe, vals, build_id(exe))
    # Same answers as binutils addr2line.
    for fr in frames:
        assert triples(fr) == addr2line(exe, fr[0].offset)
    assert sym.warnings() == []


def test_c_program_build_id_none_and_batch(cprogs):
    src, exe, vals = cprogs["O2-dwarf5-pie"]
    sym = Symbolizer(debug_dirs=())
    bias = vals["bias"]
    addrs = [vals["ret0"] - 1, vals["ret1"] - 1, vals["ret2"] - 1, vals["ret1"] - 1]
    res = sym.symbolize(ModuleRef(str(exe), None, bias), addrs)
    assert sorted(res) == sorted(set(addrs))
    assert res[vals["ret1"] - 1][0].function == "plain"
    assert len(res[vals["ret0"] - 1]) == 3
    assert sym.symbolize(ModuleRef(str(exe), None, bias), []) == {}


def test_without_g(tmp_path):
    src, exe = build(tmp_path, "nog", C_PROG, flags=["-O2", "-DVARIANT=0"])
    vals = run_prog(exe)
    sym = Symbolizer(debug_dirs=())
    bias, bid = vals["bias"], build_id(exe)
    f1 = sym1(sym, exe, bid, bias, vals["ret1"] - 1)
    assert triples(f1) == [("plain", None, None)]
    f0 = sym1(sym, exe, bid, bias, vals["ret0"] - 1)
    assert triples(f0) == [("outer", None, None)]
    f2 = sym1(sym, exe, bid, bias, vals["ret2"] - 1)
    assert triples(f2) == [("hidden_static", None, None)]
    assert any("no debug info" in w for w in sym.warnings())


def test_stripped(tmp_path):
    # -rdynamic exports the global functions in .dynsym, which survives strip.
    src, exe = build(tmp_path, "stripped", C_PROG, flags=["-O2", "-g", "-rdynamic", "-DVARIANT=0"])
    sh("strip", exe)
    vals = run_prog(exe)
    sym = Symbolizer(debug_dirs=())
    bias, bid = vals["bias"], build_id(exe)
    assert triples(sym1(sym, exe, bid, bias, vals["ret1"] - 1)) == [("plain", None, None)]
    assert triples(sym1(sym, exe, bid, bias, vals["ret0"] - 1)) == [("outer", None, None)]
    # A static function is not in .dynsym: unknown, not attributed to a neighbour.
    assert triples(sym1(sym, exe, bid, bias, vals["ret2"] - 1)) == [(None, None, None)]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 assembly")
def test_size_zero_symbol_nearest_preceding(tmp_path):
    src, exe = build(tmp_path, "asm", C_PROG, flags=["-O2", "-DWITH_ASM", "-DVARIANT=0"])
    vals = run_prog(exe)
    sym = Symbolizer(debug_dirs=())
    f = sym1(sym, exe, build_id(exe), vals["bias"], vals["ret3"] - 1)
    assert f[0].function == "asm_func"


def test_cxx_demangled(tmp_path):
    assert shutil.which("g++"), "g++ is needed for the C++ demangling test"
    src, exe = build(tmp_path, "cxx", CXX_PROG, compiler="g++", flags=["-O2", "-g"], suffix=".cc")
    vals = run_prog(exe)
    m = markers(src)
    sym = Symbolizer(debug_dirs=())
    bias, bid = vals["bias"], build_id(exe)
    got = [triples(sym1(sym, exe, bid, bias, vals["ret%d" % i] - 1)) for i in range(3)]
    assert got == [
        [("ns::Box<long>::put(long)", str(src), m["box"])],
        [("ns::over(int)", str(src), m["over_int"])],
        [("ns::over(double)", str(src), m["over_double"])],
    ]
    for i in range(3):
        assert got[i] == addr2line(exe, vals["ret%d" % i] - 1 - bias)


def test_shared_library_dlopen(tmp_path):
    lib = tmp_path / "libdemo.so"
    lsrc = tmp_path / "libdemo.c"
    lsrc.write_text(LIB_SRC)
    sh("gcc", "-O2", "-g", "-fPIC", "-shared", "-Wl,--build-id", lsrc, "-o", lib)
    _, exe = build(tmp_path, "dlmain", LIB_MAIN, flags=["-O2"])
    vals = run_prog(exe, lib)
    m = markers(lsrc)
    assert vals["bias"] != 0
    sym = Symbolizer(debug_dirs=())
    f = sym1(sym, lib, build_id(lib), vals["bias"], vals["ret0"] - 1)
    assert triples(f) == [
        ("lib_inl", str(lsrc), m["lib_inl"]),
        ("lib_entry", str(lsrc), m["lib_entry"]),
    ]
    assert [x.inlined for x in f] == [True, False]
    assert triples(f) == addr2line(lib, f[0].offset)
    # Stripped library: exported functions still resolve through .dynsym.
    slib = tmp_path / "libdemo_stripped.so"
    sh("strip", "-o", slib, lib)
    f = sym1(Symbolizer(debug_dirs=()), slib, build_id(lib), vals["bias"], vals["ret0"] - 1)
    assert triples(f) == [("lib_entry", None, None)]


def _split_debug(exe, debug):
    sh("objcopy", "--only-keep-debug", exe, debug)
    sh("strip", "--strip-all", exe)


def test_debug_file_by_build_id(tmp_path, cprogs):
    src, orig, vals = cprogs["O2-dwarf5-pie"]
    exe = tmp_path / "prog"
    shutil.copy(orig, exe)
    bid = build_id(exe)
    dbgdir = tmp_path / "debug"
    dest = dbgdir / ".build-id" / bid[:1].hex() / (bid[1:].hex() + ".debug")
    dest.parent.mkdir(parents=True)
    _split_debug(exe, dest)
    # Without the debug dir: nothing but (no) dynamic symbols.
    sym = Symbolizer(debug_dirs=(tmp_path / "nothing",))
    assert sym1(sym, exe, bid, vals["bias"], vals["ret1"] - 1)[0].file is None
    # With it: file:line, inlined frames and static functions are back.
    sym = Symbolizer(debug_dirs=(tmp_path / "nothing", dbgdir))
    check_c_frames(sym, src, exe, vals, bid)
    assert sym.warnings() == []
    # Recorded build-id None: the file's own build-id is used for the lookup.
    check_c_frames(Symbolizer(debug_dirs=(dbgdir,)), src, exe, vals, None)


@pytest.mark.parametrize("where", ["same_dir", "dot_debug", "debug_dir"])
def test_debug_file_by_debuglink(tmp_path, cprogs, where):
    src, orig, vals = cprogs["O2-dwarf4-pie"]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "prog"
    shutil.copy(orig, exe)
    debug = bindir / "prog.debug"
    _split_debug(exe, debug)
    sh("objcopy", "--add-gnu-debuglink=prog.debug", exe, cwd=bindir)
    dbgdir = tmp_path / "dbg"
    dbgdir.mkdir()
    if where == "dot_debug":
        (bindir / ".debug").mkdir()
        debug.rename(bindir / ".debug" / "prog.debug")
    elif where == "debug_dir":
        target = dbgdir / str(bindir).lstrip("/") / "prog.debug"
        target.parent.mkdir(parents=True)
        debug.rename(target)
    sym = Symbolizer(debug_dirs=(dbgdir,))
    check_c_frames(sym, src, exe, vals, build_id(exe))
    assert sym.warnings() == []


def test_debuglink_crc_mismatch(tmp_path, cprogs):
    src, orig, vals = cprogs["O2-dwarf5-pie"]
    exe = tmp_path / "prog"
    shutil.copy(orig, exe)
    debug = tmp_path / "prog.debug"
    _split_debug(exe, debug)
    sh("objcopy", "--add-gnu-debuglink=prog.debug", exe, cwd=tmp_path)
    with open(debug, "ab") as f:
        f.write(b"garbage")
    sym = Symbolizer(debug_dirs=())
    f = sym1(sym, exe, build_id(exe), vals["bias"], vals["ret1"] - 1)
    assert f[0].file is None
    assert any("CRC" in w for w in sym.warnings())


def test_build_id_mismatch(tmp_path):
    src_a, exe_a = build(tmp_path, "a", C_PROG, flags=["-O2", "-g", "-DVARIANT=0"])
    vals = run_prog(exe_a)
    bid_a = build_id(exe_a)
    # Rebuild the same path with different code: the trace's build-id no longer matches.
    debug_a = tmp_path / "a.debug"
    sh("objcopy", "--only-keep-debug", exe_a, debug_a)
    sh("gcc", "-O2", "-g", "-DVARIANT=1", "-Wl,--build-id", src_a, "-o", exe_a, "-ldl")
    bid_b = build_id(exe_a)
    assert bid_a != bid_b
    sym = Symbolizer(debug_dirs=())
    f = sym1(sym, exe_a, bid_a, vals["bias"], vals["ret1"] - 1)
    assert triples(f) == [(None, None, None)]
    assert f[0].offset == vals["ret1"] - 1 - vals["bias"]
    msg = f"build-id mismatch for {exe_a}: trace has {bid_a.hex()}, file has {bid_b.hex()}"
    assert msg in sym.warnings()
    # The right debug file, found by the recorded build-id, is used instead of the wrong binary.
    dbgdir = tmp_path / "dbg"
    dest = dbgdir / ".build-id" / bid_a[:1].hex() / (bid_a[1:].hex() + ".debug")
    dest.parent.mkdir(parents=True)
    shutil.copy(debug_a, dest)
    sym = Symbolizer(debug_dirs=(dbgdir,))
    check_c_frames(sym, src_a, exe_a, vals, bid_a)
    assert msg in sym.warnings()


def test_missing_file():
    sym = Symbolizer(debug_dirs=())
    res = sym.symbolize(
        ModuleRef("/nonexistent/libfoo.so", b"\x01\x02\x03\x04", 0x1000), [0x1234, 0x1500]
    )
    assert triples(res[0x1234]) == [(None, None, None)]
    assert res[0x1234][0].offset == 0x234
    assert any("/nonexistent/libfoo.so" in w and "not found" in w for w in sym.warnings())


def test_not_an_elf(tmp_path):
    p = tmp_path / "junk.so"
    p.write_bytes(b"this is not an ELF file" * 10)
    sym = Symbolizer(debug_dirs=())
    res = sym.symbolize(ModuleRef(str(p), None, 0), [0x10])
    assert triples(res[0x10]) == [(None, None, None)]
    assert sym.warnings()


def test_sysroot(tmp_path, cprogs):
    src, orig, vals = cprogs["O2-dwarf5-pie"]
    sysroot = tmp_path / "sysroot"
    recorded = "/opt/cudatrace-test-app/bin/prog"
    dest = sysroot / recorded.lstrip("/")
    dest.parent.mkdir(parents=True)
    shutil.copy(orig, dest)
    bid = build_id(orig)
    sym = Symbolizer(debug_dirs=(), sysroot=str(sysroot))
    res = sym.symbolize(ModuleRef(recorded, bid, vals["bias"]), [vals["ret1"] - 1])
    f = res[vals["ret1"] - 1]
    assert triples(f) == [("plain", str(src), markers(src)["plain"])]
    assert f[0].module == recorded
    # Without the sysroot the recorded path does not exist.
    sym = Symbolizer(debug_dirs=())
    assert (
        sym.symbolize(ModuleRef(recorded, bid, vals["bias"]), [vals["ret1"] - 1])[vals["ret1"] - 1][
            0
        ].function
        is None
    )


def test_no_aranges(tmp_path, cprogs):
    src, orig, vals = cprogs["O2-dwarf5-pie"]
    exe = tmp_path / "prog"
    sh("objcopy", "--remove-section=.debug_aranges", orig, exe)
    check_c_frames(Symbolizer(debug_dirs=()), src, exe, vals, build_id(exe))


def test_disk_cache(tmp_path, cprogs, monkeypatch):
    src, exe, vals = cprogs["O2-dwarf5-pie"]
    cache = tmp_path / "cache"
    bid = build_id(exe)
    sym = Symbolizer(cache_dir=cache, debug_dirs=())
    first = check_c_frames(sym, src, exe, vals, bid)
    path = cache / (bid.hex() + ".json")
    assert path.is_file()
    data = json.loads(path.read_text())
    assert str(vals["ret1"] - 1 - vals["bias"]) in data["frames"]

    def boom(*a, **k):
        raise AssertionError("cache not used")

    monkeypatch.setattr(lines, "lines_for", boom)
    monkeypatch.setattr(SymTab, "build", boom)
    sym = Symbolizer(cache_dir=cache, debug_dirs=())
    again = check_c_frames(sym, src, exe, vals, bid)
    assert again == first
    # A corrupt cache file is ignored (and rebuilt).
    monkeypatch.undo()
    path.write_text("{not json")
    check_c_frames(Symbolizer(cache_dir=cache, debug_dirs=()), src, exe, vals, bid)
    assert json.loads(path.read_text())["frames"]


def test_progress_bar(cprogs, capsys, monkeypatch):
    src, exe, vals = cprogs["O2-dwarf5-pie"]
    monkeypatch.setattr(Progress, "delay", 0.0)
    sym = Symbolizer(debug_dirs=(), progress=True)
    sym.symbolize(ModuleRef(str(exe), None, vals["bias"]), [vals["ret1"] - 1])
    err = capsys.readouterr().err
    assert "symbolizing" in err and "100%" in err
    # Quiet when not asked for, or when the work is quick.
    monkeypatch.setattr(Progress, "delay", 1.0)
    Symbolizer(debug_dirs=(), progress=True).symbolize(
        ModuleRef(str(exe), None, vals["bias"]), [vals["ret1"] - 1]
    )
    assert capsys.readouterr().err == ""


def test_addresses_outside_module(cprogs):
    src, exe, vals = cprogs["O2-dwarf5-pie"]
    sym = Symbolizer(debug_dirs=())
    bias = vals["bias"]
    res = sym.symbolize(ModuleRef(str(exe), None, bias), [bias - 16, bias + (1 << 40), bias])
    for frames in res.values():
        assert len(frames) == 1 and frames[0].file is None


@pytest.mark.parametrize("config", ["O2-dwarf5-pie", "O2-dwarf4-pie"])
def test_line_header_matches_pyelftools(cprogs, config):
    """The hand-written line-program header parser resolves the same file names as pyelftools."""
    from elftools.elf.elffile import ELFFile

    src, exe, vals = cprogs[config]
    dw = Dwarf(Elf(str(exe)))
    with open(exe, "rb") as f:
        dwi = ELFFile(f).get_dwarf_info()
        checked = 0
        for cu in dwi.iter_CUs():
            lp = dwi.line_program_for_CU(cu)
            comp_dir = cu.get_top_DIE().attributes["DW_AT_comp_dir"].value.decode()
            ours = dw.cu_at(cu.cu_offset)
            assert ours.comp_dir == comp_dir
            h = lines.line_header(dw, ours)
            assert (h.version, h.line_base, h.line_range, h.opcode_base) == (
                lp["version"],
                lp["line_base"],
                lp["line_range"],
                lp["opcode_base"],
            )
            ft = lines.FileTable(dw, ours, h)
            dirs = [d.decode() for d in lp["include_directory"]]
            first = 0 if lp["version"] >= 5 else 1
            for i, e in enumerate(lp["file_entry"]):
                if lp["version"] >= 5:
                    d = dirs[e.dir_index]
                else:
                    d = comp_dir if e.dir_index == 0 else dirs[e.dir_index - 1]
                expect = os.path.join(comp_dir, d, e.name.decode())
                assert ft.path(i + first) == expect
                checked += 1
    assert checked >= 2


def test_file_descriptors_released(tmp_path, cprogs):
    """Only a few modules keep files open, however many are symbolized."""
    copies = []
    src, orig, vals = cprogs["O2-dwarf5-pie"]
    for i in range(8):
        p = tmp_path / ("copy%d" % i)
        shutil.copy(orig, p)
        copies.append(p)
    before = len(os.listdir("/proc/self/fd"))
    sym = Symbolizer(debug_dirs=())
    for p in copies:
        f = sym1(sym, p, None, vals["bias"], vals["ret1"] - 1)
        assert f[0].function == "plain"
    assert len(os.listdir("/proc/self/fd")) - before <= 2 * Symbolizer._MAX_LOADED
    # Evicted modules are reloaded transparently.
    assert sym1(sym, copies[0], None, vals["bias"], vals["ret2"] - 1)[0].function == "hidden_static"


def _system_libc():
    for p in (
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
    ):
        if os.path.isfile(p):
            bid = build_id(p)
            dbg = Path("/usr/lib/debug/.build-id") / bid[:1].hex() / (bid[1:].hex() + ".debug")
            if dbg.is_file():
                return p, bid, dbg
    return None


@pytest.mark.skipif(_system_libc() is None, reason="needs libc debug info (libc6-dbg) by build-id")
def test_system_libc_lines_and_inlining_match_addr2line():
    """A real distribution debug file (many CUs, .debug_aranges finer than line sequences):
    depth of inlining and line numbers agree with addr2line on a sample of addresses."""
    import random

    from elftools.elf.elffile import ELFFile

    lib, bid, dbg = _system_libc()
    with open(dbg, "rb") as f:
        elf = ELFFile(f)
        funcs = [
            (s["st_value"], s["st_size"])
            for s in elf.get_section_by_name(".symtab").iter_symbols()
            if s["st_info"]["type"] == "STT_FUNC" and s["st_size"] > 0
        ]
    rnd = random.Random(5)
    offsets = sorted({v + rnd.randrange(sz) for v, sz in rnd.sample(funcs, 300)})
    bias = 0x7F1200000000
    sym = Symbolizer()
    res = sym.symbolize(ModuleRef(lib, bid, bias), [o + bias for o in offsets])
    out = subprocess.run(
        ["addr2line", "-a", "-f", "-i", "-C", "-e", lib],
        input="\n".join(hex(o) for o in offsets),
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    theirs = {}
    cur = None
    i = 0
    while i < len(out):
        if (
            out[i].startswith("0x")
            and int(out[i], 16) in set(offsets)
            and (cur is None or theirs[cur])
        ):
            cur = int(out[i], 16)
            theirs[cur] = []
            i += 1
            continue
        ln = out[i + 1].rpartition(":")[2].split()[0]
        theirs[cur].append(int(ln) if ln.isdigit() and int(ln) else None)
        i += 2
    resolved = 0
    for o in offsets:
        ours = [f.line for f in res[o + bias]]
        assert ours == theirs[o], hex(o)
        resolved += ours[0] is not None
    assert resolved > len(offsets) // 2


SCOPED_PROG = r"""
#include <cstdlib>
namespace outer {
namespace {
__attribute__((noinline)) void *sink(size_t n) { return malloc(n); }
inline void *grow(size_t n) { return sink(n * 2); }
}  // namespace
struct Pool {
    static void *take(size_t n) { return grow(n + 1); }
};
}  // namespace outer
static void *local_helper(size_t n) { return outer::Pool::take(n); }
int main(int argc, char **) { return local_helper((size_t)argc) != nullptr; }
"""


def test_inlined_function_without_linkage_name_keeps_its_scopes(tmp_path):
    # GCC gives a function of internal linkage that it inlined everywhere no linkage name: its
    # name is qualified from the namespaces around its DIE, as the demangler writes the others
    assert shutil.which("g++"), "g++ is needed for the C++ test"
    _src, exe = build(tmp_path, "scoped", SCOPED_PROG, compiler="g++", flags=["-O2", "-g"],
                      suffix=".cc")  # fmt: skip
    text = subprocess.run(["nm", "-C", str(exe)], capture_output=True, text=True).stdout
    main = next(int(ln.split()[0], 16) for ln in text.splitlines() if ln.endswith(" main"))
    sym = Symbolizer(cache_dir=None, debug_dirs=())
    got = sym.symbolize(ModuleRef(str(exe), build_id(exe), 0), list(range(main, main + 64)))
    chains = {tuple(f.function for f in frames) for frames in got.values() if frames}
    want = ("outer::(anonymous namespace)::grow", "outer::Pool::take(unsigned long)",
            "local_helper", "main")  # fmt: skip
    assert want in chains, chains
    assert not any("grow" in chain for chain in chains), chains  # never the bare name
