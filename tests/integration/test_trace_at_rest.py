"""A trace at rest is no larger than its records: the shim cuts its file at its END record
(native/shim/writer.c), the launcher cuts the file a killed process left (record/seal.py), and
every reader takes cut and uncut files alike. Cutting never hurts the program: threads that go
on allocating while it exits never write past the cut."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from cudatrace import native
from cudatrace.analyze.read.trace import read_trace
from support import children

KiB = 1 << 10
CHUNK = 2 << 20


def _one(out):
    traces = list(out.glob("*.ctrace"))
    assert len(traces) == 1, traces
    return traces[0]


def test_clean_exit_cuts_the_file(ct, sim, tmp_path):
    r = ct.run([sim.progs["hold"], "--exit-after-ms", "1", "1", "1m"])
    assert r.returncode == 0, r.stderr
    trace = _one(r.out)
    assert trace.stat().st_size < 64 * KiB  # it was 2 MiB (a chunk) whatever it held
    t = read_trace(trace)
    assert t.status == "complete" and t.n_events == 1
    # traced through the environment alone, without the launcher: the same
    d = tmp_path / "env"
    d.mkdir()
    env = ct.env()
    env.update(LD_PRELOAD=str(native.shim_path()), CUDATRACE_DIR=str(d))
    p = subprocess.run(
        [str(sim.progs["hold"]), "--exit-after-ms", "1", "1", "1m"], env=env, capture_output=True
    )
    assert p.returncode == 0, p.stderr
    trace = _one(d)
    assert trace.stat().st_size < 64 * KiB
    assert read_trace(trace).status == "complete"


def test_killed_process_file_cut_by_the_launcher(ct, sim, tmp_path):
    out = tmp_path / "t"
    p = children.popen(
        [sys.executable, "-m", "cudatrace", "run", "-q", "-o", str(out), "--"]
        + [str(sim.progs["hold"]), "2", "1m"],
        env=ct.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in children.lines(p):
            if line.strip() == "ready":
                break
        trace = _one(out)
        assert trace.stat().st_size == CHUNK  # the writer's chunk, while it runs
        os.kill(int(trace.name.split(".")[0]), signal.SIGKILL)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert trace.stat().st_size < 64 * KiB, trace.stat().st_size
    t = read_trace(trace)
    assert t.status == "truncated" and t.n_events == 2 and t.gaps == 0
    # a reader takes the uncut form alike (files written before, or left by a killed
    # launcher): the same events
    longer = tmp_path / "long" / trace.name
    longer.parent.mkdir()
    longer.write_bytes(trace.read_bytes())
    os.truncate(longer, CHUNK)
    t2 = read_trace(longer)
    assert (t2.status, t2.n_events, t2.gaps) == (t.status, t.n_events, t.gaps)


# threads allocate and free without pause while main exits: the shim writes END and cuts its
# file while they run; a write past the cut would be a SIGBUS (exit status 135)
RACE = r"""
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuMemAllocAsync(CUdeviceptr *, size_t, void *);
int cuMemFreeAsync(CUdeviceptr, void *);
static void *loop(void *arg)
{
    (void)arg;
    for (;;) {
        CUdeviceptr p;
        if (!cuMemAllocAsync(&p, 4096, 0))
            cuMemFreeAsync(p, 0);
    }
    return NULL;
}
int main(int argc, char **argv)
{
    cuInit(0);
    pthread_t t;
    for (int i = 0; i < 8; i++)
        pthread_create(&t, NULL, loop, NULL);
    usleep(atoi(argv[1]) * 1000);
    exit(0);
}
"""


def test_threads_writing_while_the_program_exits(ct, sim, tmp_path):
    src = tmp_path / "exit_race.c"
    src.write_text(RACE)
    exe = tmp_path / "exit_race"
    subprocess.run(
        ["cc", "-O2", "-pthread", "-o", str(exe), str(src), f"-L{sim.lib}", "-lcuda"], check=True
    )
    env = ct.env()
    cut = 0
    for i in range(12):
        d = tmp_path / f"run{i}"
        d.mkdir()
        env.update(LD_PRELOAD=str(native.shim_path()), CUDATRACE_DIR=str(d))
        t0 = time.monotonic()
        p = subprocess.run([str(exe), str(5 + 5 * i)], env=env, capture_output=True, timeout=60)
        assert p.returncode == 0, (i, p.returncode, p.stderr)
        assert time.monotonic() - t0 < 30
        t = read_trace(_one(d))
        assert t.status == "complete" and t.bad_events == 0, (i, t.describe())
        if t.size_bytes % CHUNK != 0 or t.size_bytes < CHUNK:
            cut += 1
        else:  # a writer stopped inside a reservation (a loaded machine): the file keeps its
            # size and what follows END is given back (writer.c cut_at_end): the tail is a hole
            assert _data_end(_one(d)) < t.size_bytes, (i, t.size_bytes)
    assert cut >= 9, cut  # most runs have no writer stopped inside a reservation at the end


def _data_end(path) -> int:
    """Where the file's last data ends (holes are not data)."""
    with open(path, "rb") as f:
        fd, end, p = f.fileno(), 0, 0
        while True:
            try:
                p = os.lseek(fd, p, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after p
                return end
            p = end = os.lseek(fd, p, os.SEEK_HOLE)
