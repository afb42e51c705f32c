/* aggregate.c - --aggregate: what a report needs of a long run, in bounded space.
 *
 * No ALLOC/FREE event is written. The process keeps (under its own mutex, never shared across
 * processes):
 *   keys   one per site and size (stack, API, runtime API, kind, space, device, size): totals
 *          over the run, what is live now, what was live at the process's device peak and at
 *          the peak of the key's group (its device, or pinned host memory). At most MAX_KEYS:
 *          past that, a site's new sizes share one "mixed sizes" key, and past that a group's
 *          catch-all key takes them.
 *   live   (space, address) -> key and size, to end an allocation at its free.
 * A free leaves the counts when it is about to be called (ct_agg_freeing, before the driver can
 * give its memory to another thread), an allocation enters them when its call has succeeded: at
 * every moment what is counted is held by the device (and the budget ledger), so no peak here
 * exceeds the device's or the budget. The free's event then settles it: a failed free counts
 * the allocation again.
 * "Live at the peak" costs O(1) an event: each peak bumps an epoch; a key about to change
 * saves its value first if it has not changed since the last peak, so a key's value at the
 * peak is the saved one if it changed since, else the current one.
 *
 * Snapshots (everything above, struct ct_snap_*) go into two SNAPSLOT records of the trace
 * file, in turn: zero the slot's seq, write, store seq. A kill while one is written leaves the
 * other whole. One is written when a peak has grown by more than 1% and 1 MiB since the last
 * one, when something changed and CUDATRACE_AGG_INTERVAL seconds (60) have passed, and at
 * exit. Failures and denials are written as events (up to CAP_EVENTS each), memory queries up
 * to CAP_MEMINFO; the rest are counted.
 */
#include "aggregate.h"

#include <pthread.h>

#include "events.h"
#include "util.h"
#include "writer.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_KEYS 8000  /* a snapshot of them all fits a record (< CT_CHUNK_SIZE / 2) */
#define MIXED_KEYS 512 /* kept for "mixed sizes" keys once the table is nearly full */
#define KEY_HASH 16384 /* power of two, > 2 * MAX_KEYS */
#define CAP_EVENTS 65536
#define CAP_MEMINFO 4096
#define MIN_STEP (1ull << 20)

struct key {
    struct ct_snap_key k;
    uint64_t pmark, gmark; /* the epochs the saved values belong to */
    uint64_t p_count, p_bytes, g_count, g_bytes;
    uint8_t dev; /* counts toward the device peak */
};

struct group {
    uint64_t cur, peak, peak_ts, allocs, epoch, snap_peak;
};

struct live {
    uint64_t addr;
    uint64_t size;
    uint32_t key;
    uint8_t space, used, pad[2];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct key *keys; /* mmap'd, MAX_KEYS */
static uint32_t *khash;  /* key index + 1, 0: empty */
static uint32_t nkeys;
static struct live *lt; /* mmap'd, lcap entries */
static uint64_t lcap, lused;
static struct group grp[CT_SNAP_GROUPS];
static struct group proc; /* device memory of every device */
static int proc_found;
static struct ct_snap_head tot; /* counts (the head's seq/checksum/... are set when written) */
static uint64_t n_failed_written, n_denied_written, n_meminfo_written;
static uint64_t last_snap_ts, interval_ns, nsnap;
static int dirty, broken;

/* the free this thread is calling (one at a time: the shim does not nest its calls) */
enum {
    FREEING_NONE,
    FREEING_LIVE,
    FREEING_UNKNOWN
};
static CT_TLS struct {
    uint64_t addr, size;
    uint32_t key;
    uint8_t space;
    uint8_t state; /* FREEING_*: the allocation left the counts, or none was live there */
} freeing;

/* the two snapshot places */
static struct {
    uint8_t *body; /* after the record header */
    uint32_t cap;
    uint64_t chunk;
} slots[2];
static int next_slot;

static int dev_kind(uint8_t k)
{
    return k == CT_KIND_DEVICE || k == CT_KIND_PITCH || k == CT_KIND_MANAGED ||
           k == CT_KIND_ASYNC || k == CT_KIND_VMM || k == CT_KIND_ARRAY || k == CT_KIND_GRAPH;
}

static uint32_t group_of(const struct ct_event *e)
{
    if (e->kind == CT_KIND_HOST)
        return CT_SNAP_HOST_GROUP;
    int d = e->device;
    return d < 0 ? 0 : d > CT_SNAP_GROUPS - 3 ? CT_SNAP_GROUPS - 2 : (uint32_t)d + 1;
}

static void *map_zero(size_t bytes)
{
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return m == MAP_FAILED ? NULL : m;
}

static int setup(void)
{
    if (keys)
        return 1;
    if (broken)
        return 0;
    keys = map_zero(sizeof(struct key) * MAX_KEYS);
    khash = map_zero(sizeof(uint32_t) * KEY_HASH);
    if (!keys || !khash) {
        broken = 1;
        return 0;
    }
    long secs = ct_setting_num(CT_SET_AGG_INTERVAL);
    if (secs <= 0)
        secs = ct_setting_default_num(CT_SET_AGG_INTERVAL);
    interval_ns = (uint64_t)secs * 1000000000ull;
    for (uint32_t g = 0; g < CT_SNAP_GROUPS; g++)
        grp[g].epoch = 1;
    proc.epoch = 1;
    /* keys 0..CT_SNAP_GROUPS-1: each group's catch-all (the table full) */
    for (uint32_t g = 0; g < CT_SNAP_GROUPS; g++) {
        struct key *k = &keys[g];
        k->k.kind = g == CT_SNAP_HOST_GROUP ? CT_KIND_HOST : CT_KIND_DEVICE;
        k->k.space = g == CT_SNAP_HOST_GROUP ? CT_SPACE_HOSTPTR : CT_SPACE_DEVPTR;
        k->k.device = g == CT_SNAP_HOST_GROUP || g == 0 ? -1 : (int32_t)g - 1;
        k->k.group = (uint8_t)g;
        k->k.flags = CT_SNAP_KEY_MIXED;
        k->dev = g != CT_SNAP_HOST_GROUP;
    }
    nkeys = CT_SNAP_GROUPS;
    return 1;
}

static uint32_t khash_of(const struct ct_event *e, uint64_t size, uint8_t flags)
{
    uint64_t h =
        size * 0x9E3779B97F4A7C15ull ^ ((uint64_t)e->stack << 32 | e->api) * 0xC2B2AE3D27D4EB4Full;
    h ^= ((uint64_t)e->rt_api << 40 | (uint64_t)e->kind << 32 | (uint64_t)e->space << 24 |
          (uint64_t)(uint32_t)e->device << 8 | flags) *
         0x165667B19E3779F9ull;
    h ^= h >> 31;
    return (uint32_t)h & (KEY_HASH - 1);
}

static int key_is(const struct key *k, const struct ct_event *e, uint64_t size, uint8_t flags)
{
    return k->k.size == size && k->k.stack == e->stack && k->k.api == e->api &&
           k->k.rt_api == e->rt_api && k->k.kind == e->kind && k->k.space == e->space &&
           k->k.device == e->device && k->k.flags == flags;
}

static uint32_t find_key(const struct ct_event *e, uint64_t size, uint8_t flags, uint32_t limit)
{
    uint32_t i = khash_of(e, size, flags);
    for (;;) {
        uint32_t v = khash[i];
        if (!v)
            break;
        if (key_is(&keys[v - 1], e, size, flags))
            return v - 1;
        i = (i + 1) & (KEY_HASH - 1);
    }
    if (nkeys >= limit)
        return UINT32_MAX;
    struct key *k = &keys[nkeys];
    memset(k, 0, sizeof *k);
    k->k.size = size;
    k->k.stack = e->stack;
    k->k.api = e->api;
    k->k.rt_api = e->rt_api;
    k->k.kind = e->kind;
    k->k.space = e->space;
    k->k.device = e->device;
    k->k.group = (uint8_t)group_of(e);
    k->k.flags = flags;
    k->dev = (uint8_t)dev_kind(e->kind);
    khash[i] = nkeys + 1;
    return nkeys++;
}

static uint32_t key_for(const struct ct_event *e)
{
    uint32_t k = find_key(e, e->size, 0, MAX_KEYS - MIXED_KEYS);
    if (k == UINT32_MAX)
        k = find_key(e, 0, CT_SNAP_KEY_MIXED, MAX_KEYS);
    return k == UINT32_MAX ? group_of(e) : k;
}

/* ---- the live table: open addressing, backward-shift deletion ---- */
static inline uint64_t lhash(uint64_t addr, uint8_t space)
{
    uint64_t h = (addr ^ ((uint64_t)space << 56)) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static struct live *lfind(uint64_t addr, uint8_t space)
{
    if (!lcap)
        return NULL;
    uint64_t i = lhash(addr, space) & (lcap - 1);
    for (;;) {
        struct live *x = &lt[i];
        if (!x->used)
            return NULL;
        if (x->addr == addr && x->space == space)
            return x;
        i = (i + 1) & (lcap - 1);
    }
}

static int lgrow(void)
{
    uint64_t nc = lcap ? lcap * 2 : 4096;
    struct live *n = map_zero(nc * sizeof *n);
    if (!n)
        return 0;
    for (uint64_t i = 0; i < lcap; i++) {
        if (!lt[i].used)
            continue;
        uint64_t j = lhash(lt[i].addr, lt[i].space) & (nc - 1);
        while (n[j].used)
            j = (j + 1) & (nc - 1);
        n[j] = lt[i];
    }
    if (lt)
        munmap(lt, lcap * sizeof *lt);
    lt = n;
    lcap = nc;
    return 1;
}

static struct live *linsert(uint64_t addr, uint8_t space)
{
    if ((lused + 1) * 2 > lcap && !lgrow())
        return NULL;
    uint64_t i = lhash(addr, space) & (lcap - 1);
    while (lt[i].used)
        i = (i + 1) & (lcap - 1);
    lt[i].addr = addr;
    lt[i].space = space;
    lt[i].used = 1;
    lused++;
    return &lt[i];
}

static void ldelete(struct live *x)
{
    uint64_t mask = lcap - 1, i = (uint64_t)(x - lt), j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!lt[j].used)
            break;
        uint64_t k = lhash(lt[j].addr, lt[j].space) & mask;
        if ((i <= j) ? (k <= i || k > j) : (k <= i && k > j)) {
            lt[i] = lt[j];
            i = j;
        }
    }
    lt[i].used = 0;
    lused--;
}

/* ---- counts and peaks ---- */
static void before_change(struct key *k)
{
    if (k->dev && k->pmark != proc.epoch) {
        k->p_count = k->k.cur_count;
        k->p_bytes = k->k.cur_bytes;
        k->pmark = proc.epoch;
    }
    struct group *g = &grp[k->k.group];
    if (k->gmark != g->epoch) {
        k->g_count = k->k.cur_count;
        k->g_bytes = k->k.cur_bytes;
        k->gmark = g->epoch;
    }
}

static void count_freed(struct key *k, uint64_t size)
{
    k->k.frees++;
    k->k.freed_bytes += size;
}

static void end_live(struct live *x, int freed)
{
    struct key *k = &keys[x->key];
    before_change(k);
    k->k.cur_count--;
    k->k.cur_bytes -= x->size;
    if (freed)
        count_freed(k, x->size);
    grp[k->k.group].cur -= x->size;
    if (k->dev)
        proc.cur -= x->size;
    ldelete(x);
}

static int snapshot(uint32_t reason, uint64_t ts);

static void maybe_snapshot(uint64_t ts)
{
    int grew = 0;
    uint64_t step = proc.snap_peak / 100 > MIN_STEP ? proc.snap_peak / 100 : MIN_STEP;
    if (proc.peak > proc.snap_peak + step)
        grew = 1;
    for (uint32_t g = 0; g < CT_SNAP_GROUPS && !grew; g++) {
        step = grp[g].snap_peak / 100 > MIN_STEP ? grp[g].snap_peak / 100 : MIN_STEP;
        if (grp[g].peak > grp[g].snap_peak + step)
            grew = 1;
    }
    if (grew)
        snapshot(CT_SNAP_PEAK, ts);
    else if (!nsnap || (dirty && ts - last_snap_ts >= interval_ns))
        snapshot(CT_SNAP_TIMER, ts);
}

/* size bytes of key ki live at addr from ts (alloc: a new allocation, else one counted again):
 * the counts and the peaks they reach */
static void count_live(uint32_t ki, uint64_t addr, uint8_t space, uint64_t size, uint64_t ts,
                       int alloc)
{
    struct live *old = lfind(addr, space);
    if (old) /* an address still live: the old one is gone (as the replay does) */
        end_live(old, 0);
    struct live *x = linsert(addr, space);
    if (!x) {
        tot.untracked++;
        return;
    }
    struct key *k = &keys[ki];
    x->key = ki;
    x->size = size;
    before_change(k);
    if (alloc) {
        k->k.allocs++;
        k->k.alloc_bytes += size;
        if (!k->k.first_ts)
            k->k.first_ts = ts;
        k->k.last_ts = ts;
    }
    k->k.cur_count++;
    k->k.cur_bytes += size;
    struct group *g = &grp[k->k.group];
    g->cur += size;
    g->allocs += (uint64_t)alloc;
    if (g->cur > g->peak || (alloc && g->allocs == 1)) {
        g->peak = g->cur;
        g->peak_ts = ts;
        g->epoch++;
    }
    if (k->dev) {
        proc.cur += size;
        proc.allocs += (uint64_t)alloc;
        if (proc.cur > proc.peak || (alloc && !proc_found)) {
            proc.peak = proc.cur;
            proc.peak_ts = ts;
            proc.epoch++;
            proc_found = 1;
        }
    }
}

static void on_alloc(const struct ct_event *e)
{
    count_live(key_for(e), e->addr, e->space, e->size, e->ts_ns, 1);
}

void ct_agg_freeing(uint8_t space, uint64_t addr)
{
    freeing.state = FREEING_NONE;
    if (!addr)
        return;
    pthread_mutex_lock(&mu);
    struct live *x = keys ? lfind(addr, space) : NULL;
    if (x) {
        freeing.addr = addr;
        freeing.space = space;
        freeing.size = x->size;
        freeing.key = x->key;
        freeing.state = FREEING_LIVE;
        end_live(x, 0);
    } else if (keys) {
        freeing.state = FREEING_UNKNOWN;
    }
    pthread_mutex_unlock(&mu);
}

/* the event of a free announced by ct_agg_freeing (its address is 0 when it failed) */
static void on_free_settled(const struct ct_event *e)
{
    int live = freeing.state == FREEING_LIVE;
    freeing.state = FREEING_NONE;
    if (e->result != 0) { /* nothing was freed: the allocation counts again, as it was */
        tot.other++;
        if (live)
            count_live(freeing.key, freeing.addr, freeing.space, freeing.size, e->ts_ns, 0);
    } else if (live) {
        tot.frees++;
        count_freed(&keys[freeing.key], freeing.size);
    } else {
        tot.unmatched_frees++;
    }
}

static int write_capped(const struct ct_event *e, uint64_t *written, uint64_t cap)
{
    if (*written >= cap) {
        tot.events_not_written++;
        return 0;
    }
    if (!ct_event_write(e))
        return 0;
    (*written)++;
    return 1;
}

int ct_agg_event(const struct ct_event *e)
{
    pthread_mutex_lock(&mu);
    if (!setup()) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    int wrote = 0;
    dirty = 1;
    if (!tot.first_ts)
        tot.first_ts = e->ts_ns;
    tot.last_ts = e->ts_ns;
    switch (e->op) {
    case CT_OP_ALLOC:
        if (e->result != 0) {
            tot.failed++;
            wrote = write_capped(e, &n_failed_written, CAP_EVENTS);
        } else if (dev_kind(e->kind) || e->kind == CT_KIND_HOST) {
            tot.allocs++;
            on_alloc(e);
        } else {
            tot.other++;
        }
        break;
    case CT_OP_FREE: {
        if (freeing.state != FREEING_NONE) {
            on_free_settled(e);
            break;
        }
        struct live *x = e->result == 0 && e->addr ? lfind(e->addr, e->space) : NULL;
        if (x) {
            tot.frees++;
            end_live(x, 1);
        } else if (e->result == 0 && e->addr) {
            tot.unmatched_frees++;
        } else {
            tot.other++;
        }
        break;
    }
    case CT_OP_DENY:
        tot.denied++;
        wrote = write_capped(e, &n_denied_written, CAP_EVENTS);
        break;
    case CT_OP_MEMINFO:
        tot.meminfo++;
        wrote = write_capped(e, &n_meminfo_written, CAP_MEMINFO);
        break;
    default:
        tot.other++;
        break;
    }
    maybe_snapshot(e->ts_ns);
    pthread_mutex_unlock(&mu);
    return wrote;
}

/* ---- snapshots ---- */
static uint64_t fnv(const uint8_t *p, uint64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* two new slots of cap bytes of body each; 0 when the file cannot take them */
static int new_slots(uint32_t cap)
{
    for (int i = 0; i < 2; i++) {
        ct_slot s;
        if (!ct_rec_begin(&s, (uint32_t)sizeof(struct ct_rec_hdr) + cap))
            return 0;
        memset(s.p + sizeof(struct ct_rec_hdr), 0, s.size - sizeof(struct ct_rec_hdr));
        ct_rec_commit(&s, CT_REC_SNAPSLOT);
        slots[i].body = s.p + sizeof(struct ct_rec_hdr);
        slots[i].cap = s.size - (uint32_t)sizeof(struct ct_rec_hdr);
        slots[i].chunk = s.chunk;
    }
    next_slot = 0;
    return 1;
}

static int snapshot(uint32_t reason, uint64_t ts)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < nkeys; i++)
        n += keys[i].k.allocs != 0;
    uint64_t need = sizeof(struct ct_snap_head) + sizeof(struct ct_snap_group) * CT_SNAP_GROUPS +
                    sizeof(struct ct_snap_key) * (uint64_t)n;
    /* a reservation held while writing: the writer unmaps no chunk while another is pending */
    ct_slot guard;
    if (!ct_rec_begin(&guard, 8))
        return 0;
    uint64_t cur_chunk = ct_writer_pos() / CT_CHUNK_SIZE;
    if (!slots[0].body || slots[0].cap < need || slots[1].cap < need ||
        slots[0].chunk + 2 < cur_chunk || slots[1].chunk + 2 < cur_chunk) {
        uint64_t cap = need * 4 < 65536 ? 65536 : need * 4; /* few regrowths: <= 3 pairs */
        uint64_t most = CT_CHUNK_SIZE / 2 - sizeof(struct ct_rec_hdr);
        if (cap > most)
            cap = most;
        if (need > cap || !new_slots((uint32_t)cap)) {
            ct_rec_commit(&guard, CT_REC_PAD);
            return 0;
        }
    }
    uint8_t *b = slots[next_slot].body;
    struct ct_snap_head *h = (struct ct_snap_head *)b;
    __atomic_store_n(&h->seq, 0, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    struct ct_snap_group *gs = (struct ct_snap_group *)(b + sizeof *h);
    for (uint32_t g = 0; g < CT_SNAP_GROUPS; g++) {
        struct ct_snap_group o = {0, 0, grp[g].cur, grp[g].peak, grp[g].peak_ts, grp[g].allocs};
        o.device = g == 0 || g == CT_SNAP_HOST_GROUP ? -1 : (int32_t)g - 1;
        memcpy(&gs[g], &o, sizeof o);
    }
    struct ct_snap_key *ks = (struct ct_snap_key *)(gs + CT_SNAP_GROUPS);
    uint32_t w = 0;
    for (uint32_t i = 0; i < nkeys; i++) {
        const struct key *k = &keys[i];
        if (!k->k.allocs)
            continue;
        struct ct_snap_key o = k->k;
        int psaved = k->dev && k->pmark == proc.epoch;
        o.peak_count = !k->dev ? 0 : psaved ? k->p_count : k->k.cur_count;
        o.peak_bytes = !k->dev ? 0 : psaved ? k->p_bytes : k->k.cur_bytes;
        int gsaved = k->gmark == grp[k->k.group].epoch;
        o.gpeak_count = gsaved ? k->g_count : k->k.cur_count;
        o.gpeak_bytes = gsaved ? k->g_bytes : k->k.cur_bytes;
        memcpy(&ks[w++], &o, sizeof o);
    }
    nsnap++;
    struct ct_snap_head o = tot;
    o.seq = 0;
    o.body_bytes = need - sizeof *h;
    o.ts_ns = ts;
    o.reason = reason;
    o.nkeys = w;
    o.cur_bytes = proc.cur;
    o.peak_bytes = proc.peak;
    o.peak_ts = proc.peak_ts;
    o.snapshots = nsnap;
    o.checksum = fnv(b + sizeof *h, o.body_bytes);
    memcpy((uint8_t *)h + sizeof h->seq, (uint8_t *)&o + sizeof o.seq, sizeof o - sizeof o.seq);
    __atomic_store_n(&h->seq, nsnap, __ATOMIC_RELEASE);
    ct_rec_commit(&guard, CT_REC_PAD);
    next_slot ^= 1;
    last_snap_ts = ts;
    dirty = 0;
    proc.snap_peak = proc.peak;
    for (uint32_t g = 0; g < CT_SNAP_GROUPS; g++)
        grp[g].snap_peak = grp[g].peak;
    return 1;
}

void ct_agg_final(void)
{
    pthread_mutex_lock(&mu);
    if (keys)
        snapshot(CT_SNAP_EXIT, ct_now_ns());
    pthread_mutex_unlock(&mu);
}

void ct_agg_atfork_prepare(void) { pthread_mutex_lock(&mu); }
void ct_agg_atfork_parent(void) { pthread_mutex_unlock(&mu); }

void ct_agg_atfork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    if (keys)
        munmap(keys, sizeof(struct key) * MAX_KEYS);
    if (khash)
        munmap(khash, sizeof(uint32_t) * KEY_HASH);
    if (lt)
        munmap(lt, lcap * sizeof *lt);
    keys = NULL;
    khash = NULL;
    lt = NULL;
    lcap = lused = 0;
    nkeys = 0;
    memset(grp, 0, sizeof grp);
    memset(&proc, 0, sizeof proc);
    memset(&tot, 0, sizeof tot);
    memset(slots, 0, sizeof slots);
    proc_found = 0;
    n_failed_written = n_denied_written = n_meminfo_written = 0;
    last_snap_ts = nsnap = 0;
    dirty = broken = 0;
    next_slot = 0;
    freeing.state = FREEING_NONE;
}
