"""The preload library's glibc floor: native/floor/glibc_floor.py (what the build binds, names
and checks) on readelf's text, and the install's side (cudatrace/deploy/install.py: a library
that needs a newer glibc is refused; LD_PRELOAD names it through $PLATFORM). The builds
themselves, and the library on older and newer glibc roots: tests/integration/
test_glibc_versions.py and test_old_images.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudatrace import native
from cudatrace.deploy import install
from support.cli import checkout_env, cudatrace
from support.paths import REPO

spec = importlib.util.spec_from_file_location("glibc_floor", REPO / "native/floor/glibc_floor.py")
assert spec and spec.loader
floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(floor)

# readelf -W --dyn-syms of a glibc 2.36 libc.so.6 (lines of it), and of an older binutils' kind
LIBC = """\
Symbol table '.dynsym' contains 3047 entries:
   Num:    Value          Size Type    Bind   Vis      Ndx Name
     0: 0000000000000000     0 NOTYPE  LOCAL  DEFAULT  UND
   204: 0000000000109530    76 FUNC    GLOBAL DEFAULT   16 __xstat@@GLIBC_2.2.5
   430: 00000000000cf420   106 FUNC    GLOBAL DEFAULT   16 clock_gettime@@GLIBC_2.17
   431: 00000000000cf420   106 FUNC    GLOBAL DEFAULT   16 clock_gettime@GLIBC_2.2.5
   553: 000000000008e120    21 FUNC    GLOBAL DEFAULT   16 pthread_once@GLIBC_2.2.5
   557: 000000000008e120    21 FUNC    GLOBAL DEFAULT   16 pthread_once@@GLIBC_2.34
   558: 000000000008e130    21 FUNC    GLOBAL DEFAULT   16 pthread_sigmask@GLIBC_2.2.5 (2)
   559: 000000000008e130    21 FUNC    GLOBAL DEFAULT   16 pthread_sigmask@@GLIBC_2.32 (40)
   669: 00000000000f77e0    18 FUNC    WEAK   DEFAULT   16 stat@@GLIBC_2.33
  2074: 00000000000855b0   185 FUNC    GLOBAL DEFAULT   16 dlsym@@GLIBC_2.34
  2075: 00000000000855b0   185 FUNC    GLOBAL DEFAULT   16 dlsym@GLIBC_2.2.5
  2100: 00000000000855b0   185 FUNC    GLOBAL DEFAULT   16 dlvsym@@GLIBC_2.34
  2101: 00000000000855b0   185 FUNC    GLOBAL DEFAULT   16 dlvsym@GLIBC_2.2.5
  2200: 0000000000085000    40 FUNC    GLOBAL DEFAULT   16 glob@GLIBC_2.2.5
  2201: 0000000000085100    40 FUNC    GLOBAL DEFAULT   16 glob@@GLIBC_2.27
  2300: 0000000000085200    40 FUNC    GLOBAL DEFAULT   16 shm_open@GLIBC_2.2.5
  2301: 0000000000085200    40 FUNC    GLOBAL DEFAULT   16 shm_open@@GLIBC_2.34
  2400: 0000000000085300    40 FUNC    GLOBAL DEFAULT   16 sem_wait@GLIBC_2.2.5
  2401: 0000000000085400    40 FUNC    GLOBAL DEFAULT   16 sem_wait@@GLIBC_2.34
  2725: 00000000000a2d70    40 FUNC    GLOBAL DEFAULT   16 memcpy@GLIBC_2.2.5
  2727: 000000000009be70   265 IFUNC   GLOBAL DEFAULT   16 memcpy@@GLIBC_2.14
  2800: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND _dl_x@GLIBC_PRIVATE
"""


def test_versions_are_read_with_their_default():
    syms = floor.symbol_versions(LIBC)
    same = "000000000008e120"
    assert syms["pthread_once"] == ("GLIBC_2.34", {"GLIBC_2.2.5": same, "GLIBC_2.34": same})
    assert syms["pthread_sigmask"][0] == "GLIBC_2.32"  # an older binutils' " (40)" after it
    assert syms["stat"] == ("GLIBC_2.33", {"GLIBC_2.33": "00000000000f77e0"})
    assert "_dl_x" not in syms  # undefined, and a private version
    assert floor.version("GLIBC_2.2.5") < floor.version("GLIBC_2.17") < floor.version("2.34")


def test_only_moved_functions_are_bound_to_their_version_at_the_floor():
    got = floor.bindings(floor.symbol_versions(LIBC), (2, 17), own={"dlsym"})
    assert got == {
        "dlvsym": ("GLIBC_2.2.5", "GLIBC_2.34"),
        "pthread_once": ("GLIBC_2.2.5", "GLIBC_2.34"),
        "pthread_sigmask": ("GLIBC_2.2.5", "GLIBC_2.32"),
    }
    # dlsym: the library defines it (its export); clock_gettime, memcpy: at the floor already;
    # stat: nothing at the floor; glob: changed, not moved; shm_open: moved from librt;
    # sem_wait: its old version is another function (another address)
    assert floor.bindings(floor.symbol_versions(LIBC), (2, 36), own=set()) == {}


def test_the_sources_own_functions_are_found():
    src = Path(__file__).with_name("own.c.txt")
    try:
        src.write_text(
            "CT_EXPORT CT_TAILCALLS CT_NO_SANITIZE void *dlsym(void *handle, const char *name)\n"
            "{\n    return pthread_once(&o, f) ? 0 : handle;\n}\n"
            "static int helper(int a,\n                  int b)\n"
        )
        assert floor.defined_names([str(src)]) == {"dlsym", "helper"}
    finally:
        src.unlink()


@pytest.mark.parametrize(
    "cc, want",
    [
        ("python3 -m ziglang cc -target aarch64-linux-gnu.2.35", (2, 35)),
        ("zig cc --target=x86_64-linux-gnu.2.17", (2, 17)),
        ("zig cc -target x86_64-linux-musl", None),
        ("aarch64-linux-gnu-gcc", None),
        ("gcc --sysroot=/x", None),
    ],
)
def test_a_compilers_own_glibc_version(cc, want):
    assert floor.target_glibc(cc) == want


def _cc(tmp_path: Path, name: str, code: str, *flags: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(code)
    out = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *flags], check=True)
    return out


NEW = """#include <pthread.h>
#include <sys/stat.h>
static pthread_once_t o = PTHREAD_ONCE_INIT;
static void f(void) {}
int g(const char *p) { struct stat s; pthread_once(&o, f); return stat(p, &s); }
"""


def test_the_check_names_what_a_library_needs_above_the_floor(tmp_path):
    """A library built here without the floor (glibc 2.36): pthread_once@GLIBC_2.34 and
    stat@GLIBC_2.33; with the header the build makes, the first is bound to its old version."""
    lib = _cc(tmp_path, "new", NEW)
    bad = floor.check("readelf", (2, 17), str(lib))
    assert bad == ["GLIBC_2.33 (stat)", "GLIBC_2.34 (pthread_once)"], bad
    hdr = tmp_path / "floor.h"
    hdr.write_text(floor.header("cc", "readelf", (2, 17), []))
    lib = _cc(tmp_path, "floored", NEW, "-include", str(hdr))
    assert floor.check("readelf", (2, 17), str(lib)) == ["GLIBC_2.33 (stat)"]
    r = subprocess.run(
        [sys.executable, str(REPO / "native/floor/glibc_floor.py"), "check", str(lib)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "GLIBC_2.33 (stat)" in r.stderr and "compat.c" in r.stderr


def test_the_glibc_floor_is_the_makefiles():
    assert install.glibc_floor() == "2.17"
    assert "GLIBC_FLOOR ?= 2.17" in (REPO / "native/Makefile").read_text()


def test_the_package_library_needs_no_glibc_above_the_floor():
    needs = install.glibc_needs(native.shim_path())
    key = floor.version
    assert key(max(needs, key=key)) <= (2, 17), needs
    assert "pthread_once" in needs[min(needs, key=key)]  # its base version, not 2.34's
    install.check_floor(native.shim_path())


def test_a_library_needing_a_newer_glibc_is_never_installed(tmp_path):
    lib = _cc(tmp_path, "new", NEW)
    with pytest.raises(install.InstallError) as e:
        install.install(tmp_path / "root", lib)
    assert "needs glibc 2.33 (stat); 2.34 (pthread_once)" in str(e.value)
    assert not (tmp_path / "root" / "shim").exists() or not install.installed(tmp_path / "root")
    # and the command line says so, installing nothing
    r = cudatrace(
        checkout_env(),
        "cdi", "--budget", "1GiB", "--root", tmp_path / "r", "--state", tmp_path / "s",
        "--cdi-dir", tmp_path / "cdi", "--shim", lib,
    )  # fmt: skip
    assert r.returncode != 0 and "needs glibc 2.33" in r.stderr, r.stderr
    assert not (tmp_path / "cdi").exists() or not list((tmp_path / "cdi").iterdir())


def test_ld_preload_names_the_library_through_platform(tmp_path):
    inst = install.install(tmp_path / "root", native.shim_path())
    assert inst.env_preload == f"{inst.dir}/platform/$PLATFORM/libcudatrace.so"
    for p in install.PLATFORMS:
        link = inst.dir / "platform" / p / "libcudatrace.so"
        assert os.readlink(link) == "../../libcudatrace.so" and link.resolve() == inst.lib
    # what glibc makes of it here (the kernel's AT_PLATFORM, or haswell/xeon_phi on Intel)
    probe = subprocess.run(
        ["cat", "/proc/self/maps"],
        env=dict(os.environ, LD_PRELOAD=inst.env_preload),
        capture_output=True,
        text=True,
    )
    assert str(inst.lib) in probe.stdout and "cannot be preloaded" not in probe.stderr
    # an install without its links is not whole: made again
    (inst.dir / "platform" / "haswell" / "libcudatrace.so").unlink()
    again = install.install(tmp_path / "root", native.shim_path())
    assert (again.dir / "platform" / "haswell" / "libcudatrace.so").resolve() == again.lib
