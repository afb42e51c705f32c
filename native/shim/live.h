/* live.h - the live counters a program reads about itself (live.c; the layout and the exported
 * reader API: native/include/live_format.h). The one call protocol (shim.c) tells them each
 * allocation, free and denial. Each thread counts on cache lines of its own (no line shared by
 * threads is written per event while no mark is open); the table of live addresses they need to
 * end an allocation at its free is lock-free. */
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
/* 32K slots of 32 bytes (1 MiB, pages touched as used): small enough to stay in a cache when a
 * program's addresses never repeat (a bump allocator); live.c spills past it into a table of
 * 1M slots, mapped when needed */
#define CT_LIVE_TAB_BITS 15
#define CT_LIVE_EMPTY 0
#define CT_LIVE_TOMB 1
#define CT_LIVE_HOST 255u
#define CT_LIVE_META(size, who, space)                                                             \
    ((size) | ((uint64_t)(who) << 48) | ((uint64_t)(space) << 56))
extern CT_HIDDEN struct ct_live_slot *ct_live_tab; /* NULL until the first counted allocation */
extern CT_HIDDEN uint64_t ct_live_epoch;           /* moves when a mark opens (live.c) */
extern CT_HIDDEN uint64_t ct_live_marks;           /* bit i: mark i open (the readers' copy
                                                      is ct_live_stats.marks_open) */

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

/* ---- the counters: each thread's own (live.c says how they are summed) ----------------------
 * Rows: devices 0-15, CT_LIVE_ALL (every device; its counts here: devices past the rows), and
 * CT_LIVE_HOSTROW (pinned host memory). room: how many bytes the thread may still add to a row
 * before the row's live bytes could pass its peak (a free gives room, an allocation takes it;
 * below zero the peak may rise: live.c decides, under its lock). A reader or a thread short of
 * room takes every thread's room (an atomic exchange): so room is changed by atomic adds, on the
 * thread's own cache lines. The counts are the thread's alone. */
#define CT_LIVE_HOSTROW CT_LIVE_ROWS
#define CT_LIVE_NROWS (CT_LIVE_ROWS + 1)
struct ct_live_thr {
    int64_t room[CT_LIVE_NROWS];
    uint64_t allocs[CT_LIVE_NROWS], frees[CT_LIVE_NROWS];
    uint64_t failures[CT_LIVE_NROWS], denials[CT_LIVE_NROWS];
    struct ct_live_thr *next; /* the threads that counted (live.c) */
};
extern CT_HIDDEN CT_TLS struct ct_live_thr *ct_live_me; /* NULL: none yet */
/* what the hot paths look at once: CT_LIVE_STOP while live.c takes every thread's room (a free
 * waits, ct_live_wait, before its driver call, so no memory it frees is taken by another
 * thread meanwhile), CT_LIVE_MARKED while a mark is open */
#define CT_LIVE_STOP 1u
#define CT_LIVE_MARKED 2u
extern CT_HIDDEN uint32_t ct_live_gate;
void ct_live_wait(void);
/* row r's room ran short (after an allocation of size: its room and the all-devices row's are
 * already taken): the peaks rise if they must */
void ct_live_short(struct ct_live_thr *t, uint32_t r);

/* a mark's own bytes of row r and of every device change by d (an allocation of epoch e: +size,
 * its free: -size), when the allocation is the mark's own */
void ct_live_own(struct ct_live_mark *k, uint32_t r, int64_t d);
/* the open marks learn of a device allocation of size bytes of epoch e in row r (marks[] are
 * shared: open marks cost their updates, live.c) */
void ct_live_marks_alloc(uint32_t r, uint64_t size, uint64_t e);

/* one more to a count only this thread writes and others read: one plain add on x86-64 (an
 * aligned store is whole to a reader), a relaxed atomic store elsewhere and under TSan */
static inline void ct_live_inc(uint64_t *p)
{
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    __asm__("addq $1, %0" : "+m"(*p));
#else
    __atomic_store_n(p, *p + 1, __ATOMIC_RELAXED);
#endif
}

/* a device allocation of size bytes (epoch e) in row r (a device's) */
static inline void ct_live_count_device(struct ct_live_thr *t, uint32_t r, uint64_t size,
                                        uint64_t e)
{
    ct_live_inc(&t->allocs[r]);
    int64_t a = __atomic_sub_fetch(&t->room[r], (int64_t)size, __ATOMIC_SEQ_CST);
    int64_t b = __atomic_sub_fetch(&t->room[CT_LIVE_ALL], (int64_t)size, __ATOMIC_SEQ_CST);
    if (__builtin_expect((a | b) < 0, 0))
        ct_live_short(t, r);
    if (__builtin_expect(__atomic_load_n(&ct_live_gate, __ATOMIC_ACQUIRE) & CT_LIVE_MARKED, 0))
        ct_live_marks_alloc(r, size, e);
}

/* the general cases (live.c): a failure, pinned host memory, a device past the rows, the first
 * allocation of the process or the thread (the table is mapped, the thread's counters made), a
 * taken home slot */
void ct_live_alloc_slow(int kind, int space, int dev, uint64_t addr, uint64_t size, int result);

/* an allocation call returned: counted when it succeeded (result 0) and space is not 0 */
static inline __attribute__((always_inline)) void
ct_live_alloc(int kind, int space, int dev, uint64_t addr, uint64_t size, int result)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE);
    struct ct_live_thr *me = ct_live_me;
    if (__builtin_expect(!t || !me || result != 0 || kind == CT_KIND_HOST ||
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
    ct_live_count_device(me, (uint32_t)dev, size, e);
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

/* Every open mark whose own the allocation of epoch e is loses size bytes of row r (live.c) */
void ct_live_own_free(uint32_t r, uint64_t size, uint64_t e);

/* size bytes of row r leave the thread's counters (a free before its driver call) */
static inline void ct_live_count_free(struct ct_live_thr *t, uint32_t r, uint64_t size, uint64_t e)
{
    ct_live_inc(&t->frees[r]);
    __atomic_add_fetch(&t->room[r], (int64_t)size, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&t->room[CT_LIVE_ALL], (int64_t)size, __ATOMIC_SEQ_CST);
    uint32_t gate = __atomic_load_n(&ct_live_gate, __ATOMIC_SEQ_CST);
    if (__builtin_expect(gate != 0, 0)) {
        if (gate & CT_LIVE_STOP)
            ct_live_wait();
        if (gate & CT_LIVE_MARKED)
            ct_live_own_free(r, size, e);
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
    struct ct_live_thr *me = ct_live_me;
    if (!t || addr <= CT_LIVE_TOMB)
        return CT_LIVE_UNKNOWN;
    struct ct_live_slot *s = &t[ct_live_hash(addr)];
    uint64_t cur = __atomic_load_n(&s->addr, __ATOMIC_ACQUIRE);
    if (__builtin_expect(cur != addr || space == CT_SPACE_VMM || !me, 0))
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
    tk->meta = m;
    tk->epoch = e;
    tk->state = 1;
    ct_live_count_free(me, who - 1, m & ((1ull << 48) - 1), e);
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
/* the live bytes of device dev's row now (taken from every thread: not for the call path) */
uint64_t ct_live_held(int dev);
/* a new process after fork: nothing of the parent's counts */
void ct_live_atfork_child(void);

#endif
