/* live.c - per-device live bytes, peaks, counts and marks, kept for readers inside the process
 * (live_format.h). The hot path adds a few relaxed atomics: the row's live, the all-devices
 * live, an atomic max on both peaks and on each open mark's peaks, and one slot of the address
 * table. The table is open addressing over an anonymous mapping (reserved, touched as used): a
 * slot is claimed by a compare-and-swap of its address word (from empty or from a tombstone),
 * its size and row written after; a free looks the address up and swaps it to a tombstone.
 * Nothing here blocks: a reader (cudatrace_live) gets a pointer and reads words. */
#include "live.h"

#include <string.h>
#include <sys/mman.h>

#include "trace_format.h"
#include "util.h"

#define TAB_BITS 20 /* 1M slots of 16 bytes: 16 MiB reserved, pages touched as used */
#define TAB_SIZE (1u << TAB_BITS)
#define TAB_PROBES 4096
#define EMPTY 0
#define TOMB 1

/* meta: size in the low 48 bits, who above it (OWNER_HOST: pinned host memory, else the device
 * + 1, 0 for an unknown device, saturated at 254), the address space in the top byte; written
 * after addr (a reader of another key may see the previous occupant's) */
struct slot {
    uint64_t addr; /* EMPTY, TOMB, or the address */
    uint64_t meta;
};
#define META(size, who, space) ((size) | ((uint64_t)(who) << 48) | ((uint64_t)(space) << 56))
#define META_SIZE(m) ((m) & ((1ull << 48) - 1))
#define META_WHO(m) ((uint32_t)((m) >> 48) & 0xff)
#define OWNER_HOST 255u
#define META_SPACE(m) ((uint32_t)((m) >> 56))

static struct ct_live_stats live = {.version = CT_LIVE_VERSION};
static struct slot *tab; /* NULL until the first counted allocation */

CT_EXPORT const struct ct_live_stats *cudatrace_live(void) { return &live; }

void ct_live_start(void) { __atomic_store_n(&live.active, 1, __ATOMIC_RELEASE); }

static inline void amax(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > cur &&
           !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static inline uint32_t hash(uint64_t addr)
{
    return (uint32_t)((addr * 0x9E3779B97F4A7C15ull) >> (64 - TAB_BITS));
}

static struct slot *table(void)
{
    struct slot *t = __atomic_load_n(&tab, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    void *m = mmap(NULL, sizeof(struct slot) * TAB_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct slot *expect = NULL;
    if (!__atomic_compare_exchange_n(&tab, &expect, (struct slot *)m, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        munmap(m, sizeof(struct slot) * TAB_SIZE); /* another thread mapped it first */
        return expect;
    }
    return (struct slot *)m;
}

static int insert(uint64_t addr, uint32_t space, uint64_t size, uint32_t who)
{
    struct slot *t = table();
    if (!t)
        return 0;
    uint32_t i = hash(addr);
    for (int n = 0; n < TAB_PROBES; n++, i = (i + 1) & (TAB_SIZE - 1)) {
        uint64_t cur = __atomic_load_n(&t[i].addr, __ATOMIC_RELAXED);
        while (cur <= TOMB) {
            if (__atomic_compare_exchange_n(&t[i].addr, &cur, addr, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
                __atomic_store_n(&t[i].meta, META(size, who, space), __ATOMIC_RELEASE);
                return 1;
            }
        }
    }
    return 0;
}

static int take(uint64_t addr, uint32_t space, uint64_t *size, uint32_t *who)
{
    struct slot *t = __atomic_load_n(&tab, __ATOMIC_ACQUIRE);
    if (!t || addr <= TOMB)
        return 0;
    uint32_t i = hash(addr);
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

void ct_live_alloc(int kind, int space, int dev, uint64_t addr, uint64_t size, int result)
{
    int host = kind == CT_KIND_HOST;
    struct ct_live_row *row = host ? &live.host : &live.dev[row_of(dev)];
    if (result != 0) {
        __atomic_add_fetch(&row->failures, 1, __ATOMIC_RELAXED);
        if (!host)
            __atomic_add_fetch(&live.dev[CT_LIVE_ALL].failures, 1, __ATOMIC_RELAXED);
        return;
    }
    if (space == CT_SPACE_NONE || addr <= TOMB || size >= 1ull << 48)
        return;
    if (!insert(addr, (uint32_t)space, size, who_of(kind, dev))) {
        __atomic_add_fetch(&live.untracked, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_add_fetch(&row->allocs, 1, __ATOMIC_RELAXED);
    uint64_t now = __atomic_add_fetch(&row->live, size, __ATOMIC_RELAXED);
    amax(&row->peak, now);
    if (host)
        return;
    struct ct_live_row *all_row = &live.dev[CT_LIVE_ALL];
    __atomic_add_fetch(&all_row->allocs, 1, __ATOMIC_RELAXED);
    uint64_t all = __atomic_add_fetch(&all_row->live, size, __ATOMIC_RELAXED);
    amax(&all_row->peak, all);
    uint32_t r = row_of(dev);
    for (uint64_t m = __atomic_load_n(&live.marks_open, __ATOMIC_ACQUIRE); m; m &= m - 1) {
        struct ct_live_mark *k = &live.marks[__builtin_ctzll(m)];
        amax(&k->peak[r], now);
        amax(&k->peak[CT_LIVE_ALL], all);
    }
}

int ct_live_free(int space, uint64_t addr)
{
    uint64_t size = 0;
    uint32_t who = 0;
    if (!take(addr, (uint32_t)space, &size, &who))
        return CT_LIVE_UNKNOWN;
    int dev = who == OWNER_HOST ? -1 : (int)who - 1;
    struct ct_live_row *row = who == OWNER_HOST ? &live.host : &live.dev[row_of(dev)];
    __atomic_add_fetch(&row->frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&row->live, size, __ATOMIC_RELAXED);
    if (who != OWNER_HOST) {
        __atomic_add_fetch(&live.dev[CT_LIVE_ALL].frees, 1, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&live.dev[CT_LIVE_ALL].live, size, __ATOMIC_RELAXED);
    }
    return dev;
}

void ct_live_deny(int dev)
{
    __atomic_add_fetch(&live.dev[row_of(dev)].denials, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&live.dev[CT_LIVE_ALL].denials, 1, __ATOMIC_RELAXED);
}

/* A mark's slot is claimed by setting its bit; its peaks start at zero and take what is live
 * right after, so an allocation seen by the mark is either in that reading or maxed in after. */
CT_EXPORT int cudatrace_live_mark_open(void)
{
    uint64_t m = __atomic_load_n(&live.marks_open, __ATOMIC_ACQUIRE);
    int i;
    do {
        if (m == ~0ull)
            return -1;
        i = __builtin_ctzll(~m);
    } while (!__atomic_compare_exchange_n(&live.marks_open, &m, m | (1ull << i), 1,
                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    struct ct_live_mark *k = &live.marks[i];
    for (int r = 0; r < CT_LIVE_ROWS; r++)
        __atomic_store_n(&k->peak[r], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&k->opened_ns, ct_now_ns(), __ATOMIC_RELAXED);
    for (int r = 0; r < CT_LIVE_ROWS; r++) {
        uint64_t now = __atomic_load_n(&live.dev[r].live, __ATOMIC_RELAXED);
        __atomic_store_n(&k->base[r], now, __ATOMIC_RELAXED);
        amax(&k->peak[r], now);
    }
    return i;
}

CT_EXPORT void cudatrace_live_mark_close(int slot)
{
    if (slot < 0 || slot >= CT_LIVE_MARKS)
        return;
    __atomic_and_fetch(&live.marks_open, ~(1ull << slot), __ATOMIC_ACQ_REL);
}

void ct_live_atfork_child(void)
{
    /* the forked child holds none of its parent's device memory (a CUDA context does not
     * survive fork); the table's pages are a private copy: dropped, mapped anew when used */
    struct slot *t = tab;
    tab = NULL;
    if (t)
        munmap(t, sizeof(struct slot) * TAB_SIZE);
    uint32_t active = live.active;
    memset(&live, 0, sizeof live);
    live.version = CT_LIVE_VERSION;
    live.active = active;
}
