"""Issue 21 items 2 and 9: bytes from a trace (argv, paths, symbols) are data. On every text
path they are escaped by one function (units.printable: control characters and bytes that are
not UTF-8 as \\xNN); on every binary path (JSON, HTML, pprof, Perfetto) they are encoded
losslessly, with no lone surrogate a strict reader refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.paths import REPO

ESC = "\x1b"
BAD = b"\xff\x1b[31mRED"  # not UTF-8, and a terminal colour


def _strict_json(text: str):
    # a strict reader: lone surrogates are not Unicode scalar values
    text.encode("utf-8")  # raises on a lone surrogate
    return json.loads(text)


@pytest.fixture
def evil_hold(sim, tmp_path):
    """hold with its allocating function renamed to ESC[31malloc (symtab, dynsym, DWARF)."""
    data = open(sim.progs["hold"], "rb").read()
    assert b"hold_alloc" in data
    p = tmp_path / "hold-evil"
    p.write_bytes(data.replace(b"hold_alloc", b"\x1b[31malloc"))
    p.chmod(0o755)
    return p


def test_non_utf8_argv_reaches_every_output(ct, sim, tmp_path):
    hold = os.fsencode(str(sim.progs["hold"]))
    out = tmp_path / "t"
    argv = [
        sys.executable.encode(), b"-m", b"cudatrace", b"run", b"-q", b"-o", os.fsencode(str(out)),
        b"--", b"sh", b"-c", hold + b" --exit-after-ms 1 1 1m; : \"$0\"", BAD,
    ]  # fmt: skip
    env = {os.fsencode(k): os.fsencode(v) for k, v in ct.env().items()}
    r = subprocess.run(argv, env=env, capture_output=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    # text: escaped
    rep = ct.cli("report", out)
    assert rep.returncode == 0, rep.stderr
    assert ESC not in rep.stdout and "\\xff\\x1b[31mRED" in rep.stdout, rep.stdout
    # JSON: strict, and the bytes kept as \\xNN
    js = ct.cli("report", out, "--json")
    doc = _strict_json(js.stdout)
    assert doc["command"][-1] == "\\xff\x1b[31mRED"
    # HTML and the binary exports: written, whole
    for args in (
        ["report", out, "--html", tmp_path / "r.html"],
        ["diff", out, out, "--html", tmp_path / "d.html"],
    ):
        x = ct.cli(*args)
        assert x.returncode == 0 and "Traceback" not in x.stderr, x.stderr
    assert "\\xff" in (tmp_path / "r.html").read_text(encoding="utf-8")
    for fmt in ("pprof", "perfetto", "speedscope", "memory-viz", "folded"):
        x = ct.cli("export", out, "--format", fmt, "-o", tmp_path / f"x.{fmt}")
        assert x.returncode == 0 and "Traceback" not in x.stderr, (fmt, x.stderr)
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("*.tmp"))


def test_symbol_names_never_drive_the_terminal(ct, sim, evil_hold, tmp_path):
    # hold-evil keeps hold's build-id, the symbol cache's key: a cache of its own
    env = ct.env()
    env["CUDATRACE_CACHE"] = str(tmp_path / "symcache")
    # a denial names the function: the shim's line, the launcher's attributed line, --tree
    r = ct.run([evil_hold, "--exit-after-ms", "1", "2", "1m"], "--budget", "1536KiB", env=env)
    assert "budget exceeded" in r.stderr and "denied" in r.stderr, r.stderr
    assert ESC not in r.stderr, r.stderr
    assert "\\x1b[31malloc" in r.stderr, r.stderr
    for args in (["report", r.out, "--tree"], ["report", r.out]):
        x = ct.cli(*args, env=env)
        assert x.returncode == 0, x.stderr
        assert ESC not in x.stdout and "\\x1b[31malloc" in x.stdout, x.stdout
