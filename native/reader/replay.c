/* replay.c - the model's hot loop (cudatrace/analyze/model.py calls it through cffi; built into
 * libcudatrace_tools.so with the trace scanner).
 *
 * Replays the events of every trace of a run, merged by timestamp (ties: trace order), into
 * live device allocations over time. One pass records each counted allocation's lifetime
 * (the merged sequence number and time it began and ended), so what is live at any moment
 * (the peak, the end, a time) is a filter over lifetimes, never a second replay.
 *
 * The rules (model.py holds the same ones in Python, as the reference the tests compare with):
 *   - ALLOC with result 0 and a kind in cfg.device_kinds starts a device allocation keyed by
 *     (trace, space, address); a kind in cfg.host_kinds is pinned host memory, counted apart.
 *     An ALLOC at a key still live ends the old allocation first (counted as reused).
 *   - ALLOC with a result other than 0 is a failed allocation: listed, never counted.
 *   - FREE with result 0 ends the allocation of its key; address 0 is a no-op; a key with none
 *     is an unmatched free (allocated before tracing or through an unhooked path).
 *   - VMM: cuMemCreate is the allocation (space VMM, key = handle). cuMemMap(ptr, handle)
 *     records a mapping; cuMemRelease of a handle that is still mapped defers the end of the
 *     allocation to the last cuMemUnmap of its mappings (the driver frees it then).
 *   - DENY (a budget refusal), MEMINFO (cuMemGetInfo, NVML): listed.
 *   - A trace whose events are not in time order (threads publish out of order) is replayed
 *     in a stable sort by time.
 *   - A process's memory ends when the process ends: at a trace's end_ts (its exit record, or
 *     the start of the image that exec replaced it with; never before its last event) every
 *     allocation, mapping and pinned buffer of that trace still live ends (CT_END_EXITED), before
 *     any event of the same time. The run's end_bytes counts them as never freed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "cevent.h"
#include "replay.h"

#define NONE64 UINT64_MAX
#define ST_DEV 1
#define ST_HOST 2
#define ST_MAP 3
#define MAP_SPACE 255
#define IMPORT_SPACE 254 /* VMM handles imported from another process (cuMemImport...) */
#define MAX_TRACES (1u << 22)

/* The table of what is live: (trace, space, address) -> an index into lives (device memory),
 * hosts (pinned host memory) or maps (VMM mappings). 16 bytes a slot, open addressing with
 * linear probing and backward-shift deletion (no tombstones). The replay's speed is bound by
 * its cache misses, so a slot holds only the key and the index; a free's other needs (size,
 * device) are in its life record, which the free writes anyway. */
struct slot {
    uint64_t addr;
    uint32_t ref;
    uint32_t tag; /* trace << 10 | state << 8 | space; 0: empty */
};
#define TAG(trace, state, space)                                                                   \
    ((uint32_t)(trace) << 10 | (uint32_t)(state) << 8 | (uint32_t)(space))
#define TAG_KEY(tag) ((tag) & ~0x300u)
#define TAG_STATE(tag) (((tag) >> 8) & 3u)
#define TAG_TRACE(tag) ((tag) >> 10)

struct table {
    struct slot *s;
    uint64_t cap, used;
    size_t bytes; /* of the mapping */
};

/* One device allocation: 56 bytes, for millions of them. The fields of its event other than
 * the time, size and address (trace, stack, API, device, thread...) repeat: they are kept once,
 * in the table of "rests" (struct rest), and the life holds their number. What ended it
 * (CT_END_*) is in the parallel array hows; a VMM handle's mappings in vmm (when there are). */
struct life {
    uint64_t seq, end_seq, ts, end_ts, size, addr;
    uint32_t idx, rest;
};

/* an event without its time, size and address (the words of a struct ct_event, those zero),
 * and its trace */
struct rest {
    union {
        struct ct_event ev;
        uint64_t key[9];
    };
    uint32_t trace, pad;
};
#define VMM_RELEASED 0x80000000u /* cuMemRelease seen while mapped */

/* a listed event (failed, denied, memory query), whole */
struct listed {
    uint64_t seq;
    uint32_t trace, idx;
    struct ct_event ev;
};

struct mapping {
    uint64_t handle, size;
};

struct vec {
    void *p;
    uint64_t n, cap;
    size_t elem;
    int mapped; /* p is a mapping (vec_map): grown in place, never copied */
};

struct ct_replay {
    uint32_t ntraces;
    const struct ct_event **ev; /* per trace (an array source; the replay's time only) */
    uint64_t *nev;
    uint32_t **order; /* per trace: NULL (in time order) or a sorted permutation */
    struct vec lives, failed, denied, meminfo;
    struct vec hows; /* uint8_t per life: CT_END_* */
    uint32_t *vmm;   /* per life: mappings | VMM_RELEASED; NULL until a VMM handle is seen */
    uint64_t vmm_cap;
    struct vec rests; /* struct rest */
    uint32_t *rhash;  /* rests by their fields: index + 1, 0 empty */
    uint64_t rhash_cap;
    struct ct_replay_device dev[CT_REPLAY_DEV_SLOTS];
    uint64_t dev_cur[CT_REPLAY_DEV_SLOTS];
    struct ct_replay_proc *proc;
    uint32_t buckets;
    uint64_t t0, span;
    uint64_t sl_i, sl_lo, sl_hi; /* changed(): the slice of times [sl_lo, sl_hi) */
    struct ct_replay_bucket *tl_all;
    struct ct_replay_bucket *tl_dev[CT_REPLAY_DEV_SLOTS];
    int oom;
};

/* Room for cap elements, reserved as address space only: pages are taken as they are written,
 * and growing never copies (a realloc of hundreds of MB holds both copies for a moment).
 * -1: no mapping (the vector grows by realloc). */
static int vec_map(struct vec *v, uint64_t cap)
{
    if (!cap || cap > (UINT64_MAX >> 8) / v->elem)
        return -1;
    void *p = mmap(NULL, cap * v->elem, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    v->p = p;
    v->cap = cap;
    v->mapped = 1;
    return 0;
}

static void vec_free(struct vec *v)
{
    if (v->mapped && v->p)
        munmap(v->p, v->cap * v->elem);
    else
        free(v->p);
    v->p = NULL;
}

static int vec_push(struct vec *v, const void *x)
{
    if (v->n == v->cap) {
        uint64_t nc = v->cap ? v->cap * 2 : 1024;
        void *p;
        if (v->mapped) {
            p = mmap(NULL, nc * v->elem, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED)
                return -1;
            memcpy(p, v->p, v->n * v->elem);
            munmap(v->p, v->cap * v->elem);
        } else {
            p = realloc(v->p, nc * v->elem);
            if (!p)
                return -1;
        }
        v->p = p;
        v->cap = nc;
    }
    memcpy((char *)v->p + v->n * v->elem, x, v->elem);
    v->n++;
    return 0;
}

static inline uint64_t mix(uint32_t key, uint64_t addr)
{
    uint64_t h = addr ^ ((uint64_t)key * 0x9E3779B97F4A7C15ull);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* index of the key's slot, or of the empty slot where it would go */
static inline uint64_t tfind(const struct table *t, uint32_t key, uint64_t addr)
{
    uint64_t mask = t->cap - 1, i = mix(key, addr) & mask;
    for (;;) {
        const struct slot *s = &t->s[i];
        if (!s->tag || (s->addr == addr && TAG_KEY(s->tag) == key))
            return i;
        i = (i + 1) & mask;
    }
}

static struct slot *slots_alloc(uint64_t n, size_t *bytes)
{
    *bytes = n * sizeof(struct slot);
    void *p = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    return p; /* zero-filled */
}

static int tgrow(struct table *t)
{
    uint64_t nc = t->cap ? t->cap * 2 : 4096;
    struct slot *old = t->s;
    uint64_t oc = t->cap;
    size_t ob = t->bytes, nb;
    struct slot *s = slots_alloc(nc, &nb);
    if (!s)
        return -1;
    t->s = s;
    t->cap = nc;
    t->bytes = nb;
    for (uint64_t i = 0; i < oc; i++)
        if (old[i].tag)
            s[tfind(t, TAG_KEY(old[i].tag), old[i].addr)] = old[i];
    if (old)
        munmap(old, ob);
    return 0;
}

static void tfree(struct table *t)
{
    if (t->s)
        munmap(t->s, t->bytes);
    t->s = NULL;
}

/* the slot of the key, new (tag 0) when there was none; NULL when out of memory */
static struct slot *tput(struct table *t, uint32_t key, uint64_t addr)
{
    if ((t->used + 1) * 2 > t->cap && tgrow(t) != 0)
        return NULL;
    struct slot *s = &t->s[tfind(t, key, addr)];
    if (!s->tag) {
        s->addr = addr;
        s->ref = 0;
        t->used++;
    }
    return s;
}

static inline struct slot *tget(const struct table *t, uint32_t key, uint64_t addr)
{
    if (!t->cap)
        return NULL;
    struct slot *s = &t->s[tfind(t, key, addr)];
    return s->tag ? s : NULL;
}

/* delete with backward shift */
static void tdel(struct table *t, struct slot *s)
{
    uint64_t mask = t->cap - 1, i = (uint64_t)(s - t->s), j = i;
    for (;;) {
        j = (j + 1) & mask;
        struct slot *sj = &t->s[j];
        if (!sj->tag)
            break;
        uint64_t k = mix(TAG_KEY(sj->tag), sj->addr) & mask;
        int move = (i <= j) ? (k <= i || k > j) : (k <= i && k > j);
        if (move) {
            t->s[i] = *sj;
            i = j;
        }
    }
    t->s[i].tag = 0;
    t->used--;
}

/* ---- order within a trace ---- */
static int sorted_by_ts(const struct ct_event *e, uint64_t n)
{
    for (uint64_t i = 1; i < n; i++)
        if (e[i].ts_ns < e[i - 1].ts_ns)
            return 0;
    return 1;
}

/* stable bottom-up merge sort of indices by timestamp; runs already in order are not merged */
static uint32_t *sort_order(const struct ct_event *e, uint64_t n)
{
    uint32_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return NULL;
    }
    for (uint64_t i = 0; i < n; i++)
        a[i] = (uint32_t)i;
    for (uint64_t w = 1; w < n; w *= 2) {
        for (uint64_t lo = 0; lo < n; lo += 2 * w) {
            uint64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            if (mid >= hi || e[a[mid - 1]].ts_ns <= e[a[mid]].ts_ns) {
                memcpy(b + lo, a + lo, (hi - lo) * sizeof *a);
                continue;
            }
            uint64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                b[k++] = e[a[j]].ts_ns < e[a[i]].ts_ns ? a[j++] : a[i++];
            while (i < mid)
                b[k++] = a[i++];
            while (j < hi)
                b[k++] = a[j++];
        }
        uint32_t *t = a;
        a = b;
        b = t;
    }
    free(b);
    return a;
}

/* ---- merge: a binary heap of stream cursors keyed (ts, end first, trace, index) ----
 * A trace is one stream (an array of events, in a stable sort by time) or one stream per
 * thread (events decoded from its blocks as the replay goes: each thread's are in time order,
 * so merging them by (time, index in the file) is the same stable sort by time). */
struct cursor {
    uint64_t ts;
    uint64_t idx; /* of the stream's next event in its trace (file order) */
    uint32_t trace;
    uint32_t exit;   /* 1: the trace's events are done; this is its process's end */
    uint32_t stream; /* index into the streams */
    uint32_t pad;
};

static inline int before(const struct cursor *x, const struct cursor *y)
{
    if (x->ts != y->ts)
        return x->ts < y->ts;
    if (x->exit != y->exit)
        return x->exit > y->exit; /* a process's end first: its memory is gone by then */
    if (x->trace != y->trace)
        return x->trace < y->trace;
    return x->idx < y->idx;
}

static void sift_down(struct cursor *h, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && before(&h[l], &h[m]))
            m = l;
        if (r < n && before(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        struct cursor t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static inline uint32_t dev_slot(int32_t d)
{
    if (d < -1)
        return 0;
    if (d >= CT_REPLAY_DEV_SLOTS - 1)
        return CT_REPLAY_DEV_SLOTS - 1;
    return (uint32_t)(d + 1);
}

static inline void tl_note(struct ct_replay_bucket *b, uint64_t v, uint64_t ts)
{
    if (!b->changes || v < b->min) {
        b->min = v;
        b->min_ts = ts;
    }
    if (!b->changes || v > b->max) {
        b->max = v;
        b->max_ts = ts;
    }
    b->last = v;
    b->last_ts = ts;
    b->changes++;
}

struct source;
struct state {
    ct_replay *r;
    struct table tab;
    struct vec hosts; /* uint64_t: size of each pinned host allocation */
    struct vec maps;  /* struct mapping */
    struct ct_replay_summary *s;
    uint64_t cur, host_cur;
    uint64_t *proc_cur;
    uint64_t *proc_host;  /* pinned host bytes live, per trace */
    uint64_t exited;      /* device bytes ended by their process's end */
    uint64_t host_exited; /* pinned host bytes likewise */
    uint64_t dev_exited[CT_REPLAY_DEV_SLOTS];
    struct source *src; /* per trace */
};

/* the timeline slice of time ts (the oracle's formula: tests/support/replay_oracle.py) */
static uint64_t slice_of(const ct_replay *r, uint64_t ts)
{
    uint64_t i = r->span ? (uint64_t)((double)(ts - r->t0) / (double)r->span * r->buckets) : 0;
    return i < r->buckets ? i : r->buckets - 1;
}

/* the first time (from t0) whose slice is k or later; NONE64: none. slice_of never decreases
 * from t0 on, so a binary search finds it */
static uint64_t slice_start(const ct_replay *r, uint64_t k)
{
    if (k >= r->buckets || slice_of(r, r->t0 + r->span) < k)
        return NONE64;
    uint64_t lo = r->t0, hi = r->t0 + r->span; /* slice_of(hi) >= k */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (slice_of(r, mid) >= k)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static void changed(struct state *st, uint32_t slot, uint64_t ts)
{
    ct_replay *r = st->r;
    if (!r->buckets)
        return;
    /* times come in order: the slice of the last one, and where it starts and ends, spare the
     * division most of the time */
    uint64_t i = r->sl_i;
    if (!(ts >= r->sl_lo && ts < r->sl_hi)) {
        i = slice_of(r, ts);
        if (ts >= r->t0 && r->span) {
            r->sl_i = i;
            r->sl_lo = slice_start(r, i);
            r->sl_hi = slice_start(r, i + 1);
        }
    }
    tl_note(&r->tl_all[i], st->cur, ts);
    if (!r->tl_dev[slot]) {
        r->tl_dev[slot] = calloc(r->buckets, sizeof(struct ct_replay_bucket));
        if (!r->tl_dev[slot]) {
            r->oom = 1;
            return;
        }
    }
    tl_note(&r->tl_dev[slot][i], r->dev_cur[slot], ts);
}

static inline struct life *life_at(const ct_replay *r, uint64_t li)
{
    return &((struct life *)r->lives.p)[li];
}

static inline const struct rest *rest_at(const ct_replay *r, uint32_t ri)
{
    return &((const struct rest *)r->rests.p)[ri];
}

static inline int32_t life_dev(const ct_replay *r, const struct life *L)
{
    return rest_at(r, L->rest)->ev.device;
}

static inline uint8_t *how_at(const ct_replay *r, uint64_t li)
{
    return &((uint8_t *)r->hows.p)[li];
}

/* the key of an event's rest: its words past ts, size and addr, padding zeroed */
static void rest_key(const struct ct_event *e, uint64_t w[9])
{
    memcpy(w, e, 9 * sizeof *w);
    w[0] = w[1] = w[2] = 0;
    memset((uint8_t *)w + __builtin_offsetof(struct ct_event, reserved) + sizeof e->reserved, 0,
           9 * sizeof *w - __builtin_offsetof(struct ct_event, reserved) - sizeof e->reserved);
}
_Static_assert(sizeof(struct ct_event) == 72, "a rest key is an event's nine words");

static uint64_t rest_hash(uint32_t trace, const uint64_t w[9])
{
    uint64_t h = (w[6] ^ (uint64_t)trace << 40) * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 29) ^ w[7] ^ w[5]) * 0xff51afd7ed558ccdull;
    h = (h ^ (h >> 32) ^ w[3] ^ w[4] ^ w[8]) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 31);
}

static int rest_rehash(ct_replay *r, uint64_t cap)
{
    uint32_t *h = calloc(cap, sizeof *h);
    if (!h)
        return -1;
    for (uint64_t i = 0; i < r->rests.n; i++) {
        const struct rest *x = rest_at(r, (uint32_t)i);
        uint64_t j = rest_hash(x->trace, x->key) & (cap - 1);
        while (h[j])
            j = (j + 1) & (cap - 1);
        h[j] = (uint32_t)i + 1;
    }
    free(r->rhash);
    r->rhash = h;
    r->rhash_cap = cap;
    return 0;
}

/* the number of the event's rest (added when new); UINT32_MAX when out of memory */
static uint32_t rest_id(ct_replay *r, uint32_t trace, const struct ct_event *e)
{
    if ((r->rests.n + 1) * 2 > r->rhash_cap &&
        (r->rests.n >= UINT32_MAX - 1 || rest_rehash(r, r->rhash_cap ? r->rhash_cap * 2 : 256)))
        return UINT32_MAX;
    struct rest x;
    rest_key(e, x.key);
    x.trace = trace;
    x.pad = 0;
    uint64_t j = rest_hash(trace, x.key) & (r->rhash_cap - 1);
    while (r->rhash[j]) {
        const struct rest *y = rest_at(r, r->rhash[j] - 1);
        if (y->trace == trace && memcmp(y->key, x.key, sizeof x.key) == 0)
            return r->rhash[j] - 1;
        j = (j + 1) & (r->rhash_cap - 1);
    }
    if (vec_push(&r->rests, &x))
        return UINT32_MAX;
    r->rhash[j] = (uint32_t)r->rests.n;
    return (uint32_t)r->rests.n - 1;
}

/* a life's VMM word (mappings, VMM_RELEASED): 0 when none was ever noted */
static inline uint32_t vmm_get(const ct_replay *r, uint64_t li)
{
    return li < r->vmm_cap ? r->vmm[li] : 0;
}

/* set it; -1 when out of memory */
static int vmm_set(ct_replay *r, uint64_t li, uint32_t v)
{
    if (li >= r->vmm_cap) {
        uint64_t nc = r->lives.cap > li ? r->lives.cap : li + 1;
        uint32_t *p = realloc(r->vmm, nc * sizeof *p);
        if (!p)
            return -1;
        memset(p + r->vmm_cap, 0, (nc - r->vmm_cap) * sizeof *p);
        r->vmm = p;
        r->vmm_cap = nc;
    }
    r->vmm[li] = v;
    return 0;
}

/* end the device allocation of slot sl (the caller removes the slot) */
static void end_life(struct state *st, const struct slot *sl, uint64_t seq, uint64_t ts,
                     uint32_t how)
{
    ct_replay *r = st->r;
    struct life *L = life_at(r, sl->ref);
    const struct rest *x = rest_at(r, L->rest);
    uint32_t ds = dev_slot(x->ev.device);
    L->end_seq = seq;
    L->end_ts = ts;
    *how_at(r, sl->ref) = (uint8_t)how;
    st->cur -= L->size;
    r->dev_cur[ds] -= L->size;
    st->proc_cur[x->trace] -= L->size;
    changed(st, ds, ts);
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* a mapping of handle hv went away: the last one of a released handle frees its memory */
static void unmapped(struct state *st, uint32_t ti, uint64_t hv, uint64_t seq, uint64_t ts)
{
    struct slot *h = tget(&st->tab, TAG(ti, 0, CT_SPACE_VMM), hv);
    if (!h || TAG_STATE(h->tag) != ST_DEV)
        return;
    uint32_t v = vmm_get(st->r, h->ref), maps = v & ~VMM_RELEASED;
    if (maps) {
        if (vmm_set(st->r, h->ref, v - 1)) {
            st->r->oom = 1;
            return;
        }
        if (maps == 1 && (v & VMM_RELEASED)) {
            end_life(st, h, seq, ts, CT_END_UNMAPPED);
            tdel(&st->tab, h);
        }
    }
}

static inline uint64_t host_size(const struct state *st, uint32_t ref)
{
    return ((const uint64_t *)st->hosts.p)[ref];
}

static inline struct mapping *mapping_at(const struct state *st, uint32_t ref)
{
    return &((struct mapping *)st->maps.p)[ref];
}

static void step(struct state *st, uint32_t ti, uint32_t idx, const struct ct_event *e,
                 uint64_t seq, const struct ct_replay_config *cfg)
{
    ct_replay *r = st->r;
    struct ct_replay_summary *s = st->s;
    struct ct_replay_proc *p = &r->proc[ti];
    uint64_t ts = e->ts_ns;
    struct listed ref = {seq, ti, idx, *e};
    p->events++;
    if (!p->first_ts || ts < p->first_ts)
        p->first_ts = ts;
    if (ts > p->last_ts)
        p->last_ts = ts;
    switch (e->op) {
    case CT_OP_ALLOC: {
        if (e->result != 0) {
            s->c.failed++;
            p->failed++;
            if (vec_push(&r->failed, &ref))
                r->oom = 1;
            return;
        }
        int kind = e->kind < 64 ? e->kind : 63;
        int is_dev = (cfg->device_kinds >> kind) & 1, is_host = (cfg->host_kinds >> kind) & 1;
        if (!is_dev && !is_host) {
            s->c.other++;
            return;
        }
        uint32_t key = TAG(ti, 0, e->space);
        struct slot *sl = tget(&st->tab, key, e->addr);
        if (sl) { /* reused while live: the old one is gone */
            s->c.reused++;
            if (TAG_STATE(sl->tag) == ST_DEV)
                end_life(st, sl, seq, ts, CT_END_REUSED);
            else if (TAG_STATE(sl->tag) == ST_HOST) {
                st->host_cur -= host_size(st, sl->ref);
                st->proc_host[ti] -= host_size(st, sl->ref);
            }
            tdel(&st->tab, sl);
        }
        sl = tput(&st->tab, key, e->addr);
        if (!sl) {
            r->oom = 1;
            return;
        }
        if (is_dev) {
            uint32_t ri = rest_id(r, ti, e);
            struct life L = {seq, NONE64, ts, NONE64, e->size, e->addr, idx, ri};
            uint8_t how = CT_END_LIVE;
            sl->tag = TAG(ti, ST_DEV, e->space);
            sl->ref = (uint32_t)r->lives.n;
            if (ri == UINT32_MAX || r->lives.n >= UINT32_MAX || vec_push(&r->lives, &L) ||
                vec_push(&r->hows, &how)) {
                r->oom = 1;
                return;
            }
            uint32_t ds = dev_slot(e->device);
            struct ct_replay_device *d = &r->dev[ds];
            s->c.allocs++;
            p->allocs++;
            d->seen = 1;
            d->allocs++;
            st->cur += e->size;
            r->dev_cur[ds] += e->size;
            st->proc_cur[ti] += e->size;
            if (st->cur > s->peak_bytes || !s->found) {
                s->peak_bytes = st->cur;
                s->peak_ts = ts;
                s->peak_seq = seq;
                s->found = 1;
            }
            if (r->dev_cur[ds] > d->peak_bytes || d->allocs == 1) {
                d->peak_bytes = r->dev_cur[ds];
                d->peak_ts = ts;
                d->peak_seq = seq;
            }
            if (st->proc_cur[ti] > p->peak_bytes) {
                p->peak_bytes = st->proc_cur[ti];
                p->peak_ts = ts;
            }
            changed(st, ds, ts);
        } else {
            uint64_t size = e->size;
            sl->tag = TAG(ti, ST_HOST, e->space);
            sl->ref = (uint32_t)st->hosts.n;
            if (vec_push(&st->hosts, &size)) {
                r->oom = 1;
                return;
            }
            s->c.host_allocs++;
            p->host_allocs++;
            st->host_cur += size;
            st->proc_host[ti] += size;
            if (st->host_cur > s->host_peak) {
                s->host_peak = st->host_cur;
                s->host_peak_ts = ts;
            }
        }
        return;
    }
    case CT_OP_FREE: {
        if (e->result != 0) {
            s->c.failed_frees++;
            return;
        }
        if (e->addr == 0) {
            s->c.null_frees++;
            return;
        }
        struct slot *sl = tget(&st->tab, TAG(ti, 0, e->space), e->addr);
        if (!sl && e->space == CT_SPACE_VMM) {
            /* cuMemRelease of an imported handle: someone else's memory, never counted */
            struct slot *im = tget(&st->tab, TAG(ti, 0, IMPORT_SPACE), e->addr);
            if (im) {
                tdel(&st->tab, im);
                s->c.unimports++;
                return;
            }
        }
        if (!sl) {
            s->c.unmatched_frees++;
            return;
        }
        if (TAG_STATE(sl->tag) == ST_HOST) {
            st->host_cur -= host_size(st, sl->ref);
            st->proc_host[ti] -= host_size(st, sl->ref);
            s->c.host_frees++;
            tdel(&st->tab, sl);
            return;
        }
        s->c.frees++;
        p->frees++;
        uint32_t v = vmm_get(r, sl->ref);
        if (e->space == CT_SPACE_VMM && (v & ~VMM_RELEASED) > 0) {
            if (vmm_set(r, sl->ref, v | VMM_RELEASED)) /* the driver frees it at the last unmap */
                r->oom = 1;
            s->c.deferred_releases++;
            return;
        }
        end_life(st, sl, seq, ts, CT_END_FREE);
        tdel(&st->tab, sl);
        return;
    }
    case CT_OP_MAP: {
        if (e->result != 0) {
            s->c.other++;
            return;
        }
        s->c.maps++;
        uint32_t mkey = TAG(ti, 0, MAP_SPACE);
        struct slot *m = tget(&st->tab, mkey, e->addr);
        if (m) { /* a mapping we missed the end of: drop it */
            uint64_t hv = mapping_at(st, m->ref)->handle;
            tdel(&st->tab, m);
            unmapped(st, ti, hv, seq, ts);
        }
        m = tput(&st->tab, mkey, e->addr);
        struct mapping mp = {e->aux, e->size};
        if (!m || vec_push(&st->maps, &mp)) {
            r->oom = 1;
            return;
        }
        m->tag = TAG(ti, ST_MAP, MAP_SPACE);
        m->ref = (uint32_t)(st->maps.n - 1);
        struct slot *h = tget(&st->tab, TAG(ti, 0, CT_SPACE_VMM), e->aux);
        if (h && TAG_STATE(h->tag) == ST_DEV && vmm_set(r, h->ref, vmm_get(r, h->ref) + 1))
            r->oom = 1;
        return;
    }
    case CT_OP_UNMAP: {
        if (e->result != 0) {
            s->c.other++;
            return;
        }
        s->c.unmaps++;
        uint32_t mkey = TAG(ti, 0, MAP_SPACE);
        struct slot *m = tget(&st->tab, mkey, e->addr);
        if (m && mapping_at(st, m->ref)->size >= e->size) { /* one mapping, unmapped whole */
            uint64_t hv = mapping_at(st, m->ref)->handle;
            tdel(&st->tab, m);
            unmapped(st, ti, hv, seq, ts);
            return;
        }
        /* a range over several mappings, or none starting there: unmap every mapping of this
         * trace that starts inside the range (rare: collect them first, deleting moves slots),
         * in address order (as model.py does) */
        uint64_t n = 0, cap = 0, *found = NULL;
        for (uint64_t i = 0; i < st->tab.cap; i++) {
            struct slot *x = &st->tab.s[i];
            if (x->tag && TAG_STATE(x->tag) == ST_MAP && TAG_TRACE(x->tag) == ti &&
                x->addr >= e->addr && x->addr - e->addr < e->size) {
                if (n == cap) {
                    cap = cap ? cap * 2 : 16;
                    uint64_t *f = realloc(found, cap * sizeof *f);
                    if (!f) {
                        free(found);
                        r->oom = 1;
                        return;
                    }
                    found = f;
                }
                found[n++] = x->addr;
            }
        }
        if (!n)
            s->c.unmatched_unmaps++;
        qsort(found, n, sizeof *found, u64_cmp);
        for (uint64_t k = 0; k < n; k++) {
            struct slot *x = tget(&st->tab, mkey, found[k]);
            if (!x)
                continue;
            uint64_t hv = mapping_at(st, x->ref)->handle;
            tdel(&st->tab, x);
            unmapped(st, ti, hv, seq, ts);
        }
        free(found);
        return;
    }
    case CT_OP_DENY:
        s->c.denied++;
        p->denied++;
        if (vec_push(&r->denied, &ref))
            r->oom = 1;
        return;
    case CT_OP_MEMINFO:
        s->c.meminfo++;
        p->meminfo++;
        if (vec_push(&r->meminfo, &ref))
            r->oom = 1;
        return;
    case CT_OP_IMPORT:
        s->c.imports++;
        if (e->result == 0 && e->addr && e->space == CT_SPACE_VMM) {
            struct slot *im = tput(&st->tab, TAG(ti, 0, IMPORT_SPACE), e->addr);
            if (!im) {
                r->oom = 1;
                return;
            }
            im->tag = TAG(ti, ST_HOST, IMPORT_SPACE);
            im->ref = 0;
        }
        return;
    case CT_OP_UNIMPORT:
        s->c.unimports++;
        return;
    default:
        s->c.other++;
        return;
    }
}

struct ending {
    uint64_t addr;
    uint32_t key, pad;
};

static void radix_u64(uint64_t *a, uint64_t *tmp, uint64_t n);

/* append x to *v (n of cap elements of size elem); -1: out of memory */
static int grow_push(void **v, uint64_t *n, uint64_t *cap, size_t elem, const void *x)
{
    if (*n == *cap) {
        uint64_t nc = *cap ? *cap * 2 : 64;
        void *p = realloc(*v, nc * elem);
        if (!p)
            return -1;
        *v = p;
        *cap = nc;
    }
    memcpy((char *)*v + *n * elem, x, elem);
    (*n)++;
    return 0;
}

/* trace ti's process ended at ts: whatever it still held is gone (the driver gave it back).
 * Its device allocations end in the order they began (their lives' order: a radix sort of
 * their indices), then its pinned buffers, mappings and imports go. */
static void process_end(struct state *st, uint32_t ti, uint64_t seq, uint64_t ts)
{
    ct_replay *r = st->r;
    r->proc[ti].end_bytes = st->proc_cur[ti]; /* what it held when it ended */
    if (!st->proc_cur[ti] && !st->proc_host[ti])
        return;
    uint64_t nd = 0, dcap = 0, no = 0, ocap = 0, *devs = NULL, *tmp = NULL;
    struct ending *others = NULL;
    for (uint64_t i = 0; i < st->tab.cap; i++) {
        const struct slot *x = &st->tab.s[i];
        if (!x->tag || TAG_TRACE(x->tag) != ti)
            continue;
        uint64_t ref = x->ref;
        struct ending o = {x->addr, TAG_KEY(x->tag), 0};
        if (TAG_STATE(x->tag) == ST_DEV ? grow_push((void **)&devs, &nd, &dcap, sizeof ref, &ref)
                                        : grow_push((void **)&others, &no, &ocap, sizeof o, &o))
            goto oom;
    }
    tmp = malloc((nd ? nd : 1) * sizeof *tmp);
    if (!tmp)
        goto oom;
    radix_u64(devs, tmp, nd);
    for (uint64_t k = 0; k < nd; k++) {
        const struct life *L = life_at(r, devs[k]);
        const struct rest *rs = rest_at(r, L->rest);
        struct slot *x = tget(&st->tab, TAG(ti, 0, rs->ev.space), L->addr);
        if (!x || x->ref != devs[k])
            continue;
        st->exited += L->size;
        st->dev_exited[dev_slot(rs->ev.device)] += L->size;
        end_life(st, x, seq, ts, CT_END_EXITED);
        tdel(&st->tab, x);
    }
    for (uint64_t k = 0; k < no; k++) {
        struct slot *x = tget(&st->tab, others[k].key, others[k].addr);
        if (!x)
            continue;
        if (TAG_STATE(x->tag) == ST_HOST && (others[k].key & 0xffu) != IMPORT_SPACE) {
            st->host_cur -= host_size(st, x->ref);
            st->proc_host[ti] -= host_size(st, x->ref);
            st->host_exited += host_size(st, x->ref);
        }
        tdel(&st->tab, x);
    }
    free(devs);
    free(tmp);
    free(others);
    return;
oom:
    free(devs);
    free(tmp);
    free(others);
    r->oom = 1;
}

void ct_replay_free(ct_replay *r)
{
    if (!r)
        return;
    if (r->order)
        for (uint32_t i = 0; i < r->ntraces; i++)
            free(r->order[i]);
    free(r->order);
    free((void *)r->ev);
    free(r->nev);
    vec_free(&r->lives);
    vec_free(&r->hows);
    free(r->vmm);
    free(r->rests.p);
    free(r->rhash);
    free(r->failed.p);
    free(r->denied.p);
    free(r->meminfo.p);
    free(r->proc);
    free(r->tl_all);
    for (int i = 0; i < CT_REPLAY_DEV_SLOTS; i++)
        free(r->tl_dev[i]);
    free(r);
}

/* ---- streams: a trace's events in time order, a few decoded ahead ---- */
#define RING 16
#define DROP_BYTES (32u << 20) /* read this much of mapped files: drop their pages read */
#define NO_SEG UINT32_MAX

struct stream {
    uint32_t trace;
    uint32_t head, n; /* ring: the next event, how many there are */
    uint32_t seg, k;  /* blocks: the current one, events taken from it */
    uint64_t pos;     /* arrays: the next position (in the sorted order) */
    const uint8_t *p, *end;
    struct ct_ce_ctx ctx; /* blocks: the thread's context */
    struct ct_event ev[RING];
    uint64_t idx[RING];
};

struct source {
    const struct ct_replay_trace *t;
    uint32_t active;   /* streams not done */
    uint32_t unsorted; /* its events came out of file order (threads merged by time) */
    uint64_t last_ts;  /* of its last event replayed */
    uint64_t next_idx; /* the index after its last event replayed */
};

/* start block g of a stream (the scan's block: decode it as the scan did) */
static void enter(struct stream *m, const struct ct_replay_trace *t, uint32_t g)
{
    m->seg = g;
    m->k = 0;
    if (g == NO_SEG || g >= t->n_segs)
        return;
    const struct ct_seg *b = &t->segs[g];
    if (b->off > t->len || b->len > t->len - b->off) { /* not this file's: nothing in it */
        m->p = m->end = NULL;
        return;
    }
    m->p = t->buf + b->off;
    m->end = m->p + b->len;
    ct_ce_block_begin(&m->ctx, b->seq, m->p, m->end);
}

/* decode (or copy) the stream's next events into its ring; 0 when it has none left */
static uint32_t refill(struct state *st, struct stream *m, uint64_t *read)
{
    ct_replay *r = st->r;
    const struct ct_replay_trace *t = &*st->src[m->trace].t;
    uint32_t ti = m->trace, n = 0;
    m->head = 0;
    if (t->events) {
        uint64_t nev = r->nev[ti];
        const uint32_t *ord = r->order[ti];
        for (; n < RING && m->pos < nev; n++, m->pos++) {
            uint64_t i = ord ? ord[m->pos] : m->pos;
            m->ev[n] = r->ev[ti][i];
            m->idx[n] = i;
        }
    } else {
        while (n < RING && m->seg != NO_SEG && m->seg < t->n_segs) {
            const struct ct_seg *b = &t->segs[m->seg];
            if (m->k < b->count && m->p) {
                if (!ct_ce_decode_fields(&m->ctx, &m->p, m->end, &m->ev[n])) {
                    m->seg = NO_SEG; /* the file changed since its scan: the rest is lost */
                    break;
                }
                m->idx[n++] = b->first + m->k++;
                continue;
            }
            if (b->bad && m->p) { /* the scan stopped at a malformed event: so do we */
                struct ct_event x;
                ct_ce_decode_fields(&m->ctx, &m->p, m->end, &x);
            }
            *read += b->len;
            enter(m, t, b->next);
        }
    }
    /* the table is where the time goes (a cache miss a lookup): ask for the slots of the
     * events ahead now, so the misses overlap */
    if (st->tab.cap)
        for (uint32_t i = 0; i < n; i++)
            __builtin_prefetch(
                &st->tab.s[mix(TAG(ti, 0, m->ev[i].space), m->ev[i].addr) & (st->tab.cap - 1)], 1);
    m->n = n;
    return n;
}

/* pages of mapped files already read: gone from memory (read again from the page cache if a
 * stream still needs them) */
static void drop_pages(struct state *st, uint32_t ntraces)
{
#ifdef MADV_DONTNEED
    for (uint32_t i = 0; i < ntraces; i++) {
        const struct ct_replay_trace *t = st->src[i].t;
        if (!t->events && t->droppable && t->buf && t->len && ((uintptr_t)t->buf & 4095) == 0)
            madvise((void *)(uintptr_t)t->buf, t->len, MADV_DONTNEED);
    }
#else
    (void)st;
    (void)ntraces;
#endif
}

/* the first block of each thread: those no block names as its next */
static uint32_t *first_blocks(const struct ct_replay_trace *t, uint32_t *nfirst)
{
    uint8_t *named = calloc(t->n_segs ? t->n_segs : 1, 1);
    uint32_t *f = malloc((t->n_segs ? t->n_segs : 1) * sizeof *f);
    *nfirst = 0;
    if (!named || !f) {
        free(named);
        free(f);
        return NULL;
    }
    for (uint64_t i = 0; i < t->n_segs; i++)
        if (t->segs[i].next != NO_SEG && t->segs[i].next < t->n_segs)
            named[t->segs[i].next] = 1;
    for (uint64_t i = 0; i < t->n_segs; i++)
        if (!named[i])
            f[(*nfirst)++] = (uint32_t)i;
    free(named);
    return f;
}

ct_replay *ct_replay_run(const struct ct_replay_trace *traces, uint32_t ntraces,
                         const struct ct_replay_config *cfg, struct ct_replay_summary *out)
{
    if (!out || !cfg || (ntraces && !traces) || ntraces >= MAX_TRACES)
        return NULL;
    memset(out, 0, sizeof *out);
    out->ntraces = ntraces;
    ct_replay *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->ntraces = ntraces;
    r->lives.elem = sizeof(struct life);
    r->hows.elem = 1;
    r->rests.elem = sizeof(struct rest);
    r->failed.elem = r->denied.elem = r->meminfo.elem = sizeof(struct listed);
    uint32_t nt = ntraces ? ntraces : 1;
    r->ev = calloc(nt, sizeof *r->ev);
    r->nev = calloc(nt, sizeof *r->nev);
    r->order = calloc(nt, sizeof *r->order);
    r->proc = calloc(nt, sizeof *r->proc);
    uint64_t *proc_cur = calloc(nt, sizeof *proc_cur), *proc_host = calloc(nt, sizeof *proc_host);
    uint64_t *ends = calloc(nt, sizeof *ends);
    struct source *src = calloc(nt, sizeof *src);
    struct stream *streams = NULL;
    struct cursor *heap = NULL;
    uint32_t nstreams = 0;
    if (!r->ev || !r->nev || !r->order || !r->proc || !proc_cur || !proc_host || !ends || !src)
        goto fail;
    for (int i = 0; i < CT_REPLAY_DEV_SLOTS; i++)
        r->dev[i].device = i - 1;

    /* the streams: one per array, one per thread of a trace read from its blocks */
    uint64_t t0 = NONE64, t1 = 0, total = 0, want = 0;
    for (uint32_t i = 0; i < ntraces; i++) {
        const struct ct_replay_trace *t = &traces[i];
        src[i].t = t;
        ends[i] = t->end_ts;
        if (t->events) {
            r->ev[i] = t->events;
            r->nev[i] = t->n;
            want += t->n ? 1 : 0;
        } else if (t->buf && t->segs && t->n) {
            r->nev[i] = t->n;
            want += t->n_segs;
        }
    }
    /* a device allocation is an event: room for as many lives as events, as address space */
    uint64_t events = 0;
    for (uint32_t i = 0; i < ntraces; i++)
        events += r->nev[i];
    if (vec_map(&r->lives, events) == 0) /* else the vectors grow by realloc */
        vec_map(&r->hows, events);
    streams = calloc(want ? want : 1, sizeof *streams);
    heap = calloc((want ? want : 1), sizeof *heap);
    if (!streams || !heap)
        goto fail;
    struct state st = {r,
                       {NULL, 0, 0, 0},
                       {NULL, 0, 0, sizeof(uint64_t), 0},
                       {NULL, 0, 0, sizeof(struct mapping), 0},
                       out,
                       0,
                       0,
                       proc_cur,
                       proc_host,
                       0,
                       0,
                       {0},
                       src};
    uint64_t read = 0;
    uint32_t nh = 0;
    for (uint32_t i = 0; i < ntraces; i++) {
        const struct ct_replay_trace *t = &traces[i];
        uint64_t n = r->nev[i];
        if (!n)
            continue;
        if (t->events) {
            if (!sorted_by_ts(t->events, n)) {
                out->c.unsorted_traces++;
                r->order[i] = sort_order(t->events, n);
                if (!r->order[i])
                    goto fail;
            }
            const uint32_t *o = r->order[i];
            uint64_t first = t->events[o ? o[0] : 0].ts_ns,
                     last = t->events[o ? o[n - 1] : n - 1].ts_ns;
            t0 = first < t0 ? first : t0;
            t1 = last > t1 ? last : t1;
            streams[nstreams++] = (struct stream){.trace = i};
        } else {
            uint32_t nf = 0, *f = first_blocks(t, &nf);
            if (!f)
                goto fail;
            for (uint32_t k = 0; k < nf; k++) {
                struct stream *m = &streams[nstreams++];
                m->trace = i;
                enter(m, t, f[k]);
            }
            free(f);
            t0 = t->min_ts < t0 ? t->min_ts : t0;
            t1 = t->max_ts > t1 ? t->max_ts : t1;
        }
        total += n;
    }
    if (!total)
        t0 = 0;
    out->t0 = t0;
    out->t_end = t1;
    r->t0 = t0;
    r->span = t1 - t0;
    r->buckets = cfg->buckets;
    if (r->buckets) {
        r->tl_all = calloc(r->buckets, sizeof *r->tl_all);
        if (!r->tl_all)
            goto fail;
    }
    for (uint32_t k = 0; k < nstreams; k++) {
        struct stream *m = &streams[k];
        if (!refill(&st, m, &read))
            continue;
        src[m->trace].active++;
        heap[nh++] = (struct cursor){m->ev[0].ts_ns, m->idx[0], m->trace, 0, k, 0};
    }
    for (uint32_t i = nh; i-- > 0;)
        sift_down(heap, nh, i);

    uint64_t seq = 0;
    while (nh) {
        struct cursor *c = &heap[0];
        uint32_t ti = c->trace;
        if (c->exit) {
            process_end(&st, ti, seq, c->ts);
            if (r->oom)
                break;
            heap[0] = heap[--nh];
            if (nh > 1)
                sift_down(heap, nh, 0);
            continue;
        }
        struct stream *m = &streams[c->stream];
        const struct ct_event *e = &m->ev[m->head];
        /* the free after this one will write its life, far back in memory: its slot was
         * asked for when it was decoded, so ask for the life now */
        if (m->head + 2 < m->n && st.tab.cap) {
            const struct ct_event *f = &m->ev[m->head + 2];
            if (f->op == CT_OP_FREE) {
                const struct slot *x = tget(&st.tab, TAG(ti, 0, f->space), f->addr);
                if (x && TAG_STATE(x->tag) == ST_DEV)
                    __builtin_prefetch(life_at(r, x->ref), 1);
            }
        }
        step(&st, ti, (uint32_t)m->idx[m->head], e, seq, cfg);
        if (r->oom)
            break;
        seq++;
        src[ti].last_ts = e->ts_ns;
        if (m->idx[m->head] < src[ti].next_idx && !src[ti].unsorted && !src[ti].t->events) {
            src[ti].unsorted = 1; /* as an array's sort would count it */
            out->c.unsorted_traces++;
        }
        src[ti].next_idx = m->idx[m->head] + 1;
        /* advance this cursor: the common case (one stream, or the same one again) stays cheap */
        if (++m->head < m->n || refill(&st, m, &read)) {
            c->ts = m->ev[m->head].ts_ns;
            c->idx = m->idx[m->head];
        } else if (--src[ti].active == 0 && ends[ti]) {
            c->exit = 1; /* the trace is done: its process's end comes next */
            c->ts = ends[ti] > src[ti].last_ts ? ends[ti] : src[ti].last_ts;
        } else {
            heap[0] = heap[--nh];
        }
        if (nh > 1)
            sift_down(heap, nh, 0);
        if (read >= DROP_BYTES) {
            drop_pages(&st, ntraces);
            read = 0;
        }
    }
    drop_pages(&st, ntraces);
    tfree(&st.tab);
    free(st.hosts.p);
    free(st.maps.p);
    if (r->oom)
        goto fail;
    out->c.events = seq;
    out->end_bytes = st.cur + st.exited;
    out->host_end = st.host_cur + st.host_exited;
    out->lives = r->lives.n;
    for (int i = 0; i < CT_REPLAY_DEV_SLOTS; i++)
        r->dev[i].end_bytes = r->dev_cur[i] + st.dev_exited[i];
    for (uint32_t i = 0; i < ntraces; i++)
        if (!ends[i] || !r->nev[i])
            r->proc[i].end_bytes = proc_cur[i];
    /* the events are not needed any more: the queries read the lives */
    for (uint32_t i = 0; i < ntraces; i++) {
        free(r->order[i]);
        r->order[i] = NULL;
        r->ev[i] = NULL;
    }
    free(proc_cur);
    free(proc_host);
    free(ends);
    free(src);
    free(streams);
    free(heap);
    return r;
fail:
    free(proc_cur);
    free(proc_host);
    free(ends);
    free(src);
    free(streams);
    free(heap);
    ct_replay_free(r);
    return NULL;
}

int32_t ct_replay_device(const ct_replay *r, uint32_t slot, struct ct_replay_device *out)
{
    if (!r || slot >= CT_REPLAY_DEV_SLOTS || !out)
        return 0;
    *out = r->dev[slot];
    return (int32_t)r->dev[slot].seen;
}

int32_t ct_replay_proc(const ct_replay *r, uint32_t trace, struct ct_replay_proc *out)
{
    if (!r || trace >= r->ntraces || !out)
        return 0;
    *out = r->proc[trace];
    return 1;
}

uint32_t ct_replay_timeline(const ct_replay *r, int32_t device, struct ct_replay_bucket *out,
                            uint32_t max)
{
    if (!r || !r->buckets)
        return 0;
    const struct ct_replay_bucket *b =
        device == CT_REPLAY_ANY_DEVICE ? r->tl_all : r->tl_dev[dev_slot(device)];
    uint32_t n = r->buckets < max ? r->buckets : max;
    if (!b) {
        if (out)
            memset(out, 0, n * sizeof *out);
        return n;
    }
    if (out)
        memcpy(out, b, n * sizeof *out);
    return n;
}

static inline int live_at(const ct_replay *r, const struct life *L, uint32_t by, uint64_t v)
{
    if (by == CT_REPLAY_NEVER_FREED) {
        uint8_t how = *how_at(r, (uint64_t)(L - (const struct life *)r->lives.p));
        return how == CT_END_LIVE || how == CT_END_EXITED;
    }
    if (by == CT_REPLAY_BY_SEQ)
        return L->seq <= v && v < L->end_seq;
    return L->ts <= v && v < L->end_ts;
}

static inline int on_device(const ct_replay *r, const struct life *L, int32_t device)
{
    return device == CT_REPLAY_ANY_DEVICE || life_dev(r, L) == device;
}

static void fill(const ct_replay *r, const struct life *L, struct ct_live *o)
{
    const struct rest *x = rest_at(r, L->rest);
    o->ev = x->ev;
    o->ev.ts_ns = L->ts;
    o->ev.size = L->size;
    o->ev.addr = L->addr;
    o->trace = x->trace;
    o->index = L->idx;
    o->seq = L->seq;
    o->end_seq = L->end_seq;
    o->end_ts = L->end_ts;
    o->how = *how_at(r, (uint64_t)(L - (const struct life *)r->lives.p));
    o->reserved = 0;
}

uint64_t ct_replay_select(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                          struct ct_live *out, uint64_t max)
{
    if (!r)
        return 0;
    const struct life *lv = r->lives.p;
    uint64_t n = 0;
    for (uint64_t i = 0; i < r->lives.n; i++) {
        const struct life *L = &lv[i];
        if (!live_at(r, L, by, value) || !on_device(r, L, device))
            continue;
        if (out && n < max)
            fill(r, L, &out[n]);
        n++;
    }
    return n;
}

uint64_t ct_replay_live_bytes(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                              uint64_t *count)
{
    uint64_t bytes = 0, n = 0;
    if (r) {
        const struct life *lv = r->lives.p;
        for (uint64_t i = 0; i < r->lives.n; i++) {
            const struct life *L = &lv[i];
            if (!live_at(r, L, by, value) || !on_device(r, L, device))
                continue;
            bytes += L->size;
            n++;
        }
    }
    if (count)
        *count = n;
    return bytes;
}

uint64_t ct_replay_all(const ct_replay *r, struct ct_live *out, uint64_t max)
{
    if (!r)
        return 0;
    const struct life *lv = r->lives.p;
    for (uint64_t i = 0; out && i < r->lives.n && i < max; i++)
        fill(r, &lv[i], &out[i]);
    return r->lives.n;
}

uint64_t ct_replay_list(const ct_replay *r, uint32_t which, struct ct_live *out, uint64_t max)
{
    if (!r)
        return 0;
    const struct vec *v = which == CT_REPLAY_LIST_FAILED    ? &r->failed
                          : which == CT_REPLAY_LIST_DENIED  ? &r->denied
                          : which == CT_REPLAY_LIST_MEMINFO ? &r->meminfo
                                                            : NULL;
    if (!v)
        return 0;
    const struct listed *rf = v->p;
    for (uint64_t i = 0; out && i < v->n && i < max; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].ev = rf[i].ev;
        out[i].trace = rf[i].trace;
        out[i].index = rf[i].idx;
        out[i].seq = rf[i].seq;
        out[i].end_seq = NONE64;
        out[i].end_ts = NONE64;
    }
    return v->n;
}

uint64_t ct_replay_stack_totals(const ct_replay *r, struct ct_stack_total *out, uint64_t max)
{
    if (!r)
        return 0;
    /* a small open-addressing map (trace, stack) -> index into a growing array of totals */
    uint64_t cap = 1024, n = 0, tcap = 256;
    uint64_t *map = malloc(cap * sizeof *map);
    struct ct_stack_total *tot = malloc(tcap * sizeof *tot);
    if (!map || !tot) {
        free(map);
        free(tot);
        return 0;
    }
    memset(map, 0xff, cap * sizeof *map);
    const struct life *lv = r->lives.p;
    for (uint64_t i = 0; i < r->lives.n; i++) {
        const struct rest *x = rest_at(r, lv[i].rest);
        uint32_t tr = x->trace, st = x->ev.stack;
        if ((n + 1) * 2 > cap) {
            uint64_t nc = cap * 2;
            uint64_t *nm = malloc(nc * sizeof *nm);
            if (!nm)
                goto out;
            memset(nm, 0xff, nc * sizeof *nm);
            for (uint64_t k = 0; k < n; k++) {
                uint64_t j = mix(tot[k].trace, tot[k].stack) & (nc - 1);
                while (nm[j] != NONE64)
                    j = (j + 1) & (nc - 1);
                nm[j] = k;
            }
            free(map);
            map = nm;
            cap = nc;
        }
        uint64_t j = mix(tr, st) & (cap - 1);
        while (map[j] != NONE64 && !(tot[map[j]].trace == tr && tot[map[j]].stack == st))
            j = (j + 1) & (cap - 1);
        if (map[j] == NONE64) {
            if (n == tcap) {
                struct ct_stack_total *nt = realloc(tot, tcap * 2 * sizeof *tot);
                if (!nt)
                    goto out;
                tot = nt;
                tcap *= 2;
            }
            tot[n] = (struct ct_stack_total){tr, st, 0, 0};
            map[j] = n++;
        }
        tot[map[j]].count++;
        tot[map[j]].bytes += lv[i].size;
    }
out:
    if (out)
        memcpy(out, tot, (n < max ? n : max) * sizeof *tot);
    free(map);
    free(tot);
    return n;
}

/* LSD radix sort of n sizes (tmp: room for n), skipping the byte positions where all agree */
static void radix_u64(uint64_t *a, uint64_t *tmp, uint64_t n)
{
    if (n < 64) {
        for (uint64_t i = 1; i < n; i++) {
            uint64_t x = a[i], j = i;
            while (j > 0 && a[j - 1] > x) {
                a[j] = a[j - 1];
                j--;
            }
            a[j] = x;
        }
        return;
    }
    uint64_t or_all = 0, and_all = NONE64;
    for (uint64_t i = 0; i < n; i++) {
        or_all |= a[i];
        and_all &= a[i];
    }
    uint64_t *src = a, *dst = tmp;
    for (int shift = 0; shift < 64; shift += 8) {
        if ((((or_all ^ and_all) >> shift) & 0xff) == 0)
            continue; /* this byte is the same everywhere */
        uint64_t cnt[256] = {0};
        for (uint64_t i = 0; i < n; i++)
            cnt[(src[i] >> shift) & 0xff]++;
        uint64_t sum = 0;
        for (int b = 0; b < 256; b++) {
            uint64_t c = cnt[b];
            cnt[b] = sum;
            sum += c;
        }
        for (uint64_t i = 0; i < n; i++)
            dst[cnt[(src[i] >> shift) & 0xff]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sizeof *a);
}

struct gacc {
    uint64_t k1; /* trace << 32 | stack */
    uint64_t k2; /* api << 48 | rt_api << 32 | (uint32_t)device */
    uint64_t count, bytes, first_ts, last_ts, off, fill;
};

static int gacc_cmp(const void *a, const void *b)
{
    const struct gacc *x = a, *y = b;
    if (x->k1 != y->k1)
        return x->k1 < y->k1 ? -1 : 1;
    if (x->k2 != y->k2)
        return x->k2 < y->k2 ? -1 : 1;
    return 0;
}

uint64_t ct_replay_groups(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                          struct ct_group *out, uint64_t max, uint64_t *sizes, uint64_t max_sizes)
{
    if (!r)
        return 0;
    /* pass 1: the groups, through a small hash of their keys; each live allocation's group is
     * remembered so pass 2 need not hash again */
    uint64_t gcap = 256, ng = 0, hcap = 1024, nsel = 0;
    struct gacc *g = malloc(gcap * sizeof *g);
    uint64_t *h = malloc(hcap * sizeof *h);
    uint32_t *gi = malloc((r->lives.n ? r->lives.n : 1) * sizeof *gi);
    uint64_t *tmp = NULL;
    uint64_t result = NONE64;
    if (!g || !h || !gi)
        goto out;
    memset(h, 0xff, hcap * sizeof *h);
    const struct life *lv = r->lives.p;
    for (uint64_t i = 0; i < r->lives.n; i++) {
        const struct life *L = &lv[i];
        gi[i] = UINT32_MAX;
        if (!live_at(r, L, by, value) || !on_device(r, L, device))
            continue;
        const struct ct_event *e = &rest_at(r, L->rest)->ev;
        uint64_t k1 = (uint64_t)rest_at(r, L->rest)->trace << 32 | e->stack;
        uint64_t k2 = (uint64_t)e->api << 48 | (uint64_t)e->rt_api << 32 | (uint32_t)e->device;
        uint64_t j = mix((uint32_t)(k2 >> 32) ^ (uint32_t)k2, k1) & (hcap - 1);
        while (h[j] != NONE64 && !(g[h[j]].k1 == k1 && g[h[j]].k2 == k2))
            j = (j + 1) & (hcap - 1);
        if (h[j] == NONE64) {
            if (ng == gcap) {
                struct gacc *ng2 = realloc(g, gcap * 2 * sizeof *g);
                if (!ng2)
                    goto out;
                g = ng2;
                gcap *= 2;
            }
            g[ng] = (struct gacc){k1, k2, 0, 0, L->ts, L->ts, 0, 0};
            h[j] = ng++;
            if (ng * 2 > hcap) { /* rehash */
                uint64_t nc = hcap * 2, *nh = malloc(nc * sizeof *nh);
                if (!nh)
                    goto out;
                memset(nh, 0xff, nc * sizeof *nh);
                for (uint64_t k = 0; k < ng; k++) {
                    uint64_t q =
                        mix((uint32_t)(g[k].k2 >> 32) ^ (uint32_t)g[k].k2, g[k].k1) & (nc - 1);
                    while (nh[q] != NONE64)
                        q = (q + 1) & (nc - 1);
                    nh[q] = k;
                }
                free(h);
                h = nh;
                hcap = nc;
                j = NONE64; /* found again below */
            }
            if (j == NONE64) {
                j = mix((uint32_t)(k2 >> 32) ^ (uint32_t)k2, k1) & (hcap - 1);
                while (!(g[h[j]].k1 == k1 && g[h[j]].k2 == k2))
                    j = (j + 1) & (hcap - 1);
            }
        }
        struct gacc *a = &g[h[j]];
        a->count++;
        a->bytes += L->size;
        if (L->ts < a->first_ts)
            a->first_ts = L->ts;
        if (L->ts > a->last_ts)
            a->last_ts = L->ts;
        gi[i] = (uint32_t)h[j];
        nsel++;
    }
    /* groups in key order; then each group's sizes, contiguous, ascending */
    uint32_t *rank = malloc((ng ? ng : 1) * sizeof *rank);
    if (!rank)
        goto out;
    for (uint64_t k = 0; k < ng; k++)
        g[k].fill = k; /* remember the unsorted index */
    qsort(g, ng, sizeof *g, gacc_cmp);
    uint64_t off = 0;
    for (uint64_t k = 0; k < ng; k++) {
        rank[g[k].fill] = (uint32_t)k;
        g[k].off = off;
        off += g[k].count;
        g[k].fill = g[k].off;
    }
    if (sizes && max_sizes >= nsel) {
        for (uint64_t i = 0; i < r->lives.n; i++)
            if (gi[i] != UINT32_MAX)
                sizes[g[rank[gi[i]]].fill++] = lv[i].size;
        uint64_t biggest = 0;
        for (uint64_t k = 0; k < ng; k++)
            if (g[k].count > biggest)
                biggest = g[k].count;
        tmp = malloc((biggest ? biggest : 1) * sizeof *tmp);
        if (!tmp) {
            free(rank);
            goto out;
        }
        for (uint64_t k = 0; k < ng; k++)
            radix_u64(sizes + g[k].off, tmp, g[k].count);
    }
    for (uint64_t k = 0; out && k < ng && k < max; k++) {
        struct ct_group *o = &out[k];
        o->trace = (uint32_t)(g[k].k1 >> 32);
        o->stack = (uint32_t)g[k].k1;
        o->api = (uint16_t)(g[k].k2 >> 48);
        o->rt_api = (uint16_t)(g[k].k2 >> 32);
        o->device = (int32_t)(uint32_t)g[k].k2;
        o->count = g[k].count;
        o->bytes = g[k].bytes;
        o->first_ts = g[k].first_ts;
        o->last_ts = g[k].last_ts;
        o->sizes = g[k].off;
    }
    free(rank);
    result = ng;
out:
    free(g);
    free(h);
    free(gi);
    free(tmp);
    return result;
}

static uint64_t lower_bound(const uint64_t *a, uint64_t n, uint64_t v)
{
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* lower_bound over ts[0..n) through a table of where each of nb equal slices of [lo, hi]
 * begins (tab[nb + 1]) */
struct finder {
    const uint64_t *ts;
    uint64_t n, lo, width, nb;
    uint64_t *tab;
};

static uint64_t find(const struct finder *f, uint64_t v)
{
    if (!f->tab || v <= f->lo)
        return lower_bound(f->ts, f->n, v);
    uint64_t b = (v - f->lo) / f->width;
    if (b >= f->nb)
        return lower_bound(f->ts, f->n, v);
    uint64_t a = f->tab[b], e = f->tab[b + 1];
    return a + lower_bound(f->ts + a, e - a, v);
}

void ct_replay_bytes_at(const ct_replay *r, const uint64_t *ts, uint64_t n, int32_t device,
                        uint64_t *out)
{
    if (!out)
        return;
    memset(out, 0, n * sizeof *out);
    if (!r || !n || !ts)
        return;
    /* a difference array: +size where a lifetime starts covering samples, -size where it stops */
    int64_t *d = calloc(n + 1, sizeof *d);
    if (!d)
        return;
    struct finder f = {ts, n, ts[0], 1, 4096, NULL};
    if (ts[n - 1] > ts[0] && (f.tab = malloc((f.nb + 1) * sizeof *f.tab)) != NULL) {
        f.width = (ts[n - 1] - ts[0]) / f.nb + 1;
        for (uint64_t k = 0; k <= f.nb; k++)
            f.tab[k] = lower_bound(ts, n, k < f.nb ? ts[0] + k * f.width : NONE64);
    }
    const struct life *lv = r->lives.p;
    uint64_t a = 0, prev = 0;
    for (uint64_t i = 0; i < r->lives.n; i++) {
        const struct life *L = &lv[i];
        if (!on_device(r, L, device))
            continue;
        if (L->ts < prev) /* lives are in replay order, so in time order: never, but be sure */
            a = 0;
        prev = L->ts;
        while (a < n && ts[a] < L->ts) /* the samples before it: a walk, not a search */
            a++;
        uint64_t b = L->end_ts == NONE64 ? n : find(&f, L->end_ts);
        if (a < b) {
            d[a] += (int64_t)L->size;
            d[b] -= (int64_t)L->size;
        }
    }
    free(f.tab);
    int64_t run = 0;
    for (uint64_t k = 0; k < n; k++) {
        run += d[k];
        out[k] = (uint64_t)run;
    }
    free(d);
}

/* a change of the traced bytes: +size at an allocation's time, -size at its end */
struct step {
    uint64_t ts;
    int64_t d;
};

static int step_cmp(const void *a, const void *b)
{
    const struct step *x = a, *y = b;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return (x->d > 0) - (y->d > 0); /* at one time, the ends first: never a false maximum */
}

/* whether t falls in some window (lo[k], hi[k]] (lo and hi ascending) */
static int in_window(const uint64_t *lo, const uint64_t *hi, uint64_t n, uint64_t t)
{
    uint64_t k = lower_bound(hi, n, t);
    return k < n && lo[k] < t;
}

struct steps {
    struct step *p;
    uint64_t n, cap;
};

static int steps_add(struct steps *s, uint64_t ts, int64_t d)
{
    if (s->n == s->cap) {
        uint64_t cap = s->cap ? 2 * s->cap : 256;
        struct step *p = realloc(s->p, cap * sizeof *p);
        if (!p)
            return 0;
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (struct step){ts, d};
    return 1;
}

/* the changes that fall inside some window, in time order */
static int window_steps(const ct_replay *r, const uint64_t *lo, const uint64_t *hi, uint64_t n,
                        int32_t device, struct steps *s)
{
    const struct life *lv = r->lives.p;
    for (uint64_t i = 0; i < r->lives.n; i++) {
        const struct life *L = &lv[i];
        if (!on_device(r, L, device))
            continue;
        if (in_window(lo, hi, n, L->ts) && !steps_add(s, L->ts, (int64_t)L->size))
            return 0;
        if (L->end_ts != NONE64 && in_window(lo, hi, n, L->end_ts) &&
            !steps_add(s, L->end_ts, -(int64_t)L->size))
            return 0;
    }
    if (s->n)
        qsort(s->p, s->n, sizeof *s->p, step_cmp);
    return 1;
}

int32_t ct_replay_bytes_max(const ct_replay *r, const uint64_t *lo, const uint64_t *hi, uint64_t n,
                            int32_t device, uint64_t *out)
{
    if (!out)
        return 0;
    ct_replay_bytes_at(r, lo, n, device, out); /* each window's first moment */
    if (!r || !n || !lo || !hi)
        return 0;
    struct steps s = {NULL, 0, 0};
    if (!window_steps(r, lo, hi, n, device, &s)) {
        free(s.p);
        memset(out, 0, n * sizeof *out);
        return -1;
    }
    uint64_t j = 0;
    for (uint64_t k = 0; k < n; k++) {
        while (j < s.n && s.p[j].ts <= lo[k])
            j++;
        int64_t v = (int64_t)out[k], best = v;
        for (uint64_t i = j; i < s.n && s.p[i].ts <= hi[k]; i++) {
            v += s.p[i].d;
            if ((i + 1 == s.n || s.p[i + 1].ts != s.p[i].ts) && v > best)
                best = v;
        }
        out[k] = (uint64_t)best;
    }
    free(s.p);
    return 0;
}
