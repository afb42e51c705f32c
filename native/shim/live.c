/* live.c - per-device live bytes, peaks, counts and marks, kept for readers inside the process
 * (live_format.h).
 *
 * Each thread counts on its own cache lines (live.h: struct ct_live_thr): its allocations,
 * frees, failures and denials, and its *room* in each row: how many bytes it may still add
 * before the row's live bytes could pass the row's peak. The invariant, row by row:
 *
 *     top - live == pool + (the room of every thread)
 *
 * top: the highest live bytes since the last mark opened (so the peak of every open mark and of
 * the process follow from its rises), pool: room no thread holds. A free gives its thread room,
 * an allocation takes it; a thread whose room goes below zero (ct_live_short) takes every
 * thread's room into the pool under the lock, and only what is still missing raises top: the
 * peak rises by exactly what live passed it. A reader (cudatrace_live) takes every room the same
 * way, and live = top - pool. While room is taken (ct_live_stop), a free waits before its driver
 * call, so no memory it frees is taken by another thread meanwhile: a sum read in that time never
 * counts one buffer twice (no figure above what the device held, docs/reliability.md).
 *
 * A thread's hot path (inline in live.h: an allocation whose home slot is free, a free found in
 * its home slot) is one slot of the address table and two atomic adds on lines of its own;
 * everything else comes here. Open marks cost more: their own bytes are shared words. Off that
 * path take a lock of this process: reading, a thread short of room, opening a mark, a thread's
 * first and last count, and the VMM mappings of cuMemMap / cuMemUnmap / cuMemRelease of a mapped
 * handle (slow driver calls, a table of their own below). */
#include "live.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "trace_format.h"
#include "util.h"

#define TAB_SIZE (1u << CT_LIVE_TAB_BITS)
#define TAB_PROBES                                                                                 \
    64 /* then the spill table (a slot of a chain never becomes empty again: an
                         entry is in it only when the chain's first slots were all live) */
#define TAB2_BITS 20
#define TAB2_SIZE (1u << TAB2_BITS)
#define TAB2_PROBES 4096
#define EMPTY CT_LIVE_EMPTY
#define TOMB CT_LIVE_TOMB
#define OWNER_HOST CT_LIVE_HOST
#define META_SIZE(m) ((m) & ((1ull << 48) - 1))
#define META_WHO(m) ((uint32_t)((m) >> 48) & 0xff)
#define META_SPACE(m) ((uint32_t)((m) >> 56))
#define CLOSED UINT64_MAX /* a closed mark's epoch: no allocation is its own */
#define NROWS CT_LIVE_NROWS
#define HOSTROW CT_LIVE_HOSTROW
#define ALL CT_LIVE_ALL

struct ct_live_stats ct_live = {.version = CT_LIVE_VERSION}; /* what cudatrace_live hands out */
struct ct_live_slot *ct_live_tab;
static struct ct_live_slot *tab2; /* the spill table (mapped when the first chain is full) */
uint64_t ct_live_epoch;
uint64_t ct_live_marks;
uint32_t ct_live_gate;
CT_TLS struct ct_live_thr *ct_live_me;

/* under mu: the threads that count, what the ones gone counted, each row's pool, top and peak */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ct_live_thr *threads;
static struct ct_live_thr retired;
static int64_t pool[NROWS];
static uint64_t top[NROWS], peak[NROWS];
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_ok;

static void marks_closed(void)
{
    for (int i = 0; i < CT_LIVE_MARKS; i++)
        __atomic_store_n(&ct_live.marks[i].epoch, CLOSED, __ATOMIC_RELEASE);
}

void ct_live_start(void)
{
    marks_closed();
    __atomic_store_n(&ct_live.active, 1, __ATOMIC_RELEASE);
}

static inline void amax_signed(int64_t *p, int64_t v)
{
    int64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > cur &&
           !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

void ct_live_own(struct ct_live_mark *k, uint32_t r, int64_t d)
{
    if (r != CT_LIVE_ALL) {
        int64_t v = __atomic_add_fetch(&k->own[r], d, __ATOMIC_RELAXED);
        if (d > 0)
            amax_signed(&k->own_peak[r], v);
    }
    int64_t v = __atomic_add_fetch(&k->own[CT_LIVE_ALL], d, __ATOMIC_RELAXED);
    if (d > 0)
        amax_signed(&k->own_peak[CT_LIVE_ALL], v);
}

void ct_live_marks_alloc(uint32_t r, uint64_t size, uint64_t e)
{
    for (uint64_t m = __atomic_load_n(&ct_live_marks, __ATOMIC_ACQUIRE); m; m &= m - 1) {
        struct ct_live_mark *k = &ct_live.marks[__builtin_ctzll(m)];
        if (e >= __atomic_load_n(&k->epoch, __ATOMIC_ACQUIRE))
            ct_live_own(k, r, (int64_t)size);
    }
}

void ct_live_own_free(uint32_t r, uint64_t size, uint64_t e)
{
    for (uint64_t m = __atomic_load_n(&ct_live_marks, __ATOMIC_ACQUIRE); m; m &= m - 1) {
        struct ct_live_mark *k = &ct_live.marks[__builtin_ctzll(m)];
        if (e >= __atomic_load_n(&k->epoch, __ATOMIC_ACQUIRE))
            ct_live_own(k, r, -(int64_t)size);
    }
}

/* ---- the threads' counters --------------------------------------------------------------- */
static inline void bump(uint64_t *p, uint64_t d) /* the owner's count (readers load it) */
{
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + d, __ATOMIC_RELAXED);
}

/* with mu: every thread's room of row r into the pool (the stop flag set) */
static void take_rooms(uint32_t r)
{
    for (struct ct_live_thr *t = threads; t; t = t->next)
        pool[r] += __atomic_exchange_n(&t->room[r], 0, __ATOMIC_SEQ_CST);
}

/* with mu, every room of row r taken: live passed top by what the pool misses */
static void settle(uint32_t r)
{
    if (pool[r] >= 0)
        return;
    top[r] += (uint64_t)-pool[r];
    pool[r] = 0;
    if (top[r] > peak[r])
        peak[r] = top[r];
    if (r == HOSTROW)
        return;
    for (uint64_t m = __atomic_load_n(&ct_live_marks, __ATOMIC_ACQUIRE); m; m &= m - 1)
        ct_live_amax(&ct_live.marks[__builtin_ctzll(m)].peak[r], top[r]);
}

static void stop_all(void)
{
    pthread_mutex_lock(&mu);
    __atomic_or_fetch(&ct_live_gate, CT_LIVE_STOP, __ATOMIC_SEQ_CST);
}

static void go_on(void)
{
    __atomic_and_fetch(&ct_live_gate, ~CT_LIVE_STOP, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&mu);
}

void ct_live_wait(void)
{
    pthread_mutex_lock(&mu); /* held while room is taken */
    pthread_mutex_unlock(&mu);
}

void ct_live_short(struct ct_live_thr *t, uint32_t r)
{
    uint32_t rows[2] = {r, ALL};
    stop_all();
    for (int i = 0; i < (r == HOSTROW || r == ALL ? 1 : 2); i++) {
        uint32_t q = rows[i];
        if (__atomic_load_n(&t->room[q], __ATOMIC_SEQ_CST) >= 0)
            continue;
        take_rooms(q);
        settle(q);
        __atomic_add_fetch(&t->room[q], pool[q], __ATOMIC_SEQ_CST); /* the rest: this thread's */
        pool[q] = 0;
    }
    go_on();
}

static void on_thread_exit(void *arg)
{
    struct ct_live_thr *t = arg;
    ct_live_me = NULL;
    pthread_mutex_lock(&mu);
    for (struct ct_live_thr **p = &threads; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            break;
        }
    for (int r = 0; r < NROWS; r++) {
        pool[r] += __atomic_exchange_n(&t->room[r], 0, __ATOMIC_SEQ_CST);
        retired.allocs[r] += t->allocs[r];
        retired.frees[r] += t->frees[r];
        retired.failures[r] += t->failures[r];
        retired.denials[r] += t->denials[r];
    }
    pthread_mutex_unlock(&mu);
    free(t);
}

static void make_key(void) { key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0; }

/* the calling thread's counters, made at its first count (NULL: out of memory) */
static struct ct_live_thr *me(void)
{
    if (ct_live_me)
        return ct_live_me;
    struct ct_live_thr *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    pthread_once(&key_once, make_key);
    if (key_ok)
        pthread_setspecific(exit_key, t);
    pthread_mutex_lock(&mu);
    t->next = threads;
    threads = t;
    pthread_mutex_unlock(&mu);
    ct_live_me = t;
    return t;
}

/* *where, mapped by the first thread that needs it (n slots) */
static struct ct_live_slot *mapped(struct ct_live_slot **where, size_t n)
{
    struct ct_live_slot *t = __atomic_load_n(where, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    void *m = mmap(NULL, sizeof(struct ct_live_slot) * n, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct ct_live_slot *expect = NULL;
    if (!__atomic_compare_exchange_n(where, &expect, (struct ct_live_slot *)m, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        munmap(m, sizeof(struct ct_live_slot) * n); /* another thread mapped it first */
        return expect;
    }
    return (struct ct_live_slot *)m;
}

static inline uint32_t hash2(uint64_t addr)
{
    return (uint32_t)((addr * 0x9E3779B97F4A7C15ull) >> (64 - TAB2_BITS));
}

/* (addr, space) enters table t (a chain of probes from home) with epoch e; 0: no free slot */
static int put(struct ct_live_slot *t, uint32_t mask, uint32_t i, int probes, uint64_t addr,
               uint64_t meta, uint64_t e)
{
    for (int n = 0; n < probes; n++, i = (i + 1) & mask) {
        uint64_t cur = __atomic_load_n(&t[i].addr, __ATOMIC_RELAXED);
        while (cur <= TOMB) {
            if (__atomic_compare_exchange_n(&t[i].addr, &cur, addr, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
                __atomic_store_n(&t[i].epoch, e, __ATOMIC_RELAXED);
                __atomic_store_n(&t[i].meta, meta, __ATOMIC_RELEASE);
                return 1;
            }
        }
    }
    return 0;
}

/* (addr, space) enters the table, or the spill table past it, with epoch e; 0 when both are
 * full (or cannot be mapped) */
static int insert(uint64_t addr, uint32_t space, uint64_t size, uint32_t who, uint64_t e)
{
    struct ct_live_slot *t = mapped(&ct_live_tab, TAB_SIZE), *t2;
    uint64_t meta = CT_LIVE_META(size, who, space);
    if (!t)
        return 0;
    if (put(t, TAB_SIZE - 1, ct_live_hash(addr), TAB_PROBES, addr, meta, e))
        return 1;
    t2 = mapped(&tab2, TAB2_SIZE);
    return t2 && put(t2, TAB2_SIZE - 1, hash2(addr), TAB2_PROBES, addr, meta, e);
}

/* the slot of (addr, space) in table t, or NULL; *past: the chain was full, look further */
static struct ct_live_slot *seek(struct ct_live_slot *t, uint32_t mask, uint32_t i, int probes,
                                 uint64_t addr, uint32_t space, uint64_t *meta, int *past)
{
    *past = 0;
    for (int n = 0; n < probes; n++, i = (i + 1) & mask) {
        uint64_t cur = __atomic_load_n(&t[i].addr, __ATOMIC_ACQUIRE);
        if (cur == EMPTY)
            return NULL;
        if (cur != addr)
            continue;
        uint64_t m = __atomic_load_n(&t[i].meta, __ATOMIC_ACQUIRE);
        if (META_SPACE(m) != space)
            continue;
        *meta = m;
        return &t[i];
    }
    *past = 1;
    return NULL;
}

/* the slot of (addr, space), or NULL */
static struct ct_live_slot *find(uint64_t addr, uint32_t space, uint64_t *meta)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE), *s, *t2;
    int past;
    if (!t || addr <= TOMB)
        return NULL;
    s = seek(t, TAB_SIZE - 1, ct_live_hash(addr), TAB_PROBES, addr, space, meta, &past);
    if (s || !past || !(t2 = __atomic_load_n(&tab2, __ATOMIC_ACQUIRE)))
        return s;
    return seek(t2, TAB2_SIZE - 1, hash2(addr), TAB2_PROBES, addr, space, meta, &past);
}

/* (addr, space) leaves the table: 1 with what it was */
static int take(uint64_t addr, uint32_t space, struct ct_live_taken *tk)
{
    uint64_t m = 0;
    struct ct_live_slot *s = find(addr, space, &m);
    if (!s)
        return 0;
    uint64_t e = __atomic_load_n(&s->epoch, __ATOMIC_RELAXED);
    /* a second free of the same address racing this one: only one wins the slot */
    uint64_t cur = addr;
    if (!__atomic_compare_exchange_n(&s->addr, &cur, TOMB, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return 0;
    tk->meta = m;
    tk->epoch = e;
    tk->state = 1;
    return 1;
}

static inline uint32_t row_of(int dev)
{
    return dev < 0 ? 0 : dev >= CT_LIVE_DEVICES ? CT_LIVE_ALL : (uint32_t)dev;
}

/* the row of who (the device + 1, 0 unknown): CT_LIVE_ALL alone for a device past the rows */
static inline uint32_t row_of_who(uint32_t who)
{
    return who == 0 ? 0 : who <= CT_LIVE_DEVICES ? who - 1 : CT_LIVE_ALL;
}

static inline uint32_t who_of(int kind, int dev)
{
    return kind == CT_KIND_HOST ? OWNER_HOST : dev < 0 ? 0 : dev >= 253 ? 254 : (uint32_t)dev + 1;
}

/* the row of a live slot's who and the row of a device */
static inline uint32_t row_in(uint32_t who)
{
    return who == OWNER_HOST ? HOSTROW : row_of_who(who);
}

/* size bytes of who enter the calling thread's counters: a new allocation (fresh), or one
 * whose free failed (put back: the device held it all along) */
static void count_in(uint32_t who, uint64_t size, uint64_t e, int fresh)
{
    struct ct_live_thr *t = me();
    if (!t)
        return;
    uint32_t r = row_in(who);
    if (fresh)
        bump(&t->allocs[r], 1);
    else
        bump(&t->frees[r], (uint64_t)-1);
    int64_t a = __atomic_sub_fetch(&t->room[r], (int64_t)size, __ATOMIC_SEQ_CST), b = 0;
    if (r != HOSTROW && r != ALL)
        b = __atomic_sub_fetch(&t->room[ALL], (int64_t)size, __ATOMIC_SEQ_CST);
    if ((a | b) < 0)
        ct_live_short(t, r);
    if (r != HOSTROW && __atomic_load_n(&ct_live_marks, __ATOMIC_ACQUIRE))
        ct_live_marks_alloc(r, size, e);
}

/* what tk took leaves the calling thread's counters */
static void count_out(const struct ct_live_taken *tk)
{
    struct ct_live_thr *t = me();
    if (!t)
        return;
    uint64_t size = META_SIZE(tk->meta);
    uint32_t r = row_in(META_WHO(tk->meta));
    bump(&t->frees[r], 1);
    __atomic_add_fetch(&t->room[r], (int64_t)size, __ATOMIC_SEQ_CST);
    if (r != HOSTROW && r != ALL)
        __atomic_add_fetch(&t->room[ALL], (int64_t)size, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&ct_live_gate, __ATOMIC_SEQ_CST) & CT_LIVE_STOP)
        ct_live_wait();
    if (r != HOSTROW && __atomic_load_n(&ct_live_marks, __ATOMIC_ACQUIRE))
        ct_live_own_free(r, size, tk->epoch);
}

/* tk's allocation, whose free failed, is counted again as it was */
static void put_back(uint64_t addr, const struct ct_live_taken *tk)
{
    uint64_t size = META_SIZE(tk->meta);
    uint32_t who = META_WHO(tk->meta);
    if (insert(addr, META_SPACE(tk->meta), size, who, tk->epoch))
        count_in(who, size, tk->epoch, 0);
    else
        __atomic_add_fetch(&ct_live.untracked, 1, __ATOMIC_RELAXED);
}

void ct_live_alloc_slow(int kind, int space, int dev, uint64_t addr, uint64_t size, int result)
{
    int host = kind == CT_KIND_HOST;
    if (result != 0) {
        struct ct_live_thr *t = me();
        if (t)
            bump(&t->failures[host ? HOSTROW : row_of(dev)], 1);
        return;
    }
    if (space == CT_SPACE_NONE || addr <= TOMB || size >= 1ull << 48)
        return;
    uint32_t who = who_of(kind, dev);
    uint64_t e = __atomic_load_n(&ct_live_epoch, __ATOMIC_ACQUIRE);
    if (!insert(addr, (uint32_t)space, size, who, e)) {
        __atomic_add_fetch(&ct_live.untracked, 1, __ATOMIC_RELAXED);
        return;
    }
    count_in(who, size, e, 1);
}

static int vmm_release(uint64_t handle, struct ct_live_taken *tk);

int ct_live_freeing_slow(int space, uint64_t addr, struct ct_live_taken *tk)
{
    if (!(space == CT_SPACE_VMM && vmm_release(addr, tk))) { /* else: ends at its last unmap */
        if (!take(addr, (uint32_t)space, tk))
            return CT_LIVE_UNKNOWN;
        count_out(tk);
    }
    return META_WHO(tk->meta) == OWNER_HOST ? -1 : (int)META_WHO(tk->meta) - 1;
}

static void vmm_unrelease(uint64_t handle);

void ct_live_unfree(int space, uint64_t addr, const struct ct_live_taken *tk)
{
    if (tk->state == 2)
        vmm_unrelease(addr);
    else if (tk->state == 1)
        put_back(addr, tk);
}

void ct_live_deny(int dev)
{
    struct ct_live_thr *t = me();
    if (t)
        bump(&t->denials[row_of(dev)], 1);
}

/* ---- reading: every thread's room taken, the counts summed ------------------------------ */
/* with mu and the stop flag: row r's live bytes */
static uint64_t live_of(uint32_t r)
{
    take_rooms(r);
    settle(r);
    return top[r] - (uint64_t)pool[r];
}

static void fill_row(struct ct_live_row *out, uint32_t r)
{
    uint64_t n[4] = {retired.allocs[r], retired.frees[r], retired.failures[r], retired.denials[r]};
    for (struct ct_live_thr *t = threads; t; t = t->next) {
        n[0] += __atomic_load_n(&t->allocs[r], __ATOMIC_RELAXED);
        n[1] += __atomic_load_n(&t->frees[r], __ATOMIC_RELAXED);
        n[2] += __atomic_load_n(&t->failures[r], __ATOMIC_RELAXED);
        n[3] += __atomic_load_n(&t->denials[r], __ATOMIC_RELAXED);
    }
    __atomic_store_n(&out->live, live_of(r), __ATOMIC_RELAXED);
    __atomic_store_n(&out->peak, peak[r] > top[r] ? peak[r] : top[r], __ATOMIC_RELAXED);
    __atomic_store_n(&out->allocs, n[0], __ATOMIC_RELAXED);
    __atomic_store_n(&out->frees, n[1], __ATOMIC_RELAXED);
    __atomic_store_n(&out->failures, n[2], __ATOMIC_RELAXED);
    __atomic_store_n(&out->denials, n[3], __ATOMIC_RELAXED);
}

/* the all-devices row's counts are its own (devices past the rows) and every device row's */
static void add_counts(struct ct_live_row *all, const struct ct_live_row *d)
{
    all->allocs += d->allocs;
    all->frees += d->frees;
    all->failures += d->failures;
    all->denials += d->denials;
}

CT_EXPORT const struct ct_live_stats *cudatrace_live(void)
{
    if (!__atomic_load_n(&ct_live.active, __ATOMIC_ACQUIRE))
        return &ct_live;
    stop_all();
    for (uint32_t r = 0; r < CT_LIVE_ROWS; r++)
        fill_row(&ct_live.dev[r], r);
    fill_row(&ct_live.host, HOSTROW);
    for (uint32_t r = 0; r < CT_LIVE_DEVICES; r++)
        add_counts(&ct_live.dev[ALL], &ct_live.dev[r]);
    __atomic_store_n(&ct_live.marks_open, __atomic_load_n(&ct_live_marks, __ATOMIC_ACQUIRE),
                     __ATOMIC_RELEASE);
    go_on();
    return &ct_live;
}

uint64_t ct_live_held(int dev)
{
    stop_all();
    uint64_t v = live_of(row_of(dev));
    go_on();
    return v;
}

/* ---- VMM mappings ----------------------------------------------------------------------------
 * cuMemCreate's handle is an allocation of the table above; its mappings and how many of them
 * each handle has are noted here, under vmm_mu (VMM calls are slow driver calls, never the
 * allocation path). cuMemRelease of a mapped handle marks it released; the cuMemUnmap of its
 * last mapping ends it, before the driver frees it (a failed unmap puts it back). */
#define VTAB_BITS 17
#define VTAB_SIZE (1u << VTAB_BITS)
#define V_EMPTY 0
#define V_TOMB 1
#define V_MAPPING 2
#define V_HANDLE 3
#define VMM_WALK 4096 /* mappings one cuMemUnmap may cover */
struct vent {
    uint64_t key;              /* a mapping's address or a handle */
    uint64_t size;             /* a mapping's */
    uint64_t handle;           /* a mapping's handle */
    uint32_t type;             /* V_* */
    uint32_t maps;             /* a handle's mappings */
    uint32_t released;         /* a handle: cuMemRelease seen while mapped */
    uint32_t pending;          /* a mapping: the thread whose cuMemUnmap is ending it */
    struct ct_live_taken took; /* a handle its last unmap ended (put back if that fails) */
};
static struct vent *vtab;
static uint32_t vtab_used;
static pthread_mutex_t vmm_mu = PTHREAD_MUTEX_INITIALIZER;

static uint32_t vhash(uint64_t key, uint32_t type)
{
    return (uint32_t)(((key ^ ((uint64_t)type << 60)) * 0x9E3779B97F4A7C15ull) >> (64 - VTAB_BITS));
}

/* with vmm_mu: the entry of (key, type), created when make; NULL when absent (or full) */
static struct vent *vget(uint64_t key, uint32_t type, int make)
{
    if (!vtab && make) {
        void *m = mmap(NULL, sizeof(struct vent) * VTAB_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        vtab = m == MAP_FAILED ? NULL : m;
    }
    if (!vtab)
        return NULL;
    struct vent *slot = NULL; /* where (key, type) would go */
    uint32_t i = vhash(key, type);
    for (uint32_t n = 0; n < VTAB_SIZE; n++, i = (i + 1) & (VTAB_SIZE - 1)) {
        struct vent *v = &vtab[i];
        if (v->type == type && v->key == key)
            return v;
        if (v->type == V_TOMB && !slot)
            slot = v;
        if (v->type == V_EMPTY) {
            if (!slot && vtab_used < VTAB_SIZE - VTAB_SIZE / 8) /* keep probes short */
                slot = v;
            break;
        }
    }
    if (!make || !slot)
        return NULL;
    if (slot->type == V_EMPTY)
        vtab_used++;
    *slot = (struct vent){.key = key, .type = type};
    return slot;
}

/* with vmm_mu: a mapping of h goes (pending: the unmap's driver call is still to come); the last
 * of a released handle ends the handle now */
static void vmm_unmap_one(struct vent *h)
{
    if (!h || !h->maps)
        return;
    if (--h->maps == 0 && h->released && take(h->key, CT_SPACE_VMM, &h->took))
        count_out(&h->took);
}

void ct_live_map(uint64_t ptr, uint64_t size, uint64_t handle)
{
    pthread_mutex_lock(&vmm_mu);
    struct vent *m = vget(ptr, V_MAPPING, 0);
    if (m) { /* a mapping whose unmap was missed: it is gone */
        struct vent *old = vget(m->handle, V_HANDLE, 0);
        m->type = V_TOMB;
        vmm_unmap_one(old);
        if (old && !old->maps && old->released)
            old->type = V_TOMB;
    }
    struct vent *h = vget(handle, V_HANDLE, 1);
    m = h ? vget(ptr, V_MAPPING, 1) : NULL;
    if (m) {
        m->size = size;
        m->handle = handle;
        h->maps++;
    }
    pthread_mutex_unlock(&vmm_mu);
}

/* cuMemRelease(handle) is about to be called: 1 when the handle is mapped (it ends at its last
 * unmap: tk->state 2, nothing leaves the counters now); 0: end it now (ct_live_freeing_slow) */
static int vmm_release(uint64_t handle, struct ct_live_taken *tk)
{
    int deferred = 0;
    pthread_mutex_lock(&vmm_mu);
    struct vent *h = vget(handle, V_HANDLE, 0);
    if (h && h->maps) {
        h->released = 1;
        tk->meta = 0;
        find(handle, CT_SPACE_VMM, &tk->meta); /* its device, for the event */
        tk->state = 2;
        deferred = 1;
    } else if (h) {
        h->type = V_TOMB; /* not mapped: nothing more to note of it */
    }
    pthread_mutex_unlock(&vmm_mu);
    return deferred;
}

static void vmm_unrelease(uint64_t handle)
{
    pthread_mutex_lock(&vmm_mu);
    struct vent *h = vget(handle, V_HANDLE, 0);
    if (h)
        h->released = 0;
    pthread_mutex_unlock(&vmm_mu);
}

/* cuMemUnmap(ptr, size) covers the mappings from ptr on, one after another (as the budget
 * walks them: budget.c ct_budget_unmap) */
void ct_live_unmapping(uint64_t ptr, uint64_t size)
{
    uint32_t tid = ct_gettid();
    pthread_mutex_lock(&vmm_mu);
    uint64_t cur = ptr, end = ptr + size;
    for (int n = 0; cur < end && n < VMM_WALK; n++) {
        struct vent *m = vget(cur, V_MAPPING, 0);
        if (!m || !m->size || m->pending)
            break;
        m->pending = tid;
        vmm_unmap_one(vget(m->handle, V_HANDLE, 0));
        cur += m->size;
    }
    pthread_mutex_unlock(&vmm_mu);
}

void ct_live_unmapped(uint64_t ptr, uint64_t size, int ok)
{
    uint32_t tid = ct_gettid();
    pthread_mutex_lock(&vmm_mu);
    uint64_t cur = ptr, end = ptr + size;
    for (int n = 0; cur < end && n < VMM_WALK; n++) {
        struct vent *m = vget(cur, V_MAPPING, 0);
        if (!m || m->pending != tid)
            break;
        struct vent *h = vget(m->handle, V_HANDLE, 0);
        cur += m->size;
        if (ok) {
            m->type = V_TOMB;
            if (h && !h->maps && h->released)
                h->type = V_TOMB; /* ended by this unmap */
            continue;
        }
        m->pending = 0; /* the driver kept the mapping: so does the count */
        if (!h)
            continue;
        if (h->maps++ == 0 && h->took.state == 1) {
            put_back(h->key, &h->took);
            h->took.state = 0;
        }
    }
    pthread_mutex_unlock(&vmm_mu);
}

/* ---- marks ------------------------------------------------------------------------------------
 * A mark's slot is claimed by setting its bit, every room taken first: each row's live bytes are
 * then exact, the mark's base and peak start there, and top starts again from them (the peak of
 * the process keeps what top reached), so the mark's peak follows every rise from now on. Its own
 * allocations are those of its epoch or later: the epoch moves with its bit set, so an allocation
 * that reads the new epoch also sees the mark (and its bit); a free takes off only what its
 * allocation added (the same test). */
CT_EXPORT int cudatrace_live_mark_open(void)
{
    stop_all();
    uint64_t m = __atomic_load_n(&ct_live_marks, __ATOMIC_ACQUIRE);
    if (m == ~0ull) {
        go_on();
        return -1;
    }
    int i = __builtin_ctzll(~m);
    struct ct_live_mark *k = &ct_live.marks[i];
    for (uint32_t r = 0; r < CT_LIVE_ROWS; r++) {
        uint64_t now = live_of(r);
        if (top[r] > peak[r])
            peak[r] = top[r];
        top[r] = now; /* the rooms are all taken: pool = top - live */
        pool[r] = 0;
        __atomic_store_n(&k->base[r], now, __ATOMIC_RELAXED);
        __atomic_store_n(&k->peak[r], now, __ATOMIC_RELAXED);
        __atomic_store_n(&k->own[r], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&k->own_peak[r], 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&k->opened_ns, ct_now_ns(), __ATOMIC_RELAXED);
    uint64_t e = __atomic_load_n(&ct_live_epoch, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&k->epoch, e, __ATOMIC_RELEASE);
    __atomic_or_fetch(&ct_live_marks, 1ull << i, __ATOMIC_ACQ_REL);
    __atomic_or_fetch(&ct_live_gate, CT_LIVE_MARKED, __ATOMIC_SEQ_CST);
    __atomic_store_n(&ct_live.marks_open, __atomic_load_n(&ct_live_marks, __ATOMIC_RELAXED),
                     __ATOMIC_RELEASE);
    __atomic_store_n(&ct_live_epoch, e, __ATOMIC_RELEASE);
    go_on();
    return i;
}

CT_EXPORT void cudatrace_live_mark_close(int slot)
{
    if (slot < 0 || slot >= CT_LIVE_MARKS)
        return;
    __atomic_store_n(&ct_live.marks[slot].epoch, CLOSED, __ATOMIC_RELEASE);
    pthread_mutex_lock(&mu); /* (the last mark closed: the gate opens) */
    if (!__atomic_and_fetch(&ct_live_marks, ~(1ull << slot), __ATOMIC_ACQ_REL))
        __atomic_and_fetch(&ct_live_gate, ~CT_LIVE_MARKED, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&mu);
    __atomic_and_fetch(&ct_live.marks_open, ~(1ull << slot), __ATOMIC_ACQ_REL);
}

void ct_live_atfork_child(void)
{
    /* the forked child holds none of its parent's device memory (a CUDA context does not
     * survive fork); the tables' pages are a private copy: dropped, mapped anew when used; the
     * parent's threads are not here: their counters go */
    struct ct_live_slot *t = ct_live_tab;
    ct_live_tab = NULL;
    if (t)
        munmap(t, sizeof(struct ct_live_slot) * TAB_SIZE);
    if (tab2)
        munmap(tab2, sizeof(struct ct_live_slot) * TAB2_SIZE);
    tab2 = NULL;
    if (vtab)
        munmap(vtab, sizeof(struct vent) * VTAB_SIZE);
    vtab = NULL;
    vtab_used = 0;
    pthread_mutex_init(&vmm_mu, NULL);
    pthread_mutex_init(&mu, NULL);
    for (struct ct_live_thr *x = threads, *next; x; x = next) {
        next = x->next;
        free(x);
    }
    threads = NULL;
    if (key_ok)
        pthread_setspecific(exit_key, NULL);
    ct_live_me = NULL;
    memset(&retired, 0, sizeof retired);
    memset(pool, 0, sizeof pool);
    memset(top, 0, sizeof top);
    memset(peak, 0, sizeof peak);
    ct_live_gate = 0;
    ct_live_marks = 0;
    uint32_t active = ct_live.active;
    memset(&ct_live, 0, sizeof ct_live);
    ct_live.version = CT_LIVE_VERSION;
    marks_closed();
    ct_live.active = active;
}
