/* replay.c - the model's hot loop (cudatrace/model.py calls it through cffi; built into
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
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "layout.h"

/* CFFI-BEGIN */
#define CT_REPLAY_VERSION 1
#define CT_REPLAY_DEV_SLOTS 64
#define CT_REPLAY_BY_SEQ 0
#define CT_REPLAY_BY_TS 1
#define CT_REPLAY_ANY_DEVICE -1000
#define CT_REPLAY_LIST_FAILED 0
#define CT_REPLAY_LIST_DENIED 1
#define CT_REPLAY_LIST_MEMINFO 2
/* ct_live.how: what ended an allocation */
#define CT_END_LIVE 0
#define CT_END_FREE 1
#define CT_END_REUSED 2
#define CT_END_UNMAPPED 3

struct ct_replay_trace {
    const struct ct_event *events;
    uint64_t n;
};

struct ct_replay_config {
    uint64_t device_kinds;      /* bit k: CT_KIND k is device memory */
    uint64_t host_kinds;        /* bit k: CT_KIND k is pinned host memory */
    uint32_t buckets;           /* timeline resolution (0: no timeline) */
    uint32_t reserved;
};

struct ct_replay_counts {
    uint64_t events;
    uint64_t allocs;            /* device allocations that succeeded */
    uint64_t frees;             /* frees that ended a device allocation */
    uint64_t failed;            /* allocations that returned an error */
    uint64_t failed_frees;      /* frees that returned an error */
    uint64_t denied;            /* refused by the budget before reaching the driver */
    uint64_t host_allocs;
    uint64_t host_frees;
    uint64_t unmatched_frees;   /* frees of nothing the trace saw allocated */
    uint64_t null_frees;        /* frees of address 0: no-ops */
    uint64_t reused;            /* allocations at an address still live (old one ended) */
    uint64_t maps;
    uint64_t unmaps;
    uint64_t unmatched_unmaps;
    uint64_t deferred_releases; /* cuMemRelease of a mapped handle: ended at the last unmap */
    uint64_t imports;
    uint64_t unimports;
    uint64_t meminfo;
    uint64_t other;
    uint64_t unsorted_traces;
};

struct ct_replay_summary {
    struct ct_replay_counts c;
    uint64_t t0;                /* first event */
    uint64_t t_end;             /* last event */
    uint64_t peak_bytes;        /* highest total of live device bytes */
    uint64_t peak_ts;
    uint64_t peak_seq;          /* merged index of the event that reached it */
    uint64_t end_bytes;
    uint64_t host_peak;
    uint64_t host_peak_ts;
    uint64_t host_end;
    uint64_t lives;             /* device allocations replayed */
    uint32_t ntraces;
    uint32_t found;             /* 1: at least one device allocation */
};

struct ct_replay_device {
    int32_t device;             /* -1: unknown */
    uint32_t seen;
    uint64_t allocs;
    uint64_t peak_bytes;
    uint64_t peak_ts;
    uint64_t peak_seq;
    uint64_t end_bytes;
};

struct ct_replay_proc {
    uint64_t events;
    uint64_t allocs;
    uint64_t frees;
    uint64_t failed;
    uint64_t denied;
    uint64_t meminfo;
    uint64_t host_allocs;
    uint64_t peak_bytes;        /* this trace's own highest live total */
    uint64_t peak_ts;
    uint64_t end_bytes;
    uint64_t first_ts;
    uint64_t last_ts;
};

/* timeline: changes of the live total inside each of cfg.buckets equal time slices */
struct ct_replay_bucket {
    uint64_t changes;           /* 0: nothing happened in this slice */
    uint64_t min, min_ts;
    uint64_t max, max_ts;
    uint64_t last, last_ts;
};

/* one allocation (or listed event), as the queries return it */
struct ct_live {
    struct ct_event ev;
    uint32_t trace;
    uint32_t index;             /* in its trace's event array */
    uint64_t seq;               /* merged index of the event */
    uint64_t end_seq;           /* of the event that ended it; all ones: live at the end */
    uint64_t end_ts;            /* all ones: live at the end */
    uint32_t how;               /* CT_END_* */
    uint32_t reserved;
};

typedef struct ct_replay ct_replay;

/* Replay; NULL when out of memory. The event arrays must outlive the handle. */
ct_replay *ct_replay_run(const struct ct_replay_trace *traces, uint32_t ntraces,
                         const struct ct_replay_config *cfg, struct ct_replay_summary *out);
void ct_replay_free(ct_replay *r);
/* slot 0: device -1 (unknown), slot d+1: device d. 0 when the slot was never seen. */
int32_t ct_replay_device(const ct_replay *r, uint32_t slot, struct ct_replay_device *out);
int32_t ct_replay_proc(const ct_replay *r, uint32_t trace, struct ct_replay_proc *out);
/* the timeline of all devices (device CT_REPLAY_ANY_DEVICE) or one; returns buckets written */
uint32_t ct_replay_timeline(const ct_replay *r, int32_t device, struct ct_replay_bucket *out,
                            uint32_t max);
/* device allocations live after the event of merged index value (by CT_REPLAY_BY_SEQ) or at
 * time value (CT_REPLAY_BY_TS: every event at or before it replayed), on one device or any.
 * Returns how many there are; writes the first max of them, in allocation order. */
uint64_t ct_replay_select(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                          struct ct_live *out, uint64_t max);
/* the same, only the total bytes and count */
uint64_t ct_replay_live_bytes(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                              uint64_t *count);
/* every device allocation, freed or not (lifetimes) */
uint64_t ct_replay_all(const ct_replay *r, struct ct_live *out, uint64_t max);
/* failed allocations, denials, memory queries (CT_REPLAY_LIST_*) */
uint64_t ct_replay_list(const ct_replay *r, uint32_t which, struct ct_live *out, uint64_t max);
/* CFFI-END */

#define NONE64 UINT64_MAX
#define ST_EMPTY 0
#define ST_DEV 1
#define ST_HOST 2
#define ST_MAP 3
#define MAP_SPACE 255

struct slot {
    uint64_t addr;
    uint64_t val;               /* ST_DEV: life index; ST_HOST: size; ST_MAP: handle */
    uint32_t trace;
    uint32_t maps;              /* ST_DEV, space VMM: mappings of the handle still in place */
    uint8_t space;
    uint8_t state;
    uint8_t released;           /* ST_DEV, space VMM: cuMemRelease seen while mapped */
    uint8_t pad[5];
};

struct table {
    struct slot *s;
    uint64_t cap, used;
};

struct life {
    uint64_t seq, end_seq, end_ts;
    uint32_t trace, idx, how, pad;
};

struct ref {
    uint64_t seq;
    uint32_t trace, idx;
};

struct vec {
    void *p;
    uint64_t n, cap;
    size_t elem;
};

struct ct_replay {
    uint32_t ntraces;
    const struct ct_event **ev;      /* per trace */
    uint64_t *nev;
    uint32_t **order;                /* per trace: NULL (in time order) or a sorted permutation */
    struct vec lives, failed, denied, meminfo;
    struct ct_replay_device dev[CT_REPLAY_DEV_SLOTS];
    uint64_t dev_cur[CT_REPLAY_DEV_SLOTS];
    struct ct_replay_proc *proc;
    uint32_t buckets;
    uint64_t t0, span;
    struct ct_replay_bucket *tl_all;
    struct ct_replay_bucket *tl_dev[CT_REPLAY_DEV_SLOTS];
    int oom;
};

static int vec_push(struct vec *v, const void *x)
{
    if (v->n == v->cap) {
        uint64_t nc = v->cap ? v->cap * 2 : 1024;
        void *p = realloc(v->p, nc * v->elem);
        if (!p)
            return -1;
        v->p = p;
        v->cap = nc;
    }
    memcpy((char *)v->p + v->n * v->elem, x, v->elem);
    v->n++;
    return 0;
}

static inline uint64_t mix(uint32_t trace, uint8_t space, uint64_t addr)
{
    uint64_t h = addr ^ (((uint64_t)trace << 8 | space) * 0x9E3779B97F4A7C15ull);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* index of the key's slot, or of the empty slot where it would go */
static inline uint64_t tfind(const struct table *t, uint32_t trace, uint8_t space, uint64_t addr)
{
    uint64_t mask = t->cap - 1, i = mix(trace, space, addr) & mask;
    for (;;) {
        const struct slot *s = &t->s[i];
        if (s->state == ST_EMPTY || (s->addr == addr && s->trace == trace && s->space == space))
            return i;
        i = (i + 1) & mask;
    }
}

static int tgrow(struct table *t)
{
    uint64_t nc = t->cap ? t->cap * 2 : 4096;
    struct slot *old = t->s;
    uint64_t oc = t->cap;
    struct slot *s = calloc(nc, sizeof *s);
    if (!s)
        return -1;
    t->s = s;
    t->cap = nc;
    for (uint64_t i = 0; i < oc; i++)
        if (old[i].state != ST_EMPTY)
            s[tfind(t, old[i].trace, old[i].space, old[i].addr)] = old[i];
    free(old);
    return 0;
}

/* a slot for the key (found or new); NULL when out of memory */
static struct slot *tput(struct table *t, uint32_t trace, uint8_t space, uint64_t addr)
{
    if ((t->used + 1) * 2 > t->cap && tgrow(t) != 0)
        return NULL;
    struct slot *s = &t->s[tfind(t, trace, space, addr)];
    if (s->state == ST_EMPTY) {
        memset(s, 0, sizeof *s);
        s->addr = addr;
        s->trace = trace;
        s->space = space;
        t->used++;
    }
    return s;
}

static inline struct slot *tget(const struct table *t, uint32_t trace, uint8_t space, uint64_t addr)
{
    if (!t->cap)
        return NULL;
    struct slot *s = &t->s[tfind(t, trace, space, addr)];
    return s->state == ST_EMPTY ? NULL : s;
}

/* delete with backward shift (linear probing keeps no tombstones) */
static void tdel(struct table *t, struct slot *s)
{
    uint64_t mask = t->cap - 1, i = (uint64_t)(s - t->s), j = i;
    for (;;) {
        j = (j + 1) & mask;
        struct slot *sj = &t->s[j];
        if (sj->state == ST_EMPTY)
            break;
        uint64_t k = mix(sj->trace, sj->space, sj->addr) & mask;
        int move = (i <= j) ? (k <= i || k > j) : (k <= i && k > j);
        if (move) {
            t->s[i] = *sj;
            i = j;
        }
    }
    t->s[i].state = ST_EMPTY;
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

/* ---- merge: a binary heap of trace cursors keyed (ts, trace) ---- */
struct cursor {
    uint64_t ts;
    uint64_t pos;
    uint32_t trace;
};

static inline int before(const struct cursor *x, const struct cursor *y)
{
    return x->ts < y->ts || (x->ts == y->ts && x->trace < y->trace);
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

struct state {
    ct_replay *r;
    struct table tab;
    struct ct_replay_summary *s;
    uint64_t cur, host_cur;
    uint64_t *proc_cur;
};

static void changed(struct state *st, uint32_t slot, uint64_t ts)
{
    ct_replay *r = st->r;
    if (!r->buckets)
        return;
    uint64_t i = r->span ? (uint64_t)((double)(ts - r->t0) / (double)r->span * r->buckets) : 0;
    if (i >= r->buckets)
        i = r->buckets - 1;
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

/* end device allocation li (its slot is removed by the caller) */
static void end_life(struct state *st, uint64_t li, uint64_t seq, uint64_t ts, uint32_t how)
{
    ct_replay *r = st->r;
    struct life *L = &((struct life *)r->lives.p)[li];
    const struct ct_event *e = &r->ev[L->trace][L->idx];
    uint32_t ds = dev_slot(e->device);
    L->end_seq = seq;
    L->end_ts = ts;
    L->how = how;
    st->cur -= e->size;
    r->dev_cur[ds] -= e->size;
    st->proc_cur[L->trace] -= e->size;
    changed(st, ds, ts);
}

/* a mapping of handle hv went away: the last one of a released handle frees its memory */
static void unmapped(struct state *st, uint32_t ti, uint64_t hv, uint64_t seq, uint64_t ts)
{
    struct slot *h = tget(&st->tab, ti, CT_SPACE_VMM, hv);
    if (h && h->state == ST_DEV && h->maps && --h->maps == 0 && h->released) {
        end_life(st, h->val, seq, ts, CT_END_UNMAPPED);
        tdel(&st->tab, h);
    }
}

static void step(struct state *st, uint32_t ti, uint32_t idx, const struct ct_event *e, uint64_t seq,
                 const struct ct_replay_config *cfg)
{
    ct_replay *r = st->r;
    struct ct_replay_summary *s = st->s;
    struct ct_replay_proc *p = &r->proc[ti];
    uint64_t ts = e->ts_ns;
    struct ref ref = {seq, ti, idx};
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
        struct slot *sl = tget(&st->tab, ti, e->space, e->addr);
        if (sl) {                           /* reused while live: the old one is gone */
            s->c.reused++;
            if (sl->state == ST_DEV) {
                end_life(st, sl->val, seq, ts, CT_END_REUSED);
            } else if (sl->state == ST_HOST) {
                st->host_cur -= sl->val;
            }
            tdel(&st->tab, sl);
        }
        sl = tput(&st->tab, ti, e->space, e->addr);
        if (!sl) {
            r->oom = 1;
            return;
        }
        if (is_dev) {
            struct life L = {seq, NONE64, NONE64, ti, idx, CT_END_LIVE, 0};
            sl->state = ST_DEV;
            sl->val = r->lives.n;
            if (vec_push(&r->lives, &L)) {
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
            sl->state = ST_HOST;
            sl->val = e->size;
            s->c.host_allocs++;
            p->host_allocs++;
            st->host_cur += e->size;
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
        struct slot *sl = tget(&st->tab, ti, e->space, e->addr);
        if (!sl || sl->state == ST_MAP) {
            s->c.unmatched_frees++;
            return;
        }
        if (sl->state == ST_HOST) {
            st->host_cur -= sl->val;
            s->c.host_frees++;
            tdel(&st->tab, sl);
            return;
        }
        s->c.frees++;
        p->frees++;
        if (sl->space == CT_SPACE_VMM && sl->maps > 0) {
            sl->released = 1;           /* the driver frees it at the last unmap */
            s->c.deferred_releases++;
            return;
        }
        end_life(st, sl->val, seq, ts, CT_END_FREE);
        tdel(&st->tab, sl);
        return;
    }
    case CT_OP_MAP: {
        if (e->result != 0) {
            s->c.other++;
            return;
        }
        s->c.maps++;
        struct slot *m = tget(&st->tab, ti, MAP_SPACE, e->addr);
        if (m) {                        /* a mapping we missed the end of: drop it */
            uint64_t hv = m->val;
            tdel(&st->tab, m);
            unmapped(st, ti, hv, seq, ts);
        }
        m = tput(&st->tab, ti, MAP_SPACE, e->addr);
        if (!m) {
            r->oom = 1;
            return;
        }
        m->state = ST_MAP;
        m->val = e->aux;
        struct slot *h = tget(&st->tab, ti, CT_SPACE_VMM, e->aux);
        if (h && h->state == ST_DEV)
            h->maps++;
        return;
    }
    case CT_OP_UNMAP: {
        if (e->result != 0) {
            s->c.other++;
            return;
        }
        s->c.unmaps++;
        struct slot *m = tget(&st->tab, ti, MAP_SPACE, e->addr);
        if (m) {
            uint64_t hv = m->val;
            tdel(&st->tab, m);
            unmapped(st, ti, hv, seq, ts);
            return;
        }
        /* no mapping starts there: unmap every mapping of this trace inside the range (rare:
         * collect them first, since deleting moves slots) */
        uint64_t n = 0, cap = 0, *found = NULL;
        for (uint64_t i = 0; i < st->tab.cap; i++) {
            struct slot *x = &st->tab.s[i];
            if (x->state == ST_MAP && x->trace == ti && x->addr >= e->addr &&
                x->addr - e->addr < e->size) {
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
        for (uint64_t k = 0; k < n; k++) {
            struct slot *x = tget(&st->tab, ti, MAP_SPACE, found[k]);
            if (!x)
                continue;
            uint64_t hv = x->val;
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
        return;
    case CT_OP_UNIMPORT:
        s->c.unimports++;
        return;
    default:
        s->c.other++;
        return;
    }
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
    free(r->lives.p);
    free(r->failed.p);
    free(r->denied.p);
    free(r->meminfo.p);
    free(r->proc);
    free(r->tl_all);
    for (int i = 0; i < CT_REPLAY_DEV_SLOTS; i++)
        free(r->tl_dev[i]);
    free(r);
}

ct_replay *ct_replay_run(const struct ct_replay_trace *traces, uint32_t ntraces,
                         const struct ct_replay_config *cfg, struct ct_replay_summary *out)
{
    if (!out || !cfg || (ntraces && !traces))
        return NULL;
    memset(out, 0, sizeof *out);
    out->ntraces = ntraces;
    ct_replay *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->ntraces = ntraces;
    r->lives.elem = sizeof(struct life);
    r->failed.elem = r->denied.elem = r->meminfo.elem = sizeof(struct ref);
    uint32_t nt = ntraces ? ntraces : 1;
    r->ev = calloc(nt, sizeof *r->ev);
    r->nev = calloc(nt, sizeof *r->nev);
    r->order = calloc(nt, sizeof *r->order);
    r->proc = calloc(nt, sizeof *r->proc);
    uint64_t *proc_cur = calloc(nt, sizeof *proc_cur);
    struct cursor *heap = calloc(nt, sizeof *heap);
    if (!r->ev || !r->nev || !r->order || !r->proc || !proc_cur || !heap)
        goto fail;
    for (int i = 0; i < CT_REPLAY_DEV_SLOTS; i++)
        r->dev[i].device = i - 1;

    uint64_t t0 = NONE64, t1 = 0, total = 0;
    uint32_t nh = 0;
    for (uint32_t i = 0; i < ntraces; i++) {
        r->ev[i] = traces[i].events;
        r->nev[i] = traces[i].events ? traces[i].n : 0;
        uint64_t n = r->nev[i];
        if (!n)
            continue;
        if (!sorted_by_ts(r->ev[i], n)) {
            out->c.unsorted_traces++;
            r->order[i] = sort_order(r->ev[i], n);
            if (!r->order[i])
                goto fail;
        }
        const struct ct_event *e = r->ev[i];
        uint64_t first = r->order[i] ? e[r->order[i][0]].ts_ns : e[0].ts_ns;
        uint64_t last = r->order[i] ? e[r->order[i][n - 1]].ts_ns : e[n - 1].ts_ns;
        if (first < t0)
            t0 = first;
        if (last > t1)
            t1 = last;
        total += n;
        heap[nh++] = (struct cursor){first, 0, i};
    }
    for (uint32_t i = nh; i-- > 0;)
        sift_down(heap, nh, i);
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

    struct state st = {r, {NULL, 0, 0}, out, 0, 0, proc_cur};
    uint64_t seq = 0;
    while (nh) {
        struct cursor *c = &heap[0];
        uint32_t ti = c->trace;
        uint64_t pos = c->pos;
        uint32_t idx = r->order[ti] ? r->order[ti][pos] : (uint32_t)pos;
        const struct ct_event *e = &r->ev[ti][idx];
        step(&st, ti, idx, e, seq, cfg);
        if (r->oom)
            break;
        seq++;
        /* advance this cursor: the common case (one trace, or the same one again) stays cheap */
        if (++c->pos < r->nev[ti]) {
            uint32_t nidx = r->order[ti] ? r->order[ti][c->pos] : (uint32_t)c->pos;
            c->ts = r->ev[ti][nidx].ts_ns;
        } else {
            heap[0] = heap[--nh];
        }
        if (nh > 1)
            sift_down(heap, nh, 0);
    }
    free(st.tab.s);
    if (r->oom)
        goto fail;
    out->c.events = seq;
    out->end_bytes = st.cur;
    out->host_end = st.host_cur;
    out->lives = r->lives.n;
    for (int i = 0; i < CT_REPLAY_DEV_SLOTS; i++)
        r->dev[i].end_bytes = r->dev_cur[i];
    for (uint32_t i = 0; i < ntraces; i++)
        r->proc[i].end_bytes = proc_cur[i];
    free(proc_cur);
    free(heap);
    return r;
fail:
    free(proc_cur);
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
    const struct ct_replay_bucket *b = device == CT_REPLAY_ANY_DEVICE ? r->tl_all
                                                                      : r->tl_dev[dev_slot(device)];
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
    if (by == CT_REPLAY_BY_SEQ)
        return L->seq <= v && v < L->end_seq;
    return r->ev[L->trace][L->idx].ts_ns <= v && v < L->end_ts;
}

static void fill(const ct_replay *r, const struct life *L, struct ct_live *o)
{
    o->ev = r->ev[L->trace][L->idx];
    o->trace = L->trace;
    o->index = L->idx;
    o->seq = L->seq;
    o->end_seq = L->end_seq;
    o->end_ts = L->end_ts;
    o->how = L->how;
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
        if (!live_at(r, L, by, value))
            continue;
        if (device != CT_REPLAY_ANY_DEVICE && r->ev[L->trace][L->idx].device != device)
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
            const struct ct_event *e = &r->ev[L->trace][L->idx];
            if (!live_at(r, L, by, value) || (device != CT_REPLAY_ANY_DEVICE && e->device != device))
                continue;
            bytes += e->size;
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
    const struct ref *rf = v->p;
    for (uint64_t i = 0; out && i < v->n && i < max; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].ev = r->ev[rf[i].trace][rf[i].idx];
        out[i].trace = rf[i].trace;
        out[i].index = rf[i].idx;
        out[i].seq = rf[i].seq;
        out[i].end_seq = NONE64;
        out[i].end_ts = NONE64;
    }
    return v->n;
}
