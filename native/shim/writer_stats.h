/* writer_stats.h - the stack counters of the file header, kept current in the mapped file.
 * Included by writer.c only (it needs the file descriptor): page 0 of the file is mapped on its
 * own, because chunk 0 is unmapped once the writer has moved on. Counts made before the file
 * exists wait in pending[] and are added when it opens (and again at close). */
#ifndef CUDATRACE_WRITER_STATS_H
#define CUDATRACE_WRITER_STATS_H

struct ct_file_header *ct_writer_stats_hdr; /* writer.h */
#define stats_hdr ct_writer_stats_hdr
static uint64_t stats_pending[4];

static uint64_t *stats_field(struct ct_file_header *h, int which)
{
    switch (which) {
    case CT_SC_FULL:
        return &h->stack_unwinds_full;
    case CT_SC_HIT:
        return &h->stack_cache_hits;
    case CT_SC_VERIFIED:
        return &h->stack_verified;
    default:
        return &h->stack_mismatches;
    }
}

static void ct_writer_stats_flush(void)
{
    struct ct_file_header *h = __atomic_load_n(&stats_hdr, __ATOMIC_ACQUIRE);
    if (!h)
        return;
    for (int i = 0; i < 4; i++) {
        uint64_t v = __atomic_exchange_n(&stats_pending[i], 0, __ATOMIC_ACQ_REL);
        if (v)
            __atomic_add_fetch(stats_field(h, i), v, __ATOMIC_RELAXED);
    }
}

/* with mu held, right after the header is filled */
static void ct_writer_stats_open(void)
{
    void *m = mmap(NULL, CT_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return;
    __atomic_store_n(&stats_hdr, (struct ct_file_header *)m, __ATOMIC_RELEASE);
    ct_writer_stats_flush();
}

static void ct_writer_stats_reset(void)
{
    if (stats_hdr)
        munmap(stats_hdr, CT_HEADER_SIZE);
    stats_hdr = NULL;
    memset(stats_pending, 0, sizeof stats_pending);
}

void ct_writer_stack_count(int which)
{
    struct ct_file_header *h = __atomic_load_n(&stats_hdr, __ATOMIC_ACQUIRE);
    if (h && __atomic_load_n(&ct_writer_state, __ATOMIC_RELAXED) == 1)
        __atomic_add_fetch(stats_field(h, which), 1, __ATOMIC_RELAXED);
    else
        __atomic_add_fetch(&stats_pending[which], 1, __ATOMIC_RELAXED);
}

#endif
