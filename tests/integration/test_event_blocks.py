"""Event blocks (CEBLOCK, format version 3; RAWBLOCK, version 4; issues 25 and 42): each thread
fills a block of the file of its own. A block some thread still holds must stay mapped however
far the file has moved on, and every event of every thread reads back, in its thread's order,
within a raw record (24 bytes) an event."""

from __future__ import annotations

import subprocess

from cudatrace.analyze.read.rundir import read_dir
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
    # a raw record an event (24 bytes: issue 42 allows 32 without the launcher's sealing), and
    # once sealed by the launcher (compact, compressed) a few bytes an event on disk
    data = trace_bytes(t.path)  # sealed chunks put back
    end = data.rindex(b"\xa3\xc7\x08\x00")
    assert end / n < 25
    disk = sum(p.stat().st_blocks * 512 for p in r.out.glob("*.ctrace*"))
    assert disk / n < 4, disk / n


# the program counts its own page faults taken in user mode (perf_event_open, no perf tool)
# over N pairs after a warm-up that opened the trace
FAULT_PAIRS = r"""
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuMemAllocAsync(CUdeviceptr *, size_t, void *);
int cuMemFreeAsync(CUdeviceptr, void *);
static int pairs(long n)
{
    for (long i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        if (cuMemAllocAsync(&p, 1 << 20, 0) || cuMemFreeAsync(p, 0))
            return 1;
    }
    return 0;
}
int main(int argc, char **argv)
{
    long n = atol(argv[1]);
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_SOFTWARE;
    a.size = sizeof a;
    a.config = PERF_COUNT_SW_PAGE_FAULTS;
    a.disabled = 1;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    if (fd < 0) {
        perror("perf_event_open");
        return 2;
    }
    if (cuInit(0) || pairs(2000))
        return 3;
    ioctl(fd, PERF_EVENT_IOC_RESET, 0);
    ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
    int r = pairs(n);
    ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
    uint64_t faults = 0;
    if (r || read(fd, &faults, sizeof faults) != sizeof faults)
        return 4;
    printf("faults %llu\n", (unsigned long long)faults);
    return 0;
}
"""


def test_events_take_no_page_fault(ct, sim, tmp_path):
    """The trace's pages are present and writable before any event lands on them (writer.c's
    prefault): MAP_POPULATE maps a shared file's pages read-only on ext4 and xfs, and the shim
    of 2026-12-07 took a write fault on the caller's thread at every 4 KiB of trace (470 in
    40,000 pairs on ext4, where this test's folder is on this machine; tmpfs maps them
    writable, so there it passed before too)."""
    src = tmp_path / "fault_pairs.c"
    src.write_text(FAULT_PAIRS)
    exe = tmp_path / "fault_pairs"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src), f"-L{sim.lib}", "-lcuda"], check=True)
    pairs = 40_000  # ~1.9 MB of raw records: ~470 pages
    for opts in (["--stack-depth", "0"], []):
        r = ct.run([exe, pairs], *opts)
        assert r.returncode == 0, r.stderr
        faults = int(r.stdout.split("faults ")[1].split()[0])
        assert faults <= 40, (opts, faults)
        t = read_dir(r.out).traces[0]
        assert t.n_events == 2 * (pairs + 2000)
