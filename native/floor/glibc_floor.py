"""The glibc floor of the preload library: built here with any gcc or clang, it loads on every
glibc from the floor on (2.17 by default, HAMi-core's and manylinux2014's), on x86-64 and aarch64.

A library links each C library function at the version this machine's glibc makes the default,
so a build on glibc 2.34 or later needs `pthread_once@GLIBC_2.34`, `dlvsym@GLIBC_2.34` ... and an
image with glibc 2.31 cannot load it: with it in /etc/ld.so.preload, no program of the image can
start. glibc keeps every older version of a function it re-versioned (the old pthread_once is
still there, as `pthread_once@GLIBC_2.2.5`), so the build binds each such function to the newest
version at or below the floor, which is the one a build on the floor's glibc would have made.

    glibc_floor.py --floor 2.17 header --cc CC SOURCE...   the header every source is built with
    glibc_floor.py --floor 2.17 libs --cc CC                 the libraries the link must name
    glibc_floor.py --floor 2.17 check LIBRARY                 fail if LIBRARY needs a newer glibc

header: one `.symver NAME, NAME@VERSION` per function of the C library CC links (its
libc.so.6, libdl.so.2, libpthread.so.0: `CC -print-file-name`, read with readelf) that glibc
moved into libc from libpthread and libdl (2.32, 2.34: same function, new default version) and
that has a version at or below the floor; a function the sources define themselves (their
exports: dlsym, dlclose) is left alone. It also turns off the C23 `strtol` family of glibc
2.38's headers (`__isoc23_strtol`, which exists from 2.38 only). Not bound, so the check names
them: functions re-versioned because they changed (glob 2.27, fmemopen 2.22, quick_exit 2.24:
the old version behaves as the old glibc did, which the headers here do not describe), those
moved from librt, libutil or libanl (the link names only libpthread and libdl), and functions
that exist only above the floor (stat, fstat, lstat: 2.33), which the library avoids
(floor/compat.c defines its own, through raw system calls).

libs: functions that glibc 2.34 moved into libc from libpthread and libdl were in those
libraries before: bound to their old versions, they are found there on an older glibc only if
the library names them (`-l:libpthread.so.0 -l:libdl.so.2`; on 2.34 and later they are empty).

check: the versions the built library needs (readelf -V), each at or below the floor, or the
build fails naming the functions. An empty floor (`make GLIBC_FLOOR=`) turns all three off: a
compiler that binds its own glibc version (zig -target x86_64-linux-gnu.2.17) needs none.

A compiler given a glibc version in its target (zig -target aarch64-linux-gnu.2.35) binds that
version itself: nothing is bound, nothing added to the link, and the check holds the library to
that version where it is above the floor (the build asked for it). A compiler whose libc.so.6
cannot be found gets no bindings either; the check still holds.
Python 3.9 or later, the standard library and binutils' readelf only (native/Makefile runs it).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

LIBS = ("libc.so.6", "libdl.so.2", "libpthread.so.0")
MERGED = ("libdl.so.2", "libpthread.so.0")  # moved into libc by glibc 2.32 and 2.34
MERGED_AT = (2, 34)
MOVES = {(2, 32), (2, 34)}  # the releases that moved them: a default of these is a move
# moved in 2.34 too, from the libraries the link does not name (librt, libutil, libanl,
# libresolv)
OTHER_HOMES = re.compile(
    r"^(__mq_open_2|aio_\w+|lio_\w+|mq_\w+|shm_\w+|timer_\w+|forkpty|openpty|login(_tty)?|"
    r"logout|logwtmp|gai_\w+|getaddrinfo_a|ns_\w+|res_\w+|__res_\w+|dn_\w+)$"
)
# "  42: 000...  21 FUNC GLOBAL DEFAULT  16 pthread_once@@GLIBC_2.34" (older binutils may
# add " (3)" after the version)
DYNSYM = re.compile(
    r"^\s*\d+:\s+([0-9a-fA-F]+)\s+\d+\s+(?:FUNC|IFUNC|OBJECT|TLS)\s+(?:GLOBAL|WEAK)\s+\S+\s+(\S+)\s+"
    r"([A-Za-z_][\w.$]*)@(@?)(GLIBC_[0-9][0-9.]*)"
)
NEEDS = re.compile(r"Name:\s+(GLIBC_[0-9][0-9.]*)")
UNDEF = re.compile(r"\sUND\s+([A-Za-z_][\w.$]*)@(GLIBC_[0-9][0-9.]*)")
# a function the sources define: a line beginning with its return type, or CT_EXPORT
DEFINES = re.compile(r"^(?:CT_\w+\s+)*[A-Za-z_][\w\s*]*?\b([A-Za-z_]\w*)\s*\(", re.M)
C23_OFF = """\
#include <features.h>
/* glibc 2.38's headers name strtol __isoc23_strtol (2.38 only) when C23 is on: not here */
#undef __GLIBC_USE_C2X_STRTOL
#define __GLIBC_USE_C2X_STRTOL 0
#undef __GLIBC_USE_C23_STRTOL
#define __GLIBC_USE_C23_STRTOL 0
"""


class FloorError(Exception):
    pass


def version(v: str) -> tuple[int, ...]:
    """GLIBC_2.2.5 -> (2, 2, 5); 2.17 -> (2, 17)."""
    return tuple(int(x) for x in v.rsplit("_", 1)[-1].split(".") if x)


def target_glibc(cc: str) -> tuple[int, ...] | None:
    """The glibc version a compiler's target names (zig: -target x86_64-linux-gnu.2.17)."""
    words = shlex.split(cc)
    for i, w in enumerate(words):
        value = words[i + 1] if w == "-target" and i + 1 < len(words) else None
        if w.startswith(("-target=", "--target=")):
            value = w.split("=", 1)[1]
        m = re.search(r"-gnu\w*\.(\d+\.\d+(?:\.\d+)?)$", value or "")
        if m:
            return version(m.group(1))
    return None


def find_lib(cc: str, name: str) -> Path | None:
    """The file the compiler links for name, or None (a compiler that does not say: zig)."""
    try:
        out = subprocess.run(
            [*shlex.split(cc), f"-print-file-name={name}"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return None
    return Path(out) if os.path.isabs(out) and os.path.isfile(out) else None


def readelf(readelf_cmd: str, *args: str) -> str:
    r = subprocess.run([*shlex.split(readelf_cmd), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise FloorError(f"{readelf_cmd} {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


Versions = dict[str, tuple[Optional[str], dict[str, str]]]


def symbol_versions(dynsyms: str) -> Versions:
    """{name: (default version or None, {version: address})} of a library's defined symbols,
    from `readelf -W --dyn-syms`."""
    out: Versions = {}
    for line in dynsyms.splitlines():
        m = DYNSYM.match(line)
        if not m or m.group(2) == "UND":
            continue
        addr, name, default, ver = m.group(1), m.group(3), m.group(4) == "@", m.group(5)
        old_default, versions = out.get(name, (None, {}))
        versions[ver] = addr
        out[name] = (ver if default else old_default, versions)
    return out


def bindings(libs: Versions, floor: tuple[int, ...], own: set[str]) -> dict[str, tuple[str, str]]:
    """{name: (the version to bind, its default)} for each symbol moved into libc from libpthread
    or libdl (its default version a move's) whose newest version at or below the floor is the
    same function (the same address), but those in own (the sources' own definitions)."""
    out = {}
    for name, (default, versions) in sorted(libs.items()):
        if default is None or version(default) <= floor or version(default) not in MOVES:
            continue
        if name in own or OTHER_HOMES.match(name):
            continue
        below = [v for v in versions if version(v) <= floor]
        if below and versions[max(below, key=version)] == versions[default]:
            out[name] = (max(below, key=version), default)
    return out


def defined_names(sources: list[str]) -> set[str]:
    """Functions the sources define (or declare) at the start of a line: the library's own
    dlsym, dlclose, _exit ... which must keep their names unversioned."""
    names: set[str] = set()
    for src in sources:
        names.update(DEFINES.findall(Path(src).read_text(errors="replace")))
    return names


def read_libs(cc: str, readelf_cmd: str) -> dict[str, Versions]:
    found = {name: find_lib(cc, name) for name in LIBS}
    return {
        name: symbol_versions(readelf(readelf_cmd, "-W", "--dyn-syms", str(path)))
        for name, path in found.items()
        if path is not None
    }


def header(cc: str, readelf_cmd: str, floor: tuple[int, ...], sources: list[str]) -> str:
    libs = {} if target_glibc(cc) else read_libs(cc, readelf_cmd)
    lines = [f"/* generated by native/floor/glibc_floor.py: glibc floor {fmt(floor)} */"]
    if not floor:
        return lines[0] + "\n"
    lines.append(C23_OFF)
    if target_glibc(cc):
        lines.append(f"/* {cc}: the compiler binds its target's glibc versions */")
        return "\n".join(lines) + "\n"
    if "libc.so.6" not in libs:
        lines.append(f"/* {cc}: no libc.so.6 found; versions are the compiler's own */")
        return "\n".join(lines) + "\n"
    merged: Versions = {}
    for syms in libs.values():  # libc's own first: a name's versions are those of one library
        for name, (default, versions) in syms.items():
            if name not in merged:
                merged[name] = (default, versions)
    own = defined_names(sources)
    for name, (ver, default) in bindings(merged, floor, own).items():
        lines.append(f'__asm__(".symver {name}, {name}@{ver}"); /* default {default} */')
    return "\n".join(lines) + "\n"


def link_libs(cc: str, readelf_cmd: str, floor: tuple[int, ...]) -> str:
    """-l:libpthread.so.0 -l:libdl.so.2 when the C library merged them (2.34 on) and the floor is
    older: the functions bound to their old versions live there on the floor's glibc."""
    if not floor or floor >= MERGED_AT or target_glibc(cc):
        return ""
    libc = find_lib(cc, "libc.so.6")
    if libc is None:
        return ""
    defaults = symbol_versions(readelf(readelf_cmd, "-W", "--dyn-syms", str(libc)))
    if not any(d and version(d) >= MERGED_AT for d, _ in defaults.values()):
        return ""  # an older glibc: -ldl -lpthread name them already
    names = [n for n in MERGED if find_lib(cc, n) is not None]
    if not names:
        return ""
    names_ = " ".join(f"-l:{n}" for n in names)
    return f"-Wl,--push-state,--no-as-needed {names_} -Wl,--pop-state"


def check(readelf_cmd: str, floor: tuple[int, ...], lib: str) -> list[str]:
    """The problems of lib: each glibc version it needs above the floor, with its functions."""
    if not floor:
        return []
    needs = set(NEEDS.findall(readelf(readelf_cmd, "-W", "-V", lib)))
    above = sorted((v for v in needs if version(v) > floor), key=version)
    if not above:
        return []
    users: dict[str, list[str]] = {}
    for name, ver in UNDEF.findall(readelf(readelf_cmd, "-W", "--dyn-syms", lib)):
        users.setdefault(ver, []).append(name)
    return [f"{v} ({', '.join(sorted(set(users.get(v, []))) or ['?'])})" for v in above]


def fmt(floor: tuple[int, ...]) -> str:
    return ".".join(map(str, floor)) or "none"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--floor", default="2.17", help="oldest glibc to load on; empty: none")
    p.add_argument("--readelf", default="readelf")
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("header")
    h.add_argument("--cc", required=True)
    h.add_argument("sources", nargs="*")
    lb = sub.add_parser("libs")
    lb.add_argument("--cc", required=True)
    c = sub.add_parser("check")
    c.add_argument(
        "--cc", default="", help="the compiler: a glibc version in its target is the floor"
    )
    c.add_argument("library")
    a = p.parse_args(argv)
    floor = version(a.floor) if a.floor.strip() else ()
    try:
        if a.cmd == "header":
            sys.stdout.write(header(a.cc, a.readelf, floor, a.sources))
        elif a.cmd == "libs":
            print(link_libs(a.cc, a.readelf, floor))
        else:
            target = target_glibc(a.cc)
            if floor and target and target > floor:
                floor = target  # the build asked its compiler for this glibc
            bad = check(a.readelf, floor, a.library)
            if bad:
                print(
                    f"native/floor: {a.library} needs glibc newer than its floor {fmt(floor)}: "
                    f"{'; '.join(bad)}. Images with an older glibc could not start any program "
                    "with it preloaded: avoid these functions (a raw syscall(), or a definition "
                    "in native/floor/compat.c), or build with GLIBC_FLOOR= for this machine only.",
                    file=sys.stderr,
                )
                return 1
    except FloorError as e:
        print(f"native/floor: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
