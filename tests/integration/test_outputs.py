"""Issue 21 items 1 and 11: an output path is written through (or refused), never replaced when
it is not a regular file we may replace (cudatrace/outputs.py, one helper for every output);
a full device is an error with a non-zero status, never "wrote X"."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest


@pytest.fixture(scope="module")
def traced(sim, tmp_path_factory):
    from conftest import CT

    base = tmp_path_factory.mktemp("outputs")
    ct = CT(sim, base)
    r = ct.run([sim.progs["hold"], "--exit-after-ms", "1", "1", "1m"], "-q")
    assert r.returncode == 0, r.stderr
    return ct, r.out


def _device(tmp_path, name, minor):
    """A character device node like /dev/null (minor 3) or /dev/full (minor 7), made here."""
    if os.geteuid() != 0:
        pytest.fail("device nodes need root (.ci/run runs as root)")
    p = tmp_path / name
    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    return p


def test_a_full_device_is_an_error_and_stays_a_device(traced, tmp_path):
    ct, out = traced
    full = _device(tmp_path, "full", 7)
    for args in (
        ["export", out, "--format", "pprof", "-o", full],
        ["report", out, "--html", full],
        ["report", out, "--svg", full],
        ["diff", out, out, "--html", full],
    ):
        r = ct.cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "No space left on device" in r.stderr and "wrote" not in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert stat.S_ISCHR(os.lstat(full).st_mode), "the device was replaced"
    assert not [p for p in tmp_path.iterdir() if p.name != "full"]  # no temporary left


def test_a_device_and_a_fifo_are_written_through(traced, tmp_path):
    ct, out = traced
    null = _device(tmp_path, "null", 3)
    r = ct.cli("export", out, "--format", "folded", "-o", null)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    r = ct.cli("export", out, "--format", "folded", "-o", fifo)
    reader.join(30)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert b"hold_alloc" in got[0]


def test_a_fifo_nobody_reads_is_an_error_not_a_wait(tmp_path, monkeypatch):
    # a FIFO is written through once a reader opens it, waiting FIFO_WAIT seconds for one:
    # never forever (pytest --cudatrace-json FIFO hung at the end of the session)
    from cudatrace import outputs

    monkeypatch.setattr(outputs, "FIFO_WAIT", 0.3)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    writer = threading.Thread(target=lambda: done.append(_try_write(outputs, fifo)), daemon=True)
    writer.start()
    writer.join(10)
    assert done == ["cannot write %s: no process opened the FIFO for reading within 0.3 s" % fifo]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name != "fifo"]  # no temporary left
    # a reader that comes a moment later still gets it all
    got = []
    late = threading.Timer(0.1, lambda: got.append(open(fifo, "rb").read()))
    late.start()
    assert _try_write(outputs, fifo) == "ok"
    late.join(10)
    assert got == [b"x" * 100000]


def _try_write(outputs, path):
    try:
        outputs.write_output(path, b"x" * 100000)
        return "ok"
    except outputs.OutputError as e:
        return str(e)


def test_dash_is_standard_output(traced, tmp_path):
    ct, out = traced
    r = ct.cli("export", out, "--format", "folded", "-o", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "hold_alloc" in r.stdout and not (tmp_path / "-").exists()


def test_a_symlink_is_refused_and_left_alone(traced, tmp_path):
    ct, out = traced
    target = tmp_path / "target"
    target.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    r = ct.cli("export", out, "--format", "folded", "-o", link)
    assert r.returncode == 2 and "symbolic link" in r.stderr, r.stderr
    assert link.is_symlink() and target.read_text() == "keep"


def test_a_regular_file_is_replaced_whole_keeping_its_mode(tmp_path):
    from cudatrace.outputs import OutputError, write_output

    p = tmp_path / "f"
    p.write_text("old")
    p.chmod(0o640)
    write_output(p, "new")
    assert p.read_text() == "new" and stat.S_IMODE(p.stat().st_mode) == 0o640
    with pytest.raises(OutputError, match="is a directory"):
        write_output(tmp_path, "x")


def test_report_to_a_full_stdout(traced, tmp_path):
    ct, out = traced
    full = _device(tmp_path, "full", 7)
    with open(full, "w") as f:
        r = subprocess.run(
            [sys.executable, "-m", "cudatrace", "report", str(out)],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            env=ct.env(),
        )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "No space left on device" in r.stderr, r.stderr
