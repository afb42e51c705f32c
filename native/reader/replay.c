/* replay.c - the model's hot loop (cudatrace/analyze/replay/model.py calls it through cffi; built into
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
#include "replay_model.h"

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

#define VMM_RELEASED 0x80000000u /* cuMemRelease seen while mapped */

struct mapping {
    uint64_t handle, size;
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

/* ---- the rules: one function per kind of event (the header's list) ---- */

/* a listed event (failed, denied, memory query): kept whole */
static void list_event(struct state *st, struct vec *v, const struct listed *ref)
{
    if (vec_push(v, ref))
        st->r->oom = 1;
}

/* an allocation at a key still live: the old one is gone (the caller starts the new one) */
static void end_reused(struct state *st, uint32_t ti, struct slot *sl, uint64_t seq, uint64_t ts)
{
    st->s->c.reused++;
    if (TAG_STATE(sl->tag) == ST_DEV)
        end_life(st, sl, seq, ts, CT_END_REUSED);
    else if (TAG_STATE(sl->tag) == ST_HOST) {
        st->host_cur -= host_size(st, sl->ref);
        st->proc_host[ti] -= host_size(st, sl->ref);
    }
    tdel(&st->tab, sl);
}

/* the run's, the device's and the process's peaks after an allocation raised their bytes */
static void note_peaks(struct state *st, uint32_t ti, uint32_t ds, uint64_t seq, uint64_t ts)
{
    ct_replay *r = st->r;
    struct ct_replay_summary *s = st->s;
    struct ct_replay_device *d = &r->dev[ds];
    struct ct_replay_proc *p = &r->proc[ti];
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
}

/* a device allocation begins: its life, its slot sl, the counts, the peaks, the timeline */
static void start_life(struct state *st, uint32_t ti, uint32_t idx, const struct ct_event *e,
                       uint64_t seq, struct slot *sl)
{
    ct_replay *r = st->r;
    uint32_t ri = rest_id(r, ti, e);
    struct life L = {seq, NONE64, e->ts_ns, NONE64, e->size, e->addr, idx, ri};
    uint8_t how = CT_END_LIVE;
    sl->tag = TAG(ti, ST_DEV, e->space);
    sl->ref = (uint32_t)r->lives.n;
    if (ri == UINT32_MAX || r->lives.n >= UINT32_MAX || vec_push(&r->lives, &L) ||
        vec_push(&r->hows, &how)) {
        r->oom = 1;
        return;
    }
    uint32_t ds = dev_slot(e->device);
    st->s->c.allocs++;
    r->proc[ti].allocs++;
    r->dev[ds].seen = 1;
    r->dev[ds].allocs++;
    st->cur += e->size;
    r->dev_cur[ds] += e->size;
    st->proc_cur[ti] += e->size;
    note_peaks(st, ti, ds, seq, e->ts_ns);
    changed(st, ds, e->ts_ns);
}

/* a pinned host allocation begins (counted apart from device memory) */
static void start_host(struct state *st, uint32_t ti, const struct ct_event *e, struct slot *sl)
{
    struct ct_replay_summary *s = st->s;
    uint64_t size = e->size;
    sl->tag = TAG(ti, ST_HOST, e->space);
    sl->ref = (uint32_t)st->hosts.n;
    if (vec_push(&st->hosts, &size)) {
        st->r->oom = 1;
        return;
    }
    s->c.host_allocs++;
    st->r->proc[ti].host_allocs++;
    st->host_cur += size;
    st->proc_host[ti] += size;
    if (st->host_cur > s->host_peak) {
        s->host_peak = st->host_cur;
        s->host_peak_ts = e->ts_ns;
    }
}

/* ALLOC: a failure is listed; a device or pinned host allocation begins at its key */
static void on_alloc(struct state *st, uint32_t ti, const struct listed *ref,
                     const struct ct_replay_config *cfg)
{
    const struct ct_event *e = &ref->ev;
    if (e->result != 0) {
        st->s->c.failed++;
        st->r->proc[ti].failed++;
        list_event(st, &st->r->failed, ref);
        return;
    }
    int kind = e->kind < 64 ? e->kind : 63;
    int is_dev = (cfg->device_kinds >> kind) & 1, is_host = (cfg->host_kinds >> kind) & 1;
    if (!is_dev && !is_host) {
        st->s->c.other++;
        return;
    }
    uint32_t key = TAG(ti, 0, e->space);
    struct slot *sl = tget(&st->tab, key, e->addr);
    if (sl)
        end_reused(st, ti, sl, ref->seq, e->ts_ns);
    sl = tput(&st->tab, key, e->addr);
    if (!sl)
        st->r->oom = 1;
    else if (is_dev)
        start_life(st, ti, ref->idx, e, ref->seq, sl);
    else
        start_host(st, ti, e, sl);
}

/* cuMemRelease of a handle imported from another process: someone else's memory, never
 * counted. 1 when it was one */
static int released_import(struct state *st, uint32_t ti, const struct ct_event *e)
{
    struct slot *im = tget(&st->tab, TAG(ti, 0, IMPORT_SPACE), e->addr);
    if (!im)
        return 0;
    tdel(&st->tab, im);
    st->s->c.unimports++;
    return 1;
}

/* FREE: the allocation of its key ends (a released VMM handle still mapped: at its last unmap) */
static void on_free(struct state *st, uint32_t ti, const struct ct_event *e, uint64_t seq)
{
    struct ct_replay_summary *s = st->s;
    if (e->result != 0) {
        s->c.failed_frees++;
        return;
    }
    if (e->addr == 0) {
        s->c.null_frees++;
        return;
    }
    struct slot *sl = tget(&st->tab, TAG(ti, 0, e->space), e->addr);
    if (!sl && e->space == CT_SPACE_VMM && released_import(st, ti, e))
        return;
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
    st->r->proc[ti].frees++;
    uint32_t v = vmm_get(st->r, sl->ref);
    if (e->space == CT_SPACE_VMM && (v & ~VMM_RELEASED) > 0) {
        if (vmm_set(st->r, sl->ref, v | VMM_RELEASED)) /* the driver frees it at the last unmap */
            st->r->oom = 1;
        s->c.deferred_releases++;
        return;
    }
    end_life(st, sl, seq, e->ts_ns, CT_END_FREE);
    tdel(&st->tab, sl);
}

/* the mapping at slot m goes away (the caller found it) */
static void drop_mapping(struct state *st, uint32_t ti, struct slot *m, uint64_t seq, uint64_t ts)
{
    uint64_t hv = mapping_at(st, m->ref)->handle;
    tdel(&st->tab, m);
    unmapped(st, ti, hv, seq, ts);
}

/* MAP (cuMemMap): a mapping of a handle; the handle counts its mappings */
static void on_map(struct state *st, uint32_t ti, const struct ct_event *e, uint64_t seq)
{
    ct_replay *r = st->r;
    if (e->result != 0) {
        st->s->c.other++;
        return;
    }
    st->s->c.maps++;
    uint32_t mkey = TAG(ti, 0, MAP_SPACE);
    struct slot *m = tget(&st->tab, mkey, e->addr);
    if (m) /* a mapping we missed the end of: drop it */
        drop_mapping(st, ti, m, seq, e->ts_ns);
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
}

/* an unmap of a range over several mappings, or none starting there: every mapping of this
 * trace that starts inside the range goes (rare: collected first, deleting moves slots), in
 * address order (as model.py does) */
static void unmap_range(struct state *st, uint32_t ti, const struct ct_event *e, uint64_t seq)
{
    uint64_t n = 0, cap = 0, *found = NULL;
    for (uint64_t i = 0; i < st->tab.cap; i++) {
        struct slot *x = &st->tab.s[i];
        if (!(x->tag && TAG_STATE(x->tag) == ST_MAP && TAG_TRACE(x->tag) == ti &&
              x->addr >= e->addr && x->addr - e->addr < e->size))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t *f = realloc(found, cap * sizeof *f);
            if (!f) {
                free(found);
                st->r->oom = 1;
                return;
            }
            found = f;
        }
        found[n++] = x->addr;
    }
    if (!n) {
        st->s->c.unmatched_unmaps++;
        return; /* found is NULL: qsort may not be given it, even for no elements */
    }
    qsort(found, n, sizeof *found, u64_cmp);
    for (uint64_t k = 0; k < n; k++) {
        struct slot *x = tget(&st->tab, TAG(ti, 0, MAP_SPACE), found[k]);
        if (x)
            drop_mapping(st, ti, x, seq, e->ts_ns);
    }
    free(found);
}

/* UNMAP (cuMemUnmap): its mappings go; a released handle's last one frees its memory */
static void on_unmap(struct state *st, uint32_t ti, const struct ct_event *e, uint64_t seq)
{
    if (e->result != 0) {
        st->s->c.other++;
        return;
    }
    st->s->c.unmaps++;
    struct slot *m = tget(&st->tab, TAG(ti, 0, MAP_SPACE), e->addr);
    if (m && mapping_at(st, m->ref)->size >= e->size) /* one mapping, unmapped whole */
        drop_mapping(st, ti, m, seq, e->ts_ns);
    else
        unmap_range(st, ti, e, seq);
}

/* IMPORT (cuMemImportFromShareableHandle): the handle is noted, never counted */
static void on_import(struct state *st, uint32_t ti, const struct ct_event *e)
{
    st->s->c.imports++;
    if (e->result != 0 || !e->addr || e->space != CT_SPACE_VMM)
        return;
    struct slot *im = tput(&st->tab, TAG(ti, 0, IMPORT_SPACE), e->addr);
    if (!im) {
        st->r->oom = 1;
        return;
    }
    im->tag = TAG(ti, ST_HOST, IMPORT_SPACE);
    im->ref = 0;
}

/* one event of trace ti, the seq-th of the merged run: its process's counts, then its rule */
static void step(struct state *st, uint32_t ti, uint32_t idx, const struct ct_event *e,
                 uint64_t seq, const struct ct_replay_config *cfg)
{
    struct ct_replay_summary *s = st->s;
    struct ct_replay_proc *p = &st->r->proc[ti];
    struct listed ref = {seq, ti, idx, *e};
    p->events++;
    if (!p->first_ts || e->ts_ns < p->first_ts)
        p->first_ts = e->ts_ns;
    if (e->ts_ns > p->last_ts)
        p->last_ts = e->ts_ns;
    switch (e->op) {
    case CT_OP_ALLOC:
        on_alloc(st, ti, &ref, cfg);
        return;
    case CT_OP_FREE:
        on_free(st, ti, e, seq);
        return;
    case CT_OP_MAP:
        on_map(st, ti, e, seq);
        return;
    case CT_OP_UNMAP:
        on_unmap(st, ti, e, seq);
        return;
    case CT_OP_DENY:
        s->c.denied++;
        p->denied++;
        list_event(st, &st->r->denied, &ref);
        return;
    case CT_OP_MEMINFO:
        s->c.meminfo++;
        p->meminfo++;
        list_event(st, &st->r->meminfo, &ref);
        return;
    case CT_OP_IMPORT:
        on_import(st, ti, e);
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
    ct_replay_radix_u64(devs, tmp, nd);
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

/* the merge: every stream's next event in a heap of cursors */
struct merge {
    struct stream *streams;
    struct cursor *heap;
    uint32_t nstreams, nh;
    uint64_t read; /* bytes of mapped files read since their pages were last dropped */
};

/* a replay with nothing in it yet, for ntraces traces; NULL when out of memory */
static ct_replay *replay_new(uint32_t ntraces)
{
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
    if (!r->ev || !r->nev || !r->order || !r->proc) {
        ct_replay_free(r);
        return NULL;
    }
    for (int i = 0; i < CT_REPLAY_DEV_SLOTS; i++)
        r->dev[i].device = i - 1;
    return r;
}

/* the pass's own state for r (its tables start empty); -1 when out of memory */
static int state_open(struct state *st, ct_replay *r, uint32_t ntraces,
                      struct ct_replay_summary *out)
{
    uint32_t nt = ntraces ? ntraces : 1;
    memset(st, 0, sizeof *st);
    st->r = r;
    st->s = out;
    st->hosts.elem = sizeof(uint64_t);
    st->maps.elem = sizeof(struct mapping);
    st->proc_cur = calloc(nt, sizeof *st->proc_cur);
    st->proc_host = calloc(nt, sizeof *st->proc_host);
    st->src = calloc(nt, sizeof *st->src);
    return st->proc_cur && st->proc_host && st->src ? 0 : -1;
}

static void state_close(struct state *st)
{
    tfree(&st->tab);
    free(st->hosts.p);
    free(st->maps.p);
    free(st->proc_cur);
    free(st->proc_host);
    free(st->src);
}

/* each trace's source and events; room for as many lives as events (a device allocation is an
 * event), as address space. The number of streams: one per array, one per thread of a trace
 * read from its blocks (each thread's first block) */
static uint64_t count_streams(struct state *st, const struct ct_replay_trace *traces,
                              uint32_t ntraces)
{
    ct_replay *r = st->r;
    uint64_t want = 0, events = 0;
    for (uint32_t i = 0; i < ntraces; i++) {
        const struct ct_replay_trace *t = &traces[i];
        st->src[i].t = t;
        if (t->events) {
            r->ev[i] = t->events;
            r->nev[i] = t->n;
            want += t->n ? 1 : 0;
        } else if (t->buf && t->segs && t->n) {
            r->nev[i] = t->n;
            want += t->n_segs;
        }
        events += r->nev[i];
    }
    if (vec_map(&r->lives, events) == 0) /* else the vectors grow by realloc */
        vec_map(&r->hows, events);
    return want;
}

/* the streams of an array of events (sorted by time when it is not); -1: out of memory */
static int open_array(struct state *st, struct merge *mg, uint32_t i, uint64_t *t0, uint64_t *t1)
{
    ct_replay *r = st->r;
    const struct ct_event *ev = r->ev[i];
    uint64_t n = r->nev[i];
    if (!sorted_by_ts(ev, n)) {
        st->s->c.unsorted_traces++;
        r->order[i] = sort_order(ev, n);
        if (!r->order[i])
            return -1;
    }
    const uint32_t *o = r->order[i];
    uint64_t first = ev[o ? o[0] : 0].ts_ns, last = ev[o ? o[n - 1] : n - 1].ts_ns;
    *t0 = first < *t0 ? first : *t0;
    *t1 = last > *t1 ? last : *t1;
    mg->streams[mg->nstreams++] = (struct stream){.trace = i};
    return 0;
}

/* the streams of a trace read from its blocks, one per thread; -1: out of memory */
static int open_blocks(struct state *st, struct merge *mg, uint32_t i, uint64_t *t0, uint64_t *t1)
{
    const struct ct_replay_trace *t = st->src[i].t;
    uint32_t nf = 0, *f = first_blocks(t, &nf);
    if (!f)
        return -1;
    for (uint32_t k = 0; k < nf; k++) {
        struct stream *m = &mg->streams[mg->nstreams++];
        m->trace = i;
        enter(m, t, f[k]);
    }
    free(f);
    *t0 = t->min_ts < *t0 ? t->min_ts : *t0;
    *t1 = t->max_ts > *t1 ? t->max_ts : *t1;
    return 0;
}

/* every trace's streams, and the run's first and last times; -1: out of memory */
static int open_streams(struct state *st, struct merge *mg, uint32_t ntraces)
{
    ct_replay *r = st->r;
    uint64_t t0 = NONE64, t1 = 0, total = 0;
    for (uint32_t i = 0; i < ntraces; i++) {
        if (!r->nev[i])
            continue;
        if ((r->ev[i] ? open_array(st, mg, i, &t0, &t1) : open_blocks(st, mg, i, &t0, &t1)) != 0)
            return -1;
        total += r->nev[i];
    }
    if (!total)
        t0 = 0;
    st->s->t0 = r->t0 = t0;
    st->s->t_end = t1;
    r->span = t1 - t0;
    return 0;
}

/* every stream's first events decoded, its cursor in the heap */
static void heap_fill(struct state *st, struct merge *mg)
{
    for (uint32_t k = 0; k < mg->nstreams; k++) {
        struct stream *m = &mg->streams[k];
        if (!refill(st, m, &mg->read))
            continue;
        st->src[m->trace].active++;
        mg->heap[mg->nh++] = (struct cursor){m->ev[0].ts_ns, m->idx[0], m->trace, 0, k, 0};
    }
    for (uint32_t i = mg->nh; i-- > 0;)
        sift_down(mg->heap, mg->nh, i);
}

/* the free two events ahead will write its life, far back in memory: its slot was asked for
 * when it was decoded, so ask for the life now */
static inline void prefetch_life(const struct state *st, const struct stream *m, uint32_t ti)
{
    if (m->head + 2 >= m->n || !st->tab.cap)
        return;
    const struct ct_event *f = &m->ev[m->head + 2];
    if (f->op == CT_OP_FREE) {
        const struct slot *x = tget(&st->tab, TAG(ti, 0, f->space), f->addr);
        if (x && TAG_STATE(x->tag) == ST_DEV)
            __builtin_prefetch(life_at(st->r, x->ref), 1);
    }
}

/* after the head cursor's event: its stream's next, else its process's end, else it goes */
static inline void advance(struct state *st, struct merge *mg, struct cursor *c, struct stream *m)
{
    struct source *so = &st->src[c->trace];
    if (m->idx[m->head] < so->next_idx && !so->unsorted && !so->t->events) {
        so->unsorted = 1; /* as an array's sort would count it */
        st->s->c.unsorted_traces++;
    }
    so->next_idx = m->idx[m->head] + 1;
    /* the common case (one stream, or the same one again) stays cheap */
    if (++m->head < m->n || refill(st, m, &mg->read)) {
        c->ts = m->ev[m->head].ts_ns;
        c->idx = m->idx[m->head];
    } else if (--so->active == 0 && so->t->end_ts) {
        c->exit = 1; /* the trace is done: its process's end comes next */
        c->ts = so->t->end_ts > so->last_ts ? so->t->end_ts : so->last_ts;
    } else {
        mg->heap[0] = mg->heap[--mg->nh];
    }
}

/* the pass: the events of every stream in the merged order, each by its rule; a process's
 * end when its trace is done. The number of events replayed */
static uint64_t merge_all(struct state *st, struct merge *mg, uint32_t ntraces,
                          const struct ct_replay_config *cfg)
{
    uint64_t seq = 0;
    while (mg->nh) {
        struct cursor *c = &mg->heap[0];
        uint32_t ti = c->trace;
        if (c->exit) {
            process_end(st, ti, seq, c->ts);
            if (st->r->oom)
                break;
            mg->heap[0] = mg->heap[--mg->nh];
        } else {
            struct stream *m = &mg->streams[c->stream];
            prefetch_life(st, m, ti);
            step(st, ti, (uint32_t)m->idx[m->head], &m->ev[m->head], seq, cfg);
            if (st->r->oom)
                break;
            seq++;
            st->src[ti].last_ts = m->ev[m->head].ts_ns;
            advance(st, mg, c, m);
        }
        if (mg->nh > 1)
            sift_down(mg->heap, mg->nh, 0);
        if (mg->read >= DROP_BYTES) {
            drop_pages(st, ntraces);
            mg->read = 0;
        }
    }
    drop_pages(st, ntraces);
    return seq;
}

/* the summary's totals; the events are let go (the queries read the lives) */
static void finish(struct state *st, uint64_t seq, uint32_t ntraces)
{
    ct_replay *r = st->r;
    struct ct_replay_summary *out = st->s;
    out->c.events = seq;
    out->end_bytes = st->cur + st->exited;
    out->host_end = st->host_cur + st->host_exited;
    out->lives = r->lives.n;
    for (int i = 0; i < CT_REPLAY_DEV_SLOTS; i++)
        r->dev[i].end_bytes = r->dev_cur[i] + st->dev_exited[i];
    for (uint32_t i = 0; i < ntraces; i++) {
        if (!st->src[i].t->end_ts || !r->nev[i])
            r->proc[i].end_bytes = st->proc_cur[i];
        free(r->order[i]);
        r->order[i] = NULL;
        r->ev[i] = NULL;
    }
}

ct_replay *ct_replay_run(const struct ct_replay_trace *traces, uint32_t ntraces,
                         const struct ct_replay_config *cfg, struct ct_replay_summary *out)
{
    if (!out || !cfg || (ntraces && !traces) || ntraces >= MAX_TRACES)
        return NULL;
    memset(out, 0, sizeof *out);
    out->ntraces = ntraces;
    ct_replay *r = replay_new(ntraces);
    if (!r)
        return NULL;
    struct state st;
    struct merge mg = {NULL, NULL, 0, 0, 0};
    int ok = state_open(&st, r, ntraces, out) == 0;
    if (ok) {
        uint64_t want = count_streams(&st, traces, ntraces);
        mg.streams = calloc(want ? want : 1, sizeof *mg.streams);
        mg.heap = calloc(want ? want : 1, sizeof *mg.heap);
        ok = mg.streams && mg.heap && open_streams(&st, &mg, ntraces) == 0;
    }
    r->buckets = cfg->buckets;
    if (ok && r->buckets)
        ok = (r->tl_all = calloc(r->buckets, sizeof *r->tl_all)) != NULL;
    if (ok) {
        heap_fill(&st, &mg);
        uint64_t seq = merge_all(&st, &mg, ntraces, cfg);
        ok = !r->oom;
        if (ok)
            finish(&st, seq, ntraces);
    }
    state_close(&st);
    free(mg.streams);
    free(mg.heap);
    if (!ok) {
        ct_replay_free(r);
        return NULL;
    }
    return r;
}
