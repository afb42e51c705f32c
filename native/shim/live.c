/* live.c - per-device live bytes, peaks, counts and marks, kept for readers inside the process
 * (live_format.h). The hot path (inline in live.h: an allocation whose home slot is free, a
 * free found in its home slot) adds a few relaxed atomics: the row's live, the all-devices live,
 * an atomic max on both peaks and on each open mark's peaks, the open marks' own bytes, and one
 * slot of the address table; everything else comes here. Nothing an allocation or a reader does
 * waits on another thread: a reader (cudatrace_live) gets a pointer and reads words. Two things
 * off that path take a lock of this process: opening a mark (openers wait on each other only),
 * and the VMM mappings of cuMemMap / cuMemUnmap / cuMemRelease of a mapped handle (slow driver
 * calls, a table of their own below). */
#include "live.h"

#include <pthread.h>
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
#define CLOSED UINT64_MAX /* a closed mark's epoch: no allocation is its own */

struct ct_live_stats ct_live = {.version = CT_LIVE_VERSION};
struct ct_live_slot *ct_live_tab;
uint64_t ct_live_epoch;
static pthread_mutex_t marks_mu = PTHREAD_MUTEX_INITIALIZER; /* mark openers, one at a time */

CT_EXPORT const struct ct_live_stats *cudatrace_live(void) { return &ct_live; }

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

/* (addr, space) enters the table with epoch e; 0 when the table is full or unmapped */
static int insert(uint64_t addr, uint32_t space, uint64_t size, uint32_t who, uint64_t e)
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
                __atomic_store_n(&t[i].epoch, e, __ATOMIC_RELAXED);
                __atomic_store_n(&t[i].meta, CT_LIVE_META(size, who, space), __ATOMIC_RELEASE);
                return 1;
            }
        }
    }
    return 0;
}

/* the slot of (addr, space), or NULL */
static struct ct_live_slot *find(uint64_t addr, uint32_t space, uint64_t *meta)
{
    struct ct_live_slot *t = __atomic_load_n(&ct_live_tab, __ATOMIC_ACQUIRE);
    if (!t || addr <= TOMB)
        return NULL;
    uint32_t i = ct_live_hash(addr);
    for (int n = 0; n < TAB_PROBES; n++, i = (i + 1) & (TAB_SIZE - 1)) {
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
    return NULL;
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

/* size bytes of who enter the counters: a new allocation (fresh), or one whose free failed
 * (put back: the device held it all along) */
static void count_in(uint32_t who, uint64_t size, uint64_t e, int fresh)
{
    if (who == OWNER_HOST) {
        struct ct_live_row *row = &ct_live.host;
        __atomic_add_fetch(fresh ? &row->allocs : &row->frees, fresh ? 1 : -1ull, __ATOMIC_RELAXED);
        ct_live_amax(&row->peak, __atomic_add_fetch(&row->live, size, __ATOMIC_RELAXED));
        return;
    }
    uint32_t r = row_of_who(who);
    if (fresh && r != CT_LIVE_ALL) {
        ct_live_count_device(r, size, e);
        return;
    }
    uint64_t now = 0;
    if (r != CT_LIVE_ALL) {
        struct ct_live_row *row = &ct_live.dev[r];
        __atomic_sub_fetch(&row->frees, 1, __ATOMIC_RELAXED);
        now = __atomic_add_fetch(&row->live, size, __ATOMIC_RELAXED);
        ct_live_amax(&row->peak, now);
    }
    struct ct_live_row *all_row = &ct_live.dev[CT_LIVE_ALL];
    __atomic_add_fetch(fresh ? &all_row->allocs : &all_row->frees, fresh ? 1 : -1ull,
                       __ATOMIC_RELAXED);
    uint64_t all = __atomic_add_fetch(&all_row->live, size, __ATOMIC_RELAXED);
    ct_live_amax(&all_row->peak, all);
    for (uint64_t m = __atomic_load_n(&ct_live.marks_open, __ATOMIC_ACQUIRE); m; m &= m - 1) {
        struct ct_live_mark *k = &ct_live.marks[__builtin_ctzll(m)];
        if (r != CT_LIVE_ALL)
            ct_live_amax(&k->peak[r], now);
        ct_live_amax(&k->peak[CT_LIVE_ALL], all);
        if (e >= __atomic_load_n(&k->epoch, __ATOMIC_ACQUIRE))
            ct_live_own(k, r, (int64_t)size);
    }
}

/* what tk took leaves the counters */
static void count_out(const struct ct_live_taken *tk)
{
    uint64_t size = META_SIZE(tk->meta);
    uint32_t who = META_WHO(tk->meta);
    if (who == OWNER_HOST) {
        __atomic_add_fetch(&ct_live.host.frees, 1, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&ct_live.host.live, size, __ATOMIC_RELAXED);
        return;
    }
    uint32_t r = row_of_who(who);
    if (r != CT_LIVE_ALL) {
        __atomic_add_fetch(&ct_live.dev[r].frees, 1, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&ct_live.dev[r].live, size, __ATOMIC_RELAXED);
    }
    __atomic_add_fetch(&ct_live.dev[CT_LIVE_ALL].frees, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&ct_live.dev[CT_LIVE_ALL].live, size, __ATOMIC_RELAXED);
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
        struct ct_live_row *row = host ? &ct_live.host : &ct_live.dev[row_of(dev)];
        __atomic_add_fetch(&row->failures, 1, __ATOMIC_RELAXED);
        if (!host && row != &ct_live.dev[CT_LIVE_ALL])
            __atomic_add_fetch(&ct_live.dev[CT_LIVE_ALL].failures, 1, __ATOMIC_RELAXED);
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
    if (row_of(dev) != CT_LIVE_ALL)
        __atomic_add_fetch(&ct_live.dev[row_of(dev)].denials, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&ct_live.dev[CT_LIVE_ALL].denials, 1, __ATOMIC_RELAXED);
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
 * A mark's slot is claimed by setting its bit; its peaks start at zero and take what is live
 * right after, so an allocation seen by the mark is either in that reading or maxed in after.
 * Its own allocations are those of its epoch or later: openers move ct_live_epoch one at a
 * time, storing the mark's epoch first, so an allocation that reads the new epoch also sees the
 * mark's (and its bit); a free takes off only what its allocation added (the same test). */
CT_EXPORT int cudatrace_live_mark_open(void)
{
    pthread_mutex_lock(&marks_mu);
    uint64_t m = __atomic_load_n(&ct_live.marks_open, __ATOMIC_ACQUIRE);
    int i;
    do {
        if (m == ~0ull) {
            pthread_mutex_unlock(&marks_mu);
            return -1;
        }
        i = __builtin_ctzll(~m);
    } while (!__atomic_compare_exchange_n(&ct_live.marks_open, &m, m | (1ull << i), 1,
                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    struct ct_live_mark *k = &ct_live.marks[i];
    for (int r = 0; r < CT_LIVE_ROWS; r++) {
        __atomic_store_n(&k->peak[r], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&k->own[r], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&k->own_peak[r], 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&k->opened_ns, ct_now_ns(), __ATOMIC_RELAXED);
    for (int r = 0; r < CT_LIVE_ROWS; r++) {
        uint64_t now = __atomic_load_n(&ct_live.dev[r].live, __ATOMIC_RELAXED);
        __atomic_store_n(&k->base[r], now, __ATOMIC_RELAXED);
        ct_live_amax(&k->peak[r], now);
    }
    uint64_t e = __atomic_load_n(&ct_live_epoch, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&k->epoch, e, __ATOMIC_RELEASE);
    __atomic_store_n(&ct_live_epoch, e, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&marks_mu);
    return i;
}

CT_EXPORT void cudatrace_live_mark_close(int slot)
{
    if (slot < 0 || slot >= CT_LIVE_MARKS)
        return;
    __atomic_store_n(&ct_live.marks[slot].epoch, CLOSED, __ATOMIC_RELEASE);
    __atomic_and_fetch(&ct_live.marks_open, ~(1ull << slot), __ATOMIC_ACQ_REL);
}

void ct_live_atfork_child(void)
{
    /* the forked child holds none of its parent's device memory (a CUDA context does not
     * survive fork); the tables' pages are a private copy: dropped, mapped anew when used */
    struct ct_live_slot *t = ct_live_tab;
    ct_live_tab = NULL;
    if (t)
        munmap(t, sizeof(struct ct_live_slot) * TAB_SIZE);
    if (vtab)
        munmap(vtab, sizeof(struct vent) * VTAB_SIZE);
    vtab = NULL;
    vtab_used = 0;
    pthread_mutex_init(&vmm_mu, NULL);
    pthread_mutex_init(&marks_mu, NULL);
    uint32_t active = ct_live.active;
    memset(&ct_live, 0, sizeof ct_live);
    ct_live.version = CT_LIVE_VERSION;
    marks_closed();
    ct_live.active = active;
}
