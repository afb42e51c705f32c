"""Sealed traces on disks that fill up and on tmpfs (record/seal.py, analyze/read/unseal.py):

- a sidecar entry is punched out of the trace only once it is whole, synced and read back: on a
  nearly full disk, or with writes cut short, the chunk stays in the trace and nothing is lost;
- reading never faults a punched hole: on tmpfs the holes stay holes (the trace takes no more
  room after `run`'s summary and `report` than before), and a full tmpfs is no SIGBUS.

The tmpfs tests mount their own (root: CI runs as root; elsewhere skipped, support/tmpfs.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from cudatrace import sidecar
from support import children, tmpfs
from support.cli import cudatrace

MiB = 1 << 20
CHUNK = 2 * MiB

# the events read back, in a child (a reader that faults a hole of a full tmpfs dies of SIGBUS)
READ = r"""
import json, sys
from cudatrace.analyze.read.trace import read_dir
t = read_dir(sys.argv[1]).traces[0]
print(json.dumps({"n": t.n_events, "status": t.status, "gaps": t.gaps, "lost": t.lost_chunks,
                  "end_events": t.end.events if t.end else None}))
"""


def _read(ct, out) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", READ, str(out)],
        env=ct.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    return json.loads(r.stdout)


def _sidecar_intact(trace) -> tuple[set[int], list, int]:
    fd = os.open(sidecar.path_of(trace), os.O_RDONLY)
    try:
        ents = sidecar.Entries(fd, CHUNK)
        chunks = {c for c, _raw, _off in ents}
        return chunks, ents.damaged, ents.torn
    finally:
        os.close(fd)


class Steps:
    """`cudatrace run -- steps` driven line by line (tests/progs/steps.c)."""

    def __init__(self, ct, sim, out, *opts):
        self.p = children.popen(
            [sys.executable, "-m", "cudatrace", "run", "-o", str(out), *opts, "--"]
            + [str(sim.progs["steps"])],
            env=ct.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert children.readline(self.p).strip() == "ready"

    def do(self, cmd: str) -> None:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        line = children.readline(self.p).strip()
        assert line == "ok", (cmd, line)

    def end(self) -> tuple[int, str]:
        _out, err = self.p.communicate("q\n", timeout=300)
        return self.p.returncode, err


def _wait_sealed(out, chunks: int, timeout: float = 60) -> None:
    """Until the launcher's sealer has compressed `chunks` chunks of the run's trace."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sides = list(out.glob("*.ctrace" + sidecar.SUFFIX))
        if sides and len(_sidecar_intact(sides[0].with_suffix(""))[0]) >= chunks:
            return
        time.sleep(0.2)
    raise AssertionError(f"the sealer did not compress {chunks} chunks in {timeout} s")


def test_full_disk_while_sealing_loses_nothing(ct, sim, tmp_path):
    # 2.4 M events (~16 MiB of trace, 8 chunks) written while the launcher is stopped (its
    # sealer with it); then the disk is filled to 128 KiB of free space, less than one sidecar
    # entry, and the launcher goes on: its sealer meets a full disk at its first entry
    with tmpfs.mounted(tmp_path / "disk", "64m") as d:
        out = d / "t"
        s = Steps(ct, sim, out)
        os.kill(s.p.pid, signal.SIGSTOP)
        try:
            s.do("n 1200000 4096")
            tmpfs.fill(d, leave=128 << 10)
        finally:
            os.kill(s.p.pid, signal.SIGCONT)
        time.sleep(3)  # a few passes of the sealer on the full disk
        trace = next(out.glob("*.ctrace"))
        chunks, damaged, torn = _sidecar_intact(trace)
        assert not damaged and not torn  # cut back to its last whole entry, each time
        rc, err = s.end()
        assert rc == 0, err
        got = _read(ct, out)
        # every event the program wrote reads back: no chunk was punched without its copy
        assert got["status"] == "complete" and got["gaps"] == 0 and not got["lost"], got
        assert got["n"] == got["end_events"] == 2 * 1200000, got
        chunks, damaged, torn = _sidecar_intact(trace)
        assert not damaged and not torn
        run = json.loads((out / "run.json").read_text())
        assert "No space left on device" in (run["sealed"]["error"] or ""), run["sealed"]
        # the report reads it whole, and says nothing is lost
        r = ct.cli("report", out)
        assert r.returncode == 0, r.stderr
        assert "Trace data lost" not in r.stdout


# writes to a sidecar (a file named *.ctrace.z) go through at most 4093 bytes a call, and every
# 100th such call fails with ENOSPC: preloaded into the launcher, whose sealer writes them
SHORT_WRITES = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static unsigned calls;

static int sidecar_fd(int fd)
{
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return 0;
    path[n] = 0;
    size_t l = (size_t)n, s = strlen(".ctrace.z");
    return l > s && strcmp(path + l - s, ".ctrace.z") == 0;
}

static int cut(int fd, size_t *n)
{
    if (!sidecar_fd(fd))
        return 0;
    /* three failures, early and apart: a pass meets them whatever the timing, and the
       passes after them have room again (a failure every N writes would fail every entry
       longer than N writes, and the chunks sealed would depend on the passes' timing) */
    ++calls;
    if (calls == 20 || calls == 21 || calls == 140) {
        errno = ENOSPC;
        return -1;
    }
    if (*n > 4093)
        *n = 4093;
    return 0;
}

ssize_t write(int fd, const void *b, size_t n)
{
    static ssize_t (*real)(int, const void *, size_t);
    if (!real)
        real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    return cut(fd, &n) < 0 ? -1 : real(fd, b, n);
}

#define PWRITE(NAME)                                                                 \
    ssize_t NAME(int fd, const void *b, size_t n, off_t o)                           \
    {                                                                                \
        static ssize_t (*real)(int, const void *, size_t, off_t);                    \
        if (!real)                                                                   \
            real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, #NAME); \
        return cut(fd, &n) < 0 ? -1 : real(fd, b, n, o);                             \
    }
PWRITE(pwrite)
PWRITE(pwrite64)
"""


def test_short_writes_to_the_sidecar_lose_nothing(ct, sim, tmp_path):
    src = tmp_path / "short_writes.c"
    src.write_text(SHORT_WRITES)
    lib = tmp_path / "libshort_writes.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib, src, "-ldl"], check=True)
    env = ct.env()
    env["LD_PRELOAD"] = str(lib)
    out = tmp_path / "t"
    r = cudatrace(env, "run", "-q", "-o", out, "--", sim.progs["threads"], 2, 600000, 4096)
    assert r.returncode == 0, r.stderr
    trace = next(out.glob("*.ctrace"))
    chunks, damaged, torn = _sidecar_intact(trace)
    # the sealer went on through the short counts and the failures: chunks were sealed, every
    # entry whole, none torn
    assert len(chunks) >= 3 and not damaged and not torn, (chunks, damaged, torn)
    # the failures were met (and said), not missed
    sealed = json.loads((out / "run.json").read_text())["sealed"]
    assert "No space left" in (sealed["error"] or ""), sealed
    got = _read(ct, out)
    assert got["status"] == "complete" and got["gaps"] == 0 and not got["lost"], got
    assert got["n"] == got["end_events"] == 2 * 2 * 600000, got


def test_reading_on_tmpfs_never_fills_holes_in(ct, sim, tmp_path):
    # ~10 MiB of trace, sealed whole at the end but for chunk 0: `run`'s summary and `report`
    # read it back without taking the punched room again
    with tmpfs.mounted(tmp_path / "shm", "64m") as d:
        r = ct.run([sim.progs["threads"], 2, 700000, 4096], out=d / "t")
        assert r.returncode == 0, r.stderr
        assert "peak" in r.stderr, r.stderr  # the summary read the trace
        trace = next((d / "t").glob("*.ctrace"))
        assert trace.stat().st_size > 4 * CHUNK
        assert tmpfs.blocks(trace) <= CHUNK + 64 * 1024, tmpfs.blocks(trace)
        before = tmpfs.used(d)
        rep = ct.cli("report", d / "t", "--json")
        assert rep.returncode == 0, rep.stderr
        assert tmpfs.used(d) <= before + 64 * 1024, (before, tmpfs.used(d))
        assert tmpfs.blocks(trace) <= CHUNK + 64 * 1024
        # a full tmpfs: reading needs no room (a fault on a hole would be SIGBUS)
        tmpfs.fill(d)
        rep = ct.cli("report", d / "t")
        assert rep.returncode == 0, (rep.returncode, rep.stderr)
        got = _read(ct, d / "t")
        assert got["status"] == "complete" and got["n"] == 2 * 2 * 700000, got


def test_run_summary_on_a_full_tmpfs(ct, sim, tmp_path):
    # chunks sealed (punched) while the program runs; the tmpfs is then filled and the program
    # exits: the launcher's summary reads the trace back without room to fault the holes in
    with tmpfs.mounted(tmp_path / "shm", "64m") as d:
        out = d / "t"
        s = Steps(ct, sim, out)
        s.do("a 1m")
        s.do("n 1200000 4096")
        _wait_sealed(out, 2)
        tmpfs.fill(d)
        rc, err = s.end()
        assert rc == 0, (rc, err)  # the program's status, not SIGBUS (135)
        assert "peak" in err and "1.00 MiB" in err, err
        got = _read(ct, out)
        assert got["status"] == "complete" and got["gaps"] == 0, got
        assert got["n"] == 1 + 2 * 1200000, got
