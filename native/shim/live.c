/* live.c - per-device live bytes, peaks, counts and marks, kept for readers inside the process
 * (live_format.h). The hot path (inline in live.h: an allocation whose home slot is free, a
 * free found in its home slot) adds a few relaxed atomics: the row's live, the all-devices live,
 * an atomic max on both peaks and on each open mark's peaks, and one slot of the address table;
 * everything else comes here. Nothing here blocks: a reader (cudatrace_live) gets a pointer and
 * reads words. */
#include "live.h"

#include <string.h>
#include <sys/mman.h>

#include "trace_format.h"
#include "util.h"

#define TAB_SIZE (1u << CT_LIVE_TAB_BITS)
#define TAB_PROBES 4096
#define EMPTY CT_LIVE_EMPTY
#define TOMB CT_LIVE_TOMB
#define OWNER_HOST CT_LIVE_HOST
#define META_SIZE(m) ((m) & ((1ull << 48) - 1))
#define META_WHO(m) ((uint32_t)((m) >> 48) & 0xff)
#define META_SPACE(m) ((uint32_t)((m) >> 56))

struct ct_live_stats ct_live = {.version = CT_LIVE_VERSION};
struct ct_live_slot *ct_live_tab;

CT_EXPORT const struct ct_live_stats *cudatrace_live(void) { return &ct_live; }

void ct_live_start(void) { __atomic_store_n(&ct_live.active, 1, __ATOMIC_RELEASE); }

static struct ct_live_slot *table(void)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    void *m = mmap(NULL, sizeof(struct ct_live_slot) * TAB_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct ct_live_slot *expect = NULL;
    if (!__atomic_compare_exchange_n(&ct_live_tab, &expect, (struct ct_live_slot *)m, 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        munmap(m, sizeof(struct ct_live_slot) * TAB_SIZE); /* another thread mapped it first */
        return expect;
    }
    return (struct ct_live_slot *)m;
}

static int insert(uint64_t addr, uint32_t space, uint64_t size, uint32_t who)
{
    struct ct_live_slot *t = table();
    if (!t)
        return 0;
    uint32_t i = ct_live_hash(addr);
    for (int n = 0; n < TAB_PROBES; n++, i = (i + 1) & (TAB_SIZE - 1)) {
        uint64_t cur = __atomic_load_n(&t[i].addr, __ATOMIC_RELAXED);
        while (cur <= TOMB) {
            if (__atomic_compare_exchange_n(&t[i].addr, &cur, addr, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
                __atomic_store_n(&t[i].meta, CT_LIVE_META(size, who, space), __ATOMIC_RELEASE);
                return 1;
            }
        }
    }
    return 0;
}

static int take(uint64_t addr, uint32_t space, uint64_t *size, uint32_t *who)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE);
    if (!t || addr <= TOMB)
        return 0;
    uint32_t i = ct_live_hash(addr);
    for (int n = 0; n < TAB_PROBES; n++, i = (i + 1) & (TAB_SIZE - 1)) {
        uint64_t cur = __atomic_load_n(&t[i].addr, __ATOMIC_ACQUIRE);
        if (cur == EMPTY)
            return 0;
        if (cur != addr)
            continue;
        uint64_t m = __atomic_load_n(&t[i].meta, __ATOMIC_ACQUIRE);
        if (META_SPACE(m) != space)
            continue;
        *size = META_SIZE(m);
        *who = META_WHO(m);
        /* a second free of the same address racing this one: only one wins the slot */
        return __atomic_compare_exchange_n(&t[i].addr, &cur, TOMB, 0, __ATOMIC_ACQ_REL,
                                           __ATOMIC_RELAXED);
    }
    return 0;
}

static inline uint32_t row_of(int dev)
{
    return dev < 0 ? 0 : dev >= CT_LIVE_DEVICES ? CT_LIVE_DEVICES - 1 : (uint32_t)dev;
}

static inline uint32_t who_of(int kind, int dev)
{
    return kind == CT_KIND_HOST ? OWNER_HOST : dev < 0 ? 0 : dev >= 253 ? 254 : (uint32_t)dev + 1;
}

void ct_live_alloc_slow(int kind, int space, int dev, uint64_t addr, uint64_t size, int result)
{
    int host = kind == CT_KIND_HOST;
    struct ct_live_row *row = host ? &ct_live.host : &ct_live.dev[row_of(dev)];
    if (result != 0) {
        __atomic_add_fetch(&row->failures, 1, __ATOMIC_RELAXED);
        if (!host)
            __atomic_add_fetch(&ct_live.dev[CT_LIVE_ALL].failures, 1, __ATOMIC_RELAXED);
        return;
    }
    if (space == CT_SPACE_NONE || addr <= TOMB || size >= 1ull << 48)
        return;
    if (!insert(addr, (uint32_t)space, size, who_of(kind, dev))) {
        __atomic_add_fetch(&ct_live.untracked, 1, __ATOMIC_RELAXED);
        return;
    }
    if (!host) {
        ct_live_count_device(row_of(dev), size);
        return;
    }
    __atomic_add_fetch(&row->allocs, 1, __ATOMIC_RELAXED);
    uint64_t now = __atomic_add_fetch(&row->live, size, __ATOMIC_RELAXED);
    ct_live_amax(&row->peak, now);
}

int ct_live_free_slow(int space, uint64_t addr)
{
    uint64_t size = 0;
    uint32_t who = 0;
    if (!take(addr, (uint32_t)space, &size, &who))
        return CT_LIVE_UNKNOWN;
    int dev = who == OWNER_HOST ? -1 : (int)who - 1;
    struct ct_live_row *row = who == OWNER_HOST ? &ct_live.host : &ct_live.dev[row_of(dev)];
    __atomic_add_fetch(&row->frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&row->live, size, __ATOMIC_RELAXED);
    if (who != OWNER_HOST) {
        __atomic_add_fetch(&ct_live.dev[CT_LIVE_ALL].frees, 1, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&ct_live.dev[CT_LIVE_ALL].live, size, __ATOMIC_RELAXED);
    }
    return dev;
}

void ct_live_deny(int dev)
{
    __atomic_add_fetch(&ct_live.dev[row_of(dev)].denials, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ct_live.dev[CT_LIVE_ALL].denials, 1, __ATOMIC_RELAXED);
}

/* A mark's slot is claimed by setting its bit; its peaks start at zero and take what is live
 * right after, so an allocation seen by the mark is either in that reading or maxed in after. */
CT_EXPORT int cudatrace_live_mark_open(void)
{
    uint64_t m = __atomic_load_n(&ct_live.marks_open, __ATOMIC_ACQUIRE);
    int i;
    do {
        if (m == ~0ull)
            return -1;
        i = __builtin_ctzll(~m);
    } while (!__atomic_compare_exchange_n(&ct_live.marks_open, &m, m | (1ull << i), 1,
                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    struct ct_live_mark *k = &ct_live.marks[i];
    for (int r = 0; r < CT_LIVE_ROWS; r++)
        __atomic_store_n(&k->peak[r], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&k->opened_ns, ct_now_ns(), __ATOMIC_RELAXED);
    for (int r = 0; r < CT_LIVE_ROWS; r++) {
        uint64_t now = __atomic_load_n(&ct_live.dev[r].live, __ATOMIC_RELAXED);
        __atomic_store_n(&k->base[r], now, __ATOMIC_RELAXED);
        ct_live_amax(&k->peak[r], now);
    }
    return i;
}

CT_EXPORT void cudatrace_live_mark_close(int slot)
{
    if (slot < 0 || slot >= CT_LIVE_MARKS)
        return;
    __atomic_and_fetch(&ct_live.marks_open, ~(1ull << slot), __ATOMIC_ACQ_REL);
}

void ct_live_atfork_child(void)
{
    /* the forked child holds none of its parent's device memory (a CUDA context does not
     * survive fork); the table's pages are a private copy: dropped, mapped anew when used */
    struct ct_live_slot *t = ct_live_tab;
    ct_live_tab = NULL;
    if (t)
        munmap(t, sizeof(struct ct_live_slot) * TAB_SIZE);
    uint32_t active = ct_live.active;
    memset(&ct_live, 0, sizeof ct_live);
    ct_live.version = CT_LIVE_VERSION;
    ct_live.active = active;
}
