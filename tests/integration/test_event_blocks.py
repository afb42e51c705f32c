"""Event blocks (CEBLOCK, format version 3; issue 25): each thread fills a block of the file of
its own. A block some thread still holds must stay mapped however far the file has moved on,
and every event of every thread reads back, in its thread's order, at a few bytes an event."""

from __future__ import annotations

import subprocess

from cudatrace.analyze.read.trace import read_dir
from cudatrace.analyze.read.unseal import trace_bytes

# thread A takes a block (one pair) and waits; thread B writes ~12 MiB of trace (6 chunks: the
# writer unmaps chunks 4 behind the current one); then A writes into its old block again
IDLE_HOLDER = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuMemAllocAsync(CUdeviceptr *, size_t, void *);
int cuMemFreeAsync(CUdeviceptr, void *);
static pthread_barrier_t bar;
static long n_busy;
static int pair(size_t sz)
{
    CUdeviceptr p = 0;
    if (cuMemAllocAsync(&p, sz, 0))
        return 1;
    return cuMemFreeAsync(p, 0);
}
static void *holder(void *arg)
{
    (void)arg;
    if (pair(1000))
        exit(3);
    pthread_barrier_wait(&bar); /* B may start */
    pthread_barrier_wait(&bar); /* B is done */
    for (int i = 0; i < 50; i++)
        if (pair(1001 + i))
            exit(4);
    return NULL;
}
static void *busy(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&bar);
    for (long i = 0; i < n_busy; i++)
        if (pair(4096))
            exit(5);
    pthread_barrier_wait(&bar);
    return NULL;
}
int main(int argc, char **argv)
{
    n_busy = atol(argv[1]);
    cuInit(0);
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t a, b;
    pthread_create(&a, NULL, holder, NULL);
    pthread_create(&b, NULL, busy, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    puts("ok");
    return 0;
}
"""


def test_held_block_survives_chunks_moving_on(ct, sim, tmp_path):
    src = tmp_path / "idle_holder.c"
    src.write_text(IDLE_HOLDER)
    exe = tmp_path / "idle_holder"
    subprocess.run(
        ["cc", "-O2", "-pthread", "-o", str(exe), str(src), f"-L{sim.lib}", "-lcuda"], check=True
    )
    busy = 1_000_000
    r = ct.run([exe, busy], "--stack-depth", "0")
    assert r.returncode == 0, r.stderr  # a write into an unmapped chunk would be a SIGSEGV
    assert "ok" in r.stdout
    t = read_dir(r.out).traces[0]
    assert t.status == "complete" and t.bad_events == 0 and t.gaps == 0
    n = t.n_events
    assert n == 2 * (busy + 51)
    # the holder's sizes, in its order: its block's events all read back
    ev = t.raw_events
    sizes = [ev[i].size for i in range(n) if ev[i].op == 1 and ev[i].size != 4096]
    assert sizes == [1000] + [1001 + i for i in range(50)]
    # the trace moved well past the holder's first block (several chunks)
    assert t.size_bytes > 5 * 2 * 1024 * 1024
    # a few bytes an event: far below a record per event (16 bytes at least)
    data = trace_bytes(t.path)  # sealed chunks put back
    end = data.rindex(b"\xa3\xc7\x08\x00")
    assert end / n < 8
