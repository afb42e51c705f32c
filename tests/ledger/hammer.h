/* hammer.h - what the ledger's C harnesses share (ledger_test.c: processes of one user;
 * parts_test.c: several users, each a part of one group): CHECK, the clock, memory shared with
 * the children, and the hammer: threads reserving and releasing random sizes on two devices
 * against one budget, the true sum of what they hold counted beside the ledger's.
 *
 * A harness sets hl (the handle its threads use), h_total (every thread of the run, for the
 * start barrier), h_iters and h_late (no barrier: threads start while others reserve), puts hs
 * in shared memory, runs hammer_thread in its children, then hammer_verify(). */
#ifndef CT_TEST_HAMMER_H
#define CT_TEST_HAMMER_H

#include "ledger.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d (pid %d uid %u): %s: ", __FILE__, __LINE__, (int)getpid(), \
                    (unsigned)geteuid(), #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* n zeroed bytes shared with the children forked after */
static void *shared_mem(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    memset(p, 0, n);
    return p;
}

/* ---- the hammer ---------------------------------------------------------------------------- */

struct hammer {
    uint64_t cur[2], max[2]; /* the true sum of granted, unreleased bytes, and its maximum */
    uint64_t grants, denials, ready, errors;
};
static struct hammer *hs; /* shared with the children */
static ct_ledger *hl;
static int h_total, h_iters, h_late;
static const uint64_t hlimit[2] = {8 * MiB, 3 * MiB};

static void smax(uint64_t *p, uint64_t v)
{
    uint64_t c = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (c < v && !__atomic_compare_exchange_n(p, &c, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        ;
}

/* arg: a seed of the thread's own (nonzero) */
static void *hammer_thread(void *arg)
{
    uint64_t x = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + (uint64_t)getpid();
    uint64_t g = 0, d = 0;
    __atomic_fetch_add(&hs->ready, 1, __ATOMIC_SEQ_CST);
    while (!h_late && __atomic_load_n(&hs->ready, __ATOMIC_SEQ_CST) < (uint64_t)h_total)
        sched_yield(); /* (late: no barrier, threads arrive while the others reserve) */
    for (int i = 0; i < h_iters; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int dev = (int)(x & 1);
        uint64_t sz = 1 + (x >> 20) % (hlimit[dev] / 4);
        int r = ct_ledger_reserve(hl, dev, sz, NULL, NULL);
        if (r == CT_LEDGER_GRANTED) {
            g++;
            uint64_t c = __atomic_add_fetch(&hs->cur[dev], sz, __ATOMIC_SEQ_CST);
            smax(&hs->max[dev], c);
            /* hold it a while; yielding lets other threads (on few cores) pile up on the limit */
            if ((x >> 40) & 1)
                sched_yield();
            else
                for (volatile int k = 0; k < (int)((x >> 41) & 63); k++)
                    ;
            __atomic_sub_fetch(&hs->cur[dev], sz, __ATOMIC_SEQ_CST);
            if (ct_ledger_release(hl, dev, sz) != CT_LEDGER_GRANTED)
                __atomic_fetch_add(&hs->errors, 1, __ATOMIC_SEQ_CST);
        } else if (r == CT_LEDGER_DENIED) {
            d++;
        } else {
            __atomic_fetch_add(&hs->errors, 1, __ATOMIC_SEQ_CST);
        }
    }
    __atomic_fetch_add(&hs->grants, g, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&hs->denials, d, __ATOMIC_SEQ_CST);
    return NULL;
}

/* once every child is done: no error, never over the limit, and the limit was reached */
static void hammer_verify(void)
{
    CHECK(hs->errors == 0, "%llu errors", (unsigned long long)hs->errors);
    for (int d = 0; d < 2; d++) {
        CHECK(hs->max[d] <= hlimit[d], "dev %d: max concurrent %llu > limit %llu", d,
              (unsigned long long)hs->max[d], (unsigned long long)hlimit[d]);
        CHECK(hs->cur[d] == 0, "dev %d: %llu bytes still counted", d,
              (unsigned long long)hs->cur[d]);
    }
    CHECK(hs->grants > 0 && hs->denials > 0, "grants %llu denials %llu: no contention?",
          (unsigned long long)hs->grants, (unsigned long long)hs->denials);
}

#endif
