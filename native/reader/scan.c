/* scan.c - the trace scanner (scan.h), called from Python through cffi (libcudatrace_tools.so).
 *
 * One pass over a trace file's records (trace_format.h). ct_scan copies events into an array;
 * ct_scan_index keeps none: it notes every block of compact events (CEBLOCK) with the events
 * it decoded from it, so the replay (replay.c) can decode each thread's events again, the same
 * way, while it replays, and millions of events are never held. Both return every other
 * record's offset for Python to decode. Unpublished holes (a writer killed between reserving
 * and publishing) are skipped by searching for the next valid header.
 */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include "blocks.h"
#include "cevent.h"
#include "scan.h"

#define NO_SEG UINT32_MAX

/* record types this reader knows */
static int known_type(uint16_t t)
{
    return (t >= CT_REC_PAD && t <= CT_REC_PYFRAME) || t == CT_REC_CEVENT || t == CT_REC_SNAPSLOT ||
           t == CT_REC_CEBLOCK || t == CT_REC_RAWBLOCK;
}

/* per thread number: its context, and (ct_scan_index) its last block and last time */
struct thread {
    struct ct_blk_ctx c;
    uint64_t last_ts;
    uint32_t last_seg;
    uint32_t pad;
};

/* what one scan fills: fixed arrays (ct_scan) or growing ones (ct_scan_index) */
struct scan {
    struct thread *th;
    uint64_t nth;
    struct ct_event *events;
    uint64_t max_events;
    uint64_t *others;
    uint64_t max_others, cap_others;
    struct ct_seg *segs;
    uint64_t n_segs, cap_segs;
    int index; /* ct_scan_index: grow others, note blocks */
    uint64_t min_ts, max_ts;
    /* ct_scan_alloc_devices: the devices of successful allocations of these kinds */
    uint64_t dev_kinds;
    int32_t *devs;
    uint64_t n_devs, max_devs;
    int in_order;
    int oom;
    struct ct_scan_result *res;
};

/* the state of thread number th; NULL: out of range or out of memory */
static struct thread *thread_of(struct scan *s, uint64_t th)
{
    if (th >= (1u << 24))
        return NULL;
    if (th >= s->nth) {
        uint64_t n = s->nth ? s->nth : 16;
        while (n <= th)
            n *= 2;
        struct thread *c = realloc(s->th, n * sizeof *c);
        if (!c) {
            s->oom = 1;
            return NULL;
        }
        memset(c + s->nth, 0, (n - s->nth) * sizeof *c);
        for (uint64_t i = s->nth; i < n; i++)
            c[i].last_seg = NO_SEG;
        s->th = c;
        s->nth = n;
    }
    return &s->th[th];
}

static void event(struct scan *s, const struct ct_event *e)
{
    if (s->dev_kinds && e->op == CT_OP_ALLOC && e->result == 0 &&
        ((s->dev_kinds >> (e->kind < 64 ? e->kind : 63)) & 1)) {
        uint64_t i = 0;
        while (i < s->n_devs && s->devs[i] != e->device)
            i++;
        if (i == s->n_devs) {
            if (s->n_devs == s->max_devs) {
                uint64_t nc = s->max_devs ? s->max_devs * 2 : 16;
                int32_t *d = realloc(s->devs, nc * sizeof *d);
                if (!d) {
                    s->oom = 1;
                    return;
                }
                s->devs = d;
                s->max_devs = nc;
            }
            s->devs[s->n_devs++] = e->device;
        }
    }
    if (s->events && s->res->n_events < s->max_events)
        s->events[s->res->n_events] = *e;
    s->res->n_events++;
}

/* decode one CEVENT body; 0: malformed (or out of memory) */
static int decode_cevent(struct scan *s, const uint8_t *body, uint32_t len, struct ct_event *out)
{
    uint64_t n;
    struct thread *t = ct_ce_thread(body, len, &n) ? thread_of(s, n) : NULL;
    return t && ct_ce_decode(&t->c.ce, body, len, out);
}

static struct ct_seg *new_seg(struct scan *s)
{
    if (s->n_segs == s->cap_segs) {
        uint64_t nc = s->cap_segs ? s->cap_segs * 2 : 256;
        struct ct_seg *p = realloc(s->segs, nc * sizeof *p);
        if (!p) {
            s->oom = 1;
            return NULL;
        }
        s->segs = p;
        s->cap_segs = nc;
    }
    return &s->segs[s->n_segs++];
}

/* decode the events of one CEBLOCK or RAWBLOCK (raw; body at off, len bytes) */
static void decode_block(struct scan *s, const uint8_t *buf, uint64_t off, uint32_t len, int raw)
{
    struct ct_scan_result *res = s->res;
    struct ct_rec_ceblock bh; /* a RAWBLOCK's header has the same words: flags for cached */
    _Static_assert(sizeof(struct ct_rec_ceblock) == sizeof(struct ct_rec_rawblock),
                   "both block headers are read alike");
    const uint8_t *body = buf + off;
    if (len < sizeof bh) {
        res->bad_events++;
        return;
    }
    memcpy(&bh, body, sizeof bh);
    /* a block being filled while we read: what was published when `used` was read */
    uint32_t used = __atomic_load_n((const uint32_t *)(const void *)body, __ATOMIC_ACQUIRE);
    if (used > len - sizeof bh)
        used = len - (uint32_t)sizeof bh;
    const uint8_t *p = body + sizeof bh, *end = p + used;
    uint32_t flags = raw ? bh.cached : 0; /* a RAWBLOCK's fourth word is its flags */
    struct thread *t = thread_of(s, bh.thread);
    if (!t) {
        res->bad_events++;
        return;
    }
    struct ct_seg *g = NULL;
    if (s->index) {
        g = new_seg(s);
        if (!g)
            return;
        *g = (struct ct_seg){off + sizeof bh, res->n_events, used, bh.thread, bh.seq, 0, NO_SEG, 0,
                             (uint32_t)raw,   flags};
        uint32_t gi = (uint32_t)(g - s->segs);
        if (t->last_seg != NO_SEG)
            s->segs[t->last_seg].next = gi;
        t->last_seg = gi;
    }
    ct_blk_begin(&t->c, raw, bh.seq, flags, p, end);
    if (!raw) /* a sealed RAWBLOCK's count of cached stacks (version 4; 0 before) */
        res->stack_cached += bh.cached;
    while (p < end) {
        /* the index needs each event's time only: the rest is skipped, not decoded */
        struct ct_event e;
        int cached = 0;
        int ok = g ? ct_blk_skip(&t->c, raw, &p, end, &e.ts_ns, &cached)
                   : ct_blk_decode(&t->c, raw, &p, end, &e);
        if (ok && raw)
            res->stack_cached += g ? (uint64_t)cached : (e.reserved & CT_EV_STACK_CACHED) != 0;
        if (!ok) {
            res->bad_events++;
            if (g)
                g->bad = 1;
            return; /* the rest of the block cannot be placed */
        }
        if (e.ts_ns < s->min_ts || !res->n_events)
            s->min_ts = e.ts_ns;
        if (e.ts_ns > s->max_ts)
            s->max_ts = e.ts_ns;
        if (g) {
            g->count++;
            if (e.ts_ns < t->last_ts)
                s->in_order = 0;
            t->last_ts = e.ts_ns;
            res->n_events++;
        } else {
            event(s, &e);
        }
    }
}

static int valid_header(const uint8_t *buf, uint64_t len, uint64_t off, struct ct_rec_hdr *h)
{
    if (off + sizeof *h > len)
        return 0;
    memcpy(h, buf + off, sizeof *h);
    return h->magic == CT_REC_MAGIC && known_type(h->type) && h->size >= sizeof *h &&
           (h->size & 7u) == 0 && h->size <= CT_CHUNK_SIZE && off + h->size <= len;
}

static void other(struct scan *s, uint64_t off)
{
    struct ct_scan_result *res = s->res;
    if (s->index && res->n_other == s->cap_others) {
        uint64_t nc = s->cap_others ? s->cap_others * 2 : 256;
        uint64_t *p = realloc(s->others, nc * sizeof *p);
        if (!p) {
            s->oom = 1;
            return;
        }
        s->others = p;
        s->cap_others = s->max_others = nc;
    }
    if (s->others && res->n_other < s->max_others)
        s->others[res->n_other] = off;
    res->n_other++;
}

/* the pass both entry points make; 0: the header is a trace's */
static void scan(struct scan *s, const uint8_t *buf, uint64_t len)
{
    struct ct_scan_result *res = s->res;
    const struct ct_file_header *fh = (const struct ct_file_header *)buf;
    if (len < CT_HEADER_SIZE || memcmp(fh->magic, "CUDATRC", 8) != 0 ||
        fh->version < CT_FORMAT_VERSION_MIN || fh->version > CT_FORMAT_VERSION ||
        fh->header_size != CT_HEADER_SIZE) {
        res->status = CT_SCAN_BAD_HEADER;
        return;
    }
    uint64_t off = CT_HEADER_SIZE;
    res->status = CT_SCAN_TRUNCATED;
    while (off + sizeof(struct ct_rec_hdr) <= len && !s->oom) {
        struct ct_rec_hdr h;
        if (!valid_header(buf, len, off, &h)) {
            /* zeros or garbage: a hole if a valid record follows, else the end of the data */
            uint64_t next = off + 8;
            while (next + sizeof(struct ct_rec_hdr) <= len) {
                struct ct_rec_hdr h2;
                if (valid_header(buf, len, next, &h2))
                    break;
                next += 8;
            }
            if (next + sizeof(struct ct_rec_hdr) > len)
                break;
            res->gaps++;
            res->gap_bytes += next - off;
            off = next;
            continue;
        }
        if (h.type == CT_REC_EVENT && h.size >= sizeof h + sizeof(struct ct_event)) {
            struct ct_event e;
            memcpy(&e, buf + off + sizeof h, sizeof e);
            event(s, &e);
            s->in_order = 0; /* not in a block: the replay needs them in an array */
        } else if (h.type == CT_REC_CEVENT) {
            struct ct_event e;
            if (decode_cevent(s, buf + off + sizeof h, h.size - (uint32_t)sizeof h, &e))
                event(s, &e);
            else
                res->bad_events++;
            s->in_order = 0;
        } else if (h.type == CT_REC_CEBLOCK || h.type == CT_REC_RAWBLOCK) {
            decode_block(s, buf, off + sizeof h, h.size - (uint32_t)sizeof h,
                         h.type == CT_REC_RAWBLOCK);
        } else if (h.type != CT_REC_PAD) {
            other(s, off);
            if (h.type == CT_REC_END) {
                res->end_offset = off;
                res->status = CT_SCAN_CLEAN;
                off += h.size;
                break;
            }
        }
        off += h.size;
    }
    res->stop_offset = off;
    for (uint64_t i = s->nth; i > 0; i--) {
        const struct ct_blk_ctx *c = &s->th[i - 1].c;
        if (c->ce.started || c->ce.lost || c->raw.started || c->raw.lost) {
            res->threads = i;
            break;
        }
    }
}

int ct_scan(const uint8_t *buf, uint64_t len, struct ct_event *events, uint64_t max_events,
            uint64_t *others, uint64_t max_others, struct ct_scan_result *res)
{
    if (!buf || !res)
        return -1;
    memset(res, 0, sizeof *res);
    struct scan s = {0};
    s.events = events;
    s.max_events = max_events;
    s.others = others;
    s.max_others = max_others;
    s.res = res;
    scan(&s, buf, len);
    free(s.th);
    return 0;
}

struct ct_scan_index *ct_scan_index(const uint8_t *buf, uint64_t len)
{
    if (!buf)
        return NULL;
    struct ct_scan_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return NULL;
    struct scan s = {0};
    s.index = 1;
    s.in_order = 1;
    s.res = &ix->res;
    scan(&s, buf, len);
    free(s.th);
    ix->others = s.others;
    ix->segs = s.segs;
    ix->n_segs = s.n_segs;
    ix->streamable = (uint32_t)s.in_order;
    ix->min_ts = s.min_ts;
    ix->max_ts = s.max_ts;
    if (s.oom) {
        ct_scan_index_free(ix);
        return NULL;
    }
    return ix;
}

void ct_scan_index_free(struct ct_scan_index *ix)
{
    if (!ix)
        return;
    free(ix->others);
    free(ix->segs);
    free(ix);
}

void *ct_map_file(int fd, uint64_t len)
{
    if (fd < 0 || !len)
        return NULL;
    void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* A trace's bytes as one read-only range that never touches a hole of the file: address
 * space reserved as anonymous zeros (reading them costs no memory), with each part mapped over
 * it from its file at its own offset. Reading a hole of a tmpfs file through a mapping would
 * allocate its page (or raise SIGBUS on a full tmpfs); the parts name only the data. */
void *ct_map_parts(uint64_t len, const struct ct_map_part *parts, uint64_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t page = pg > 0 ? (uint64_t)pg : 4096, total = (len + page - 1) / page * page;
    if (!len || (!parts && n))
        return NULL;
    uint8_t *base =
        mmap(NULL, total, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    for (uint64_t i = 0; i < n; i++) {
        const struct ct_map_part *q = &parts[i];
        if (q->off % page || q->off >= total || !q->len || q->fd < 0)
            goto fail;
        uint64_t l = (q->len + page - 1) / page * page;
        if (l > total - q->off)
            l = total - q->off;
        if (mmap(base + q->off, l, PROT_READ, MAP_PRIVATE | MAP_FIXED, q->fd, (off_t)q->off) ==
            MAP_FAILED)
            goto fail;
    }
    return base;
fail:
    munmap(base, total);
    return NULL;
}

int ct_file_locked(int fd)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

uint64_t ct_scan_used(const uint8_t *buf, uint64_t len, uint64_t from)
{
    uint64_t off = from, used = from;
    struct ct_rec_hdr h;
    if (!buf)
        return 0;
    while (off + sizeof h <= len) {
        if (valid_header(buf, len, off, &h)) {
            off += h.size;
            used = off;
        } else {
            off += 8;
        }
    }
    return used;
}

void ct_unmap(void *p, uint64_t len)
{
    if (p && len)
        munmap(p, len);
}

void ct_drop_pages(void *p, uint64_t len)
{
#ifdef MADV_DONTNEED
    if (p && len && ((uintptr_t)p & 4095) == 0)
        madvise(p, len, MADV_DONTNEED);
#else
    (void)p;
    (void)len;
#endif
}

uint64_t ct_scan_alloc_devices(const uint8_t *buf, uint64_t len, uint64_t device_kinds,
                               int32_t *out, uint64_t max)
{
    if (!buf || !device_kinds)
        return 0;
    struct ct_scan_result res;
    memset(&res, 0, sizeof res);
    struct scan s = {0};
    s.res = &res;
    s.dev_kinds = device_kinds;
    scan(&s, buf, len);
    free(s.th);
    uint64_t n = s.oom ? 0 : s.n_devs;
    if (out)
        memcpy(out, s.devs, (n < max ? n : max) * sizeof *out);
    free(s.devs);
    return n;
}
