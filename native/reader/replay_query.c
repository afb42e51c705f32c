/* replay_query.c - the questions asked of a finished replay (native/include/replay.h): what
 * was live at a moment, by site, over time windows; the lists, devices, processes and
 * timelines. Each is a pass over the lives the replay wrote (replay_model.h), never a second
 * replay of the events. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "replay_model.h"

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
void ct_replay_radix_u64(uint64_t *a, uint64_t *tmp, uint64_t n)
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

/* the groups of the live allocations: their accumulators, found through a small hash of their
 * keys, and each life's group (UINT32_MAX: not live), so that its sizes need no second hash */
struct grouping {
    struct gacc *g;
    uint64_t ng, gcap;
    uint64_t *h; /* index into g + 0, NONE64 empty */
    uint64_t hcap;
    uint32_t *gi; /* per life */
    uint64_t nsel;
};

static inline uint64_t gkey_hash(uint64_t k1, uint64_t k2)
{
    return mix((uint32_t)(k2 >> 32) ^ (uint32_t)k2, k1);
}

/* the hash's slot of (k1, k2): theirs, or the empty one where it would go */
static uint64_t gslot(const struct grouping *gr, uint64_t k1, uint64_t k2)
{
    uint64_t j = gkey_hash(k1, k2) & (gr->hcap - 1);
    while (gr->h[j] != NONE64 && !(gr->g[gr->h[j]].k1 == k1 && gr->g[gr->h[j]].k2 == k2))
        j = (j + 1) & (gr->hcap - 1);
    return j;
}

/* the hash twice as large; -1: out of memory */
static int grehash(struct grouping *gr)
{
    uint64_t nc = gr->hcap * 2, *nh = malloc(nc * sizeof *nh);
    if (!nh)
        return -1;
    memset(nh, 0xff, nc * sizeof *nh);
    for (uint64_t k = 0; k < gr->ng; k++) {
        uint64_t q = gkey_hash(gr->g[k].k1, gr->g[k].k2) & (nc - 1);
        while (nh[q] != NONE64)
            q = (q + 1) & (nc - 1);
        nh[q] = k;
    }
    free(gr->h);
    gr->h = nh;
    gr->hcap = nc;
    return 0;
}

/* the group of life L, new when it has none; UINT64_MAX: out of memory */
static uint64_t group_of(struct grouping *gr, const ct_replay *r, const struct life *L)
{
    const struct rest *x = rest_at(r, L->rest);
    const struct ct_event *e = &x->ev;
    uint64_t k1 = (uint64_t)x->trace << 32 | e->stack;
    uint64_t k2 = (uint64_t)e->api << 48 | (uint64_t)e->rt_api << 32 | (uint32_t)e->device;
    uint64_t j = gslot(gr, k1, k2);
    if (gr->h[j] != NONE64)
        return gr->h[j];
    if (gr->ng == gr->gcap) {
        struct gacc *g = realloc(gr->g, gr->gcap * 2 * sizeof *g);
        if (!g)
            return UINT64_MAX;
        gr->g = g;
        gr->gcap *= 2;
    }
    gr->g[gr->ng] = (struct gacc){k1, k2, 0, 0, L->ts, L->ts, 0, 0};
    gr->h[j] = gr->ng++;
    if (gr->ng * 2 > gr->hcap && grehash(gr) != 0)
        return UINT64_MAX;
    return gr->ng - 1;
}

/* pass 1: the live allocations (by, value, device) into their groups; -1: out of memory */
static int collect_groups(struct grouping *gr, const ct_replay *r, uint32_t by, uint64_t value,
                          int32_t device)
{
    const struct life *lv = r->lives.p;
    for (uint64_t i = 0; i < r->lives.n; i++) {
        const struct life *L = &lv[i];
        gr->gi[i] = UINT32_MAX;
        if (!live_at(r, L, by, value) || !on_device(r, L, device))
            continue;
        uint64_t k = group_of(gr, r, L);
        if (k == UINT64_MAX)
            return -1;
        struct gacc *a = &gr->g[k];
        a->count++;
        a->bytes += L->size;
        if (L->ts < a->first_ts)
            a->first_ts = L->ts;
        if (L->ts > a->last_ts)
            a->last_ts = L->ts;
        gr->gi[i] = (uint32_t)k;
        gr->nsel++;
    }
    return 0;
}

/* the groups in key order, each with the offset of its sizes; rank: old index -> new */
static void order_groups(struct grouping *gr, uint32_t *rank)
{
    struct gacc *g = gr->g;
    for (uint64_t k = 0; k < gr->ng; k++)
        g[k].fill = k; /* remember the unsorted index */
    qsort(g, gr->ng, sizeof *g, gacc_cmp);
    uint64_t off = 0;
    for (uint64_t k = 0; k < gr->ng; k++) {
        rank[g[k].fill] = (uint32_t)k;
        g[k].off = off;
        off += g[k].count;
        g[k].fill = g[k].off;
    }
}

/* pass 2: each group's sizes, contiguous in sizes, ascending; -1: out of memory */
static int group_sizes(struct grouping *gr, const ct_replay *r, const uint32_t *rank,
                       uint64_t *sizes)
{
    const struct life *lv = r->lives.p;
    for (uint64_t i = 0; i < r->lives.n; i++)
        if (gr->gi[i] != UINT32_MAX)
            sizes[gr->g[rank[gr->gi[i]]].fill++] = lv[i].size;
    uint64_t biggest = 0;
    for (uint64_t k = 0; k < gr->ng; k++)
        if (gr->g[k].count > biggest)
            biggest = gr->g[k].count;
    uint64_t *tmp = malloc((biggest ? biggest : 1) * sizeof *tmp);
    if (!tmp)
        return -1;
    for (uint64_t k = 0; k < gr->ng; k++)
        ct_replay_radix_u64(sizes + gr->g[k].off, tmp, gr->g[k].count);
    free(tmp);
    return 0;
}

static void group_out(const struct gacc *g, struct ct_group *o)
{
    o->trace = (uint32_t)(g->k1 >> 32);
    o->stack = (uint32_t)g->k1;
    o->api = (uint16_t)(g->k2 >> 48);
    o->rt_api = (uint16_t)(g->k2 >> 32);
    o->device = (int32_t)(uint32_t)g->k2;
    o->count = g->count;
    o->bytes = g->bytes;
    o->first_ts = g->first_ts;
    o->last_ts = g->last_ts;
    o->sizes = g->off;
}

uint64_t ct_replay_groups(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                          struct ct_group *out, uint64_t max, uint64_t *sizes, uint64_t max_sizes)
{
    if (!r)
        return 0;
    struct grouping gr = {NULL, 0, 256, NULL, 1024, NULL, 0};
    uint32_t *rank = NULL;
    uint64_t result = NONE64;
    gr.g = malloc(gr.gcap * sizeof *gr.g);
    gr.h = malloc(gr.hcap * sizeof *gr.h);
    gr.gi = malloc((r->lives.n ? r->lives.n : 1) * sizeof *gr.gi);
    if (!gr.g || !gr.h || !gr.gi)
        goto out;
    memset(gr.h, 0xff, gr.hcap * sizeof *gr.h);
    if (collect_groups(&gr, r, by, value, device) != 0)
        goto out;
    rank = malloc((gr.ng ? gr.ng : 1) * sizeof *rank);
    if (!rank)
        goto out;
    order_groups(&gr, rank);
    if (sizes && max_sizes >= gr.nsel && group_sizes(&gr, r, rank, sizes) != 0)
        goto out;
    for (uint64_t k = 0; out && k < gr.ng && k < max; k++)
        group_out(&gr.g[k], &out[k]);
    result = gr.ng;
out:
    free(rank);
    free(gr.g);
    free(gr.h);
    free(gr.gi);
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
