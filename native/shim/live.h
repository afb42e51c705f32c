/* live.h - the live counters a program reads about itself (live.c; the layout and the exported
 * reader API: native/include/live_format.h). The one call protocol (shim.c) tells them each
 * allocation, free and denial; the table of live addresses they need to end an allocation at its
 * free is lock-free, so neither a reader nor another allocating thread is ever waited on. */
#ifndef CUDATRACE_LIVE_H
#define CUDATRACE_LIVE_H

#include <stdint.h>

#include "live_format.h"

#include "trace_format.h"
#include "util.h"

/* the shim counts from now on (load, after the settings are read) */
void ct_live_start(void);

/* ---- the address table and the counters, for the inline fast paths below (live.c) ---------
 * The table is open addressing over an anonymous mapping: a slot is claimed by a
 * compare-and-swap of its address word (from empty or from a tombstone), its epoch and meta
 * written after; a free swaps the address to a tombstone. meta: size in the low 48 bits, who
 * above it (CT_LIVE_HOST: pinned host memory, else the device + 1, 0 for an unknown device,
 * saturated at 254), the address space in the top byte (a reader of another key may see the
 * previous occupant's meta). epoch: ct_live_epoch when the allocation was counted (a mark's own
 * allocations are those of its epoch or later). */
struct ct_live_slot {
    uint64_t addr; /* CT_LIVE_EMPTY, CT_LIVE_TOMB, or the address */
    uint64_t meta;
    uint64_t epoch;
    uint64_t unused; /* 32 bytes: a slot never straddles a cache line */
};
#define CT_LIVE_TAB_BITS 20 /* 1M slots of 32 bytes: 32 MiB reserved, pages touched as used */
#define CT_LIVE_EMPTY 0
#define CT_LIVE_TOMB 1
#define CT_LIVE_HOST 255u
#define CT_LIVE_META(size, who, space)                                                             \
    ((size) | ((uint64_t)(who) << 48) | ((uint64_t)(space) << 56))
extern CT_HIDDEN struct ct_live_stats ct_live;
extern CT_HIDDEN struct ct_live_slot *ct_live_tab; /* NULL until the first counted allocation */
extern CT_HIDDEN uint64_t ct_live_epoch;           /* moves when a mark opens (live.c) */

static inline uint32_t ct_live_hash(uint64_t addr)
{
    return (uint32_t)((addr * 0x9E3779B97F4A7C15ull) >> (64 - CT_LIVE_TAB_BITS));
}

static inline void ct_live_amax(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > cur &&
           !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* a mark's own bytes of row r and of every device change by d (an allocation of epoch e: +size,
 * its free: -size), when the allocation is the mark's own */
void ct_live_own(struct ct_live_mark *k, uint32_t r, int64_t d);

/* a device allocation of size bytes (epoch e) in row r (a device's), counted in its row, the
 * all-devices row and every open mark (ct_live_count_all: a device past the rows) */
static inline void ct_live_count_device(uint32_t r, uint64_t size, uint64_t e)
{
    struct ct_live_row *row = &ct_live.dev[r], *all_row = &ct_live.dev[CT_LIVE_ALL];
    __atomic_add_fetch(&row->allocs, 1, __ATOMIC_RELAXED);
    uint64_t now = __atomic_add_fetch(&row->live, size, __ATOMIC_RELAXED);
    ct_live_amax(&row->peak, now);
    __atomic_add_fetch(&all_row->allocs, 1, __ATOMIC_RELAXED);
    uint64_t all = __atomic_add_fetch(&all_row->live, size, __ATOMIC_RELAXED);
    ct_live_amax(&all_row->peak, all);
    for (uint64_t m = __atomic_load_n(&ct_live.marks_open, __ATOMIC_ACQUIRE); m; m &= m - 1) {
        struct ct_live_mark *k = &ct_live.marks[__builtin_ctzll(m)];
        ct_live_amax(&k->peak[r], now);
        ct_live_amax(&k->peak[CT_LIVE_ALL], all);
        if (e >= __atomic_load_n(&k->epoch, __ATOMIC_ACQUIRE))
            ct_live_own(k, r, (int64_t)size);
    }
}

/* the general cases (live.c): a failure, pinned host memory, a device past the rows, the first
 * allocation (the table is mapped), a taken home slot */
void ct_live_alloc_slow(int kind, int space, int dev, uint64_t addr, uint64_t size, int result);

/* an allocation call returned: counted when it succeeded (result 0) and space is not 0 */
static inline void ct_live_alloc(int kind, int space, int dev, uint64_t addr, uint64_t size,
                                 int result)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!t || result != 0 || kind == CT_KIND_HOST ||
                             (unsigned)dev >= CT_LIVE_DEVICES || space == CT_SPACE_NONE ||
                             addr <= CT_LIVE_TOMB || size >> 48,
                         0)) {
        ct_live_alloc_slow(kind, space, dev, addr, size, result);
        return;
    }
    struct ct_live_slot *s = &t[ct_live_hash(addr)];
    uint64_t cur = __atomic_load_n(&s->addr, __ATOMIC_RELAXED);
    if (__builtin_expect(cur > CT_LIVE_TOMB ||
                             !__atomic_compare_exchange_n(&s->addr, &cur, addr, 0, __ATOMIC_ACQ_REL,
                                                          __ATOMIC_RELAXED),
                         0)) {
        ct_live_alloc_slow(kind, space, dev, addr, size, result); /* probes on */
        return;
    }
    uint64_t e = __atomic_load_n(&ct_live_epoch, __ATOMIC_ACQUIRE);
    __atomic_store_n(&s->epoch, e, __ATOMIC_RELAXED);
    __atomic_store_n(&s->meta, CT_LIVE_META(size, (uint32_t)dev + 1, (uint32_t)space),
                     __ATOMIC_RELEASE);
    ct_live_count_device((uint32_t)dev, size, e);
}

/* What a free took out of the counters before its driver call, to put it back when the call
 * fails (ct_live_unfree). state: 0 nothing counted, 1 taken, 2 a mapped VMM handle whose end
 * waits for its last unmap. */
struct ct_live_taken {
    uint64_t meta, epoch; /* the slot's words */
    uint8_t state;
};
#define CT_LIVE_UNKNOWN (-2)
int ct_live_freeing_slow(int space, uint64_t addr, struct ct_live_taken *tk);

/* Every open mark whose own the allocation of epoch e is loses size bytes of row r. */
static inline void ct_live_own_free(uint32_t r, uint64_t size, uint64_t e)
{
    for (uint64_t m = __atomic_load_n(&ct_live.marks_open, __ATOMIC_ACQUIRE); m; m &= m - 1) {
        struct ct_live_mark *k = &ct_live.marks[__builtin_ctzll(m)];
        if (e >= __atomic_load_n(&k->epoch, __ATOMIC_ACQUIRE))
            ct_live_own(k, r, -(int64_t)size);
    }
}

/* A free is about to be called: the allocation at (space, addr) leaves the counters now, before
 * the driver can give its memory to another thread (tk says what to put back if the call fails:
 * ct_live_unfree). Returns the device it was counted on (-1 for pinned host memory),
 * CT_LIVE_UNKNOWN if it was not counted. */
static inline __attribute__((always_inline)) int ct_live_freeing(int space, uint64_t addr,
                                                                 struct ct_live_taken *tk)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE);
    if (!t || addr <= CT_LIVE_TOMB)
        return CT_LIVE_UNKNOWN;
    struct ct_live_slot *s = &t[ct_live_hash(addr)];
    uint64_t cur = __atomic_load_n(&s->addr, __ATOMIC_ACQUIRE);
    if (__builtin_expect(cur != addr || space == CT_SPACE_VMM, 0))
        return ct_live_freeing_slow(space, addr, tk);
    uint64_t m = __atomic_load_n(&s->meta, __ATOMIC_ACQUIRE);
    uint32_t who = (uint32_t)(m >> 48) & 0xff; /* a device of a row here: who - 1 */
    if (__builtin_expect((uint32_t)(m >> 56) != (uint32_t)space || who - 1 >= CT_LIVE_DEVICES, 0))
        return ct_live_freeing_slow(space, addr, tk);
    uint64_t e = __atomic_load_n(&s->epoch, __ATOMIC_RELAXED);
    /* a second free of the same address racing this one: only one wins the slot */
    if (!__atomic_compare_exchange_n(&s->addr, &cur, CT_LIVE_TOMB, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return CT_LIVE_UNKNOWN;
    uint64_t size = m & ((1ull << 48) - 1);
    uint32_t r = who - 1;
    tk->meta = m;
    tk->epoch = e;
    tk->state = 1;
    __atomic_add_fetch(&ct_live.dev[r].frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&ct_live.dev[r].live, size, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ct_live.dev[CT_LIVE_ALL].frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&ct_live.dev[CT_LIVE_ALL].live, size, __ATOMIC_RELAXED);
    ct_live_own_free(r, size, e);
    return (int)who - 1;
}

/* the free announced by ct_live_freeing failed: what it took counts again, as it was */
void ct_live_unfree(int space, uint64_t addr, const struct ct_live_taken *tk);

/* VMM mappings (live.c, off the allocation path): cuMemMap made one (after its call);
 * cuMemUnmap is about to end those starting in [ptr, ptr + size) (the last mapping of a
 * released handle ends the handle now, before the driver frees it) and has ended them (ok) or
 * failed (put back) */
void ct_live_map(uint64_t ptr, uint64_t size, uint64_t handle);
void ct_live_unmapping(uint64_t ptr, uint64_t size);
void ct_live_unmapped(uint64_t ptr, uint64_t size, int ok);

/* the budget refused an allocation on dev */
void ct_live_deny(int dev);
/* a new process after fork: nothing of the parent's counts */
void ct_live_atfork_child(void);

#endif
