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
 * compare-and-swap of its address word (from empty or from a tombstone), its meta written
 * after; a free swaps the address to a tombstone. meta: size in the low 48 bits, who above it
 * (CT_LIVE_HOST: pinned host memory, else the device + 1, 0 for an unknown device, saturated at
 * 254), the address space in the top byte (a reader of another key may see the previous
 * occupant's meta). */
struct ct_live_slot {
    uint64_t addr; /* CT_LIVE_EMPTY, CT_LIVE_TOMB, or the address */
    uint64_t meta;
};
#define CT_LIVE_TAB_BITS 20 /* 1M slots of 16 bytes: 16 MiB reserved, pages touched as used */
#define CT_LIVE_EMPTY 0
#define CT_LIVE_TOMB 1
#define CT_LIVE_HOST 255u
#define CT_LIVE_META(size, who, space)                                                             \
    ((size) | ((uint64_t)(who) << 48) | ((uint64_t)(space) << 56))
extern CT_HIDDEN struct ct_live_stats ct_live;
extern CT_HIDDEN struct ct_live_slot *ct_live_tab; /* NULL until the first counted allocation */

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

/* a device allocation of size bytes in row r (a device's), counted in its row, the all-devices
 * row and every open mark */
static inline void ct_live_count_device(uint32_t r, uint64_t size)
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
    }
}

/* the general cases (live.c): a failure, pinned host memory, a device past the rows, the first
 * allocation (the table is mapped), a taken home slot */
void ct_live_alloc_slow(int kind, int space, int dev, uint64_t addr, uint64_t size, int result);
int ct_live_free_slow(int space, uint64_t addr);

/* an allocation call returned: counted when it succeeded (result 0) and space is not 0 */
static inline void ct_live_alloc(int kind, int space, int dev, uint64_t addr, uint64_t size,
                                 int result)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!t || result != 0 || kind == CT_KIND_HOST || (unsigned)dev >= 253 ||
                             space == CT_SPACE_NONE || addr <= CT_LIVE_TOMB || size >> 48,
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
    __atomic_store_n(&s->meta, CT_LIVE_META(size, (uint32_t)dev + 1, (uint32_t)space),
                     __ATOMIC_RELEASE);
    ct_live_count_device(dev < CT_LIVE_DEVICES ? (uint32_t)dev : CT_LIVE_DEVICES - 1, size);
}

/* a free call returned successfully: ends the allocation at (space, addr) if counted, and
 * returns the device it was counted on (-1 for pinned host memory), CT_LIVE_UNKNOWN if it was
 * not counted */
#define CT_LIVE_UNKNOWN (-2)
static inline int ct_live_free(int space, uint64_t addr)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE);
    if (!t || addr <= CT_LIVE_TOMB)
        return CT_LIVE_UNKNOWN;
    struct ct_live_slot *s = &t[ct_live_hash(addr)];
    uint64_t cur = __atomic_load_n(&s->addr, __ATOMIC_ACQUIRE);
    if (__builtin_expect(cur != addr, 0))
        return ct_live_free_slow(space, addr);
    uint64_t m = __atomic_load_n(&s->meta, __ATOMIC_ACQUIRE);
    uint32_t who = (uint32_t)(m >> 48) & 0xff;
    if (__builtin_expect((uint32_t)(m >> 56) != (uint32_t)space || who == CT_LIVE_HOST, 0))
        return ct_live_free_slow(space, addr);
    /* a second free of the same address racing this one: only one wins the slot */
    if (!__atomic_compare_exchange_n(&s->addr, &cur, CT_LIVE_TOMB, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return CT_LIVE_UNKNOWN;
    uint64_t size = m & ((1ull << 48) - 1);
    int dev = (int)who - 1;
    uint32_t r = dev < 0 ? 0 : dev < CT_LIVE_DEVICES ? (uint32_t)dev : CT_LIVE_DEVICES - 1;
    __atomic_add_fetch(&ct_live.dev[r].frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&ct_live.dev[r].live, size, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ct_live.dev[CT_LIVE_ALL].frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&ct_live.dev[CT_LIVE_ALL].live, size, __ATOMIC_RELAXED);
    return dev;
}

/* the budget refused an allocation on dev */
void ct_live_deny(int dev);
/* a new process after fork: nothing of the parent's counts */
void ct_live_atfork_child(void);

#endif
