"""The preload library built against the glibc versions it must run on: a Jetson's (JetPack on
Ubuntu 22.04 and 24.04: glibc 2.35, 2.39) and the one Python wheels target (manylinux2014:
2.17), on aarch64 and x86-64.

Debian ships no sysroots of other glibc versions; zig (PyPI: ziglang) carries the symbol
versions of every glibc and links against them ("-target aarch64-linux-gnu.2.17"), so a build
there needs nothing newer than the target has. The 2.17 builds then run here (glibc 2.36;
aarch64 under qemu): what this checks is the build and the versions it binds, and that the
real dlsym is found at run time; running on an actual 2.17 / 2.35 / 2.39 system is not done
here (docs/aarch64.md).

The floor (native/floor/, docs/aarch64.md "The glibc floor"): the library `cudatrace cdi`
installs (gcc, this machine's glibc 2.36), the aarch64 cross-build (aarch64-linux-gnu-gcc) and
a build against Debian 13's glibc 2.41 (gcc --sysroot, mmdebstrap) need nothing newer than
GLIBC_2.17 (objdump -T). Running them on Debian 11: test_old_images.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_routes import traced_ops

from support import cross
from support.paths import REPO, TESTS  # noqa: F401
from support.shared_build import shared_build

TARGETS = [("aarch64", "2.17"), ("aarch64", "2.35"), ("aarch64", "2.39"), ("x86_64", "2.17")]
MACHINE = {"aarch64": "AArch64", "x86_64": "X86-64"}
BASE = {"aarch64": "GLIBC_2.17", "x86_64": "GLIBC_2.2.5"}


def _zig_ok() -> bool:
    try:
        return (
            subprocess.run(
                [sys.executable, "-m", "ziglang", "version"], capture_output=True, timeout=60
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    if not _zig_ok() or not shutil.which("readelf"):
        msg = "zig (pip install ziglang) or readelf missing: cannot build against other glibc versions"
        pytest.fail(msg + " (.ci/run installs them)")
    return {
        (arch, ver): Path(p)
        for (arch, ver), p in zip(TARGETS, shared_build(tmp_path_factory, "glibc", _build_targets))
    }


def _build_targets(work: Path) -> list[str]:
    """libcudatrace.so for each of TARGETS (zig, two at a time), as text, in TARGETS' order."""

    def one(t):
        arch, ver = t
        cc = f"{sys.executable} -m ziglang cc -target {arch}-linux-gnu.{ver}"
        r = subprocess.run(
            [str(REPO / "tools" / "cross-build-shim"), cc, str(work / (f"{arch}-{ver}"))],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, r.stderr
        return t, Path(r.stdout.strip())

    with ThreadPoolExecutor(2) as ex:
        return [str(p) for _, p in ex.map(one, TARGETS)]


def _version_key(v: str):
    return tuple(int(x) for x in v.split("_", 1)[1].split("."))


@pytest.mark.parametrize("arch,ver", TARGETS)
def test_build_needs_nothing_newer_than_its_glibc(builds, arch, ver):
    lib = builds[(arch, ver)]
    hdr = subprocess.run(["readelf", "-h", str(lib)], capture_output=True, text=True).stdout
    assert MACHINE[arch] in hdr
    needs = subprocess.run(
        ["readelf", "-V", "--wide", str(lib)], capture_output=True, text=True
    ).stdout
    versions = set(re.findall(r"Name: (GLIBC_[0-9.]+)", needs))
    assert versions and max(map(_version_key, versions)) <= _version_key("GLIBC_" + ver), versions
    syms = subprocess.run(
        ["readelf", "--dyn-syms", "--wide", str(lib)], capture_output=True, text=True
    ).stdout
    # dlvsym: libdl's base version before 2.34, libc's from 2.34 on
    want = BASE[arch] if ver < "2.34" else "GLIBC_2.34"
    assert re.search(rf"UND dlvsym@{re.escape(want)}\b", syms), syms
    assert re.search(r"\bFUNC +GLOBAL +DEFAULT +\d+ dlsym$", syms, re.M)  # the unversioned export


def test_2_17_builds_run_and_find_the_real_dlsym(builds, sim, tmp_path, tmp_path_factory):
    """x86-64 natively, aarch64 under qemu when it is installed (test_aarch64 requires it)."""
    runs = [("x86_64", [])] if os.uname().machine == "x86_64" else []
    qemu = shutil.which("qemu-aarch64")
    if qemu and Path("/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1").exists():
        runs.append(("aarch64", [qemu, "-L", "/usr/aarch64-linux-gnu"]))
    if not runs:
        pytest.fail("no way to run a 2.17 build here (x86-64, or qemu-aarch64 with its sysroot)")
    for arch, prefix in runs:
        out = tmp_path / arch
        out.mkdir()
        env = {
            "CUDATRACE_DIR": str(out),
            "LD_PRELOAD": str(builds[(arch, "2.17")]),
            "LD_BIND_NOW": "1",
        }
        if arch == "x86_64":
            env.update(sim.env())
            prog = sim.progs["route_dlsym"]
            cmd = [str(prog)]
            full_env = dict(os.environ, **env)
        else:
            _, paths = cross.aarch64(tmp_path_factory)  # the aarch64 suite's, built once
            env["LD_LIBRARY_PATH"] = str(paths["libdir"])
            cmd = (
                prefix
                + [a for k, v in env.items() for a in ("-E", f"{k}={v}")]
                + [str(paths["route_dlsym"])]
            )
            full_env = dict(os.environ)
        r = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (arch, r.stderr[-3000:])
        t, got = traced_ops(out)
        assert t.arch == arch and got and all(e["stack"] for _, _, e in got)
        assert t.info.get("dlsym_version") == "GLIBC_2.34"  # this machine's glibc is 2.36


def test_real_dlsym_versions_are_tried_in_order_natively(sim, tmp_path):
    """A build whose list starts with versions this machine's dlsym does not have: the next
    ones are tried in order, and the trace names the one found (the base version: x86-64's
    GLIBC_2.2.5, aarch64's GLIBC_2.17)."""
    base = BASE.get(os.uname().machine)
    if base is None:
        pytest.fail("only x86-64 and aarch64 are known: add this machine's base dlsym version")
    versions = r"-DCT_DLSYM_VERSIONS=\"GLIBC_0.1\",\"GLIBC_2.17\",\"GLIBC_2.2.5\""
    r = subprocess.run(
        [
            str(REPO / "tools" / "cross-build-shim"),
            "cc",
            str(tmp_path / "shim"),
            "CFLAGS=-O2 -g " + versions,
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    out = tmp_path / "trace"
    out.mkdir()
    env = dict(os.environ, **sim.env(), CUDATRACE_DIR=str(out), LD_PRELOAD=r.stdout.strip())
    p = subprocess.run(
        [str(sim.progs["route_dlsym"])], env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    t, got = traced_ops(out)
    assert t.info.get("dlsym_version") == base and got


# ---- the floor: what every integration installs needs no glibc newer than 2.17 -------------

FLOOR = (2, 17)


def objdump_versions(objdump: str, lib: Path) -> dict[str, set[str]]:
    """{GLIBC_x: the functions bound to it} of `objdump -T lib`'s undefined symbols."""
    out = subprocess.run([objdump, "-T", str(lib)], capture_output=True, text=True, check=True)
    got: dict[str, set[str]] = {}
    for m in re.finditer(r"\*UND\*\s+\S+\s+\(?(GLIBC_[0-9.]+)\)?\s+(\S+)$", out.stdout, re.M):
        got.setdefault(m.group(1), set()).add(m.group(2))
    assert got, out.stdout
    return got


def above_floor(versions: dict[str, set[str]]) -> dict[str, set[str]]:
    return {v: s for v, s in versions.items() if _version_key(v) > FLOOR}


def test_the_library_cudatrace_cdi_installs_is_the_floor_build(tmp_path):
    """`cudatrace cdi` installs the package's own library (built at install with this machine's
    gcc, glibc 2.36): objdump -T shows nothing newer than GLIBC_2.17, the functions glibc 2.34
    moved into libc bound to libpthread's and libdl's old versions."""
    from cudatrace import native
    from support.cli import checkout_env, cudatrace

    r = cudatrace(
        checkout_env(), "cdi", "--budget", "1GiB", "--root", tmp_path / "root",
        "--state", tmp_path / "state", "--print",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    shims = tmp_path / "root" / "shim"
    lib = shims / os.readlink(shims / "current") / "libcudatrace.so"
    assert lib.read_bytes() == native.shim_path().read_bytes()
    got = objdump_versions("objdump", lib)
    assert not above_floor(got), above_floor(got)
    base = BASE[os.uname().machine]
    assert {"dlvsym", "pthread_once", "pthread_key_create"} <= got[base], got
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "[libpthread.so.0]" in needed and "[libdl.so.2]" in needed


def test_the_aarch64_cross_build_is_the_floor_build(tmp_path_factory):
    """tools/cross-build-shim aarch64-linux-gnu-gcc (Debian 12's arm64 glibc 2.36): what an
    aarch64 node builds at install needs nothing newer than aarch64's first glibc, 2.17."""
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump is None:
        pytest.fail("no aarch64-linux-gnu-objdump (binutils-aarch64-linux-gnu)")
    shim, _ = cross.aarch64(tmp_path_factory)
    got = objdump_versions(objdump, shim)
    assert set(got) == {"GLIBC_2.17"}, got  # aarch64's base version: nothing newer
    assert {"dlvsym", "pthread_once"} <= got["GLIBC_2.17"] and "stat" not in got["GLIBC_2.17"]


def test_built_on_a_newer_glibc_the_library_keeps_the_floor(tmp_path_factory, tmp_path):
    """Against Debian 13's glibc 2.41 (its headers, start files and libc: what `pip install`
    does on a newer machine than this one), the library still needs nothing newer than 2.17;
    2.41's headers would have bound strtol to __isoc23_strtol (2.38) but for the floor's
    header."""
    from support import debian_roots

    root = Path(debian_roots.trixie(tmp_path_factory)["root"])
    cc = debian_roots.sysroot_cc(root, "x86_64")
    libc = subprocess.run([*cc.split(), "-print-file-name=libc.so.6"], capture_output=True,
                          text=True).stdout.strip()  # fmt: skip
    assert libc.startswith(str(root)) and Path(libc).resolve().is_file(), libc
    r = subprocess.run(
        [str(REPO / "tools" / "cross-build-shim"), cc, str(tmp_path / "shim")],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = objdump_versions("objdump", Path(r.stdout.strip()))
    assert not above_floor(got), above_floor(got)
    assert "strtol" in got[BASE["x86_64"]]
    # the same strtol call without the floor's header: glibc 2.41's C23 name
    src = tmp_path / "s.c"
    src.write_text("#include <stdlib.h>\nlong f(const char *s) { return strtol(s, 0, 10); }\n")
    subprocess.run([*cc.split(), "-D_GNU_SOURCE", "-O2", "-c", str(src), "-o", str(tmp_path / "s.o")],
                   check=True)  # fmt: skip
    syms = subprocess.run(["nm", "-u", str(tmp_path / "s.o")], capture_output=True, text=True)
    assert "__isoc23_strtol" in syms.stdout, syms.stdout
