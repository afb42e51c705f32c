/* scan.c - the trace scanner (scan.h), called from Python through cffi (libcudatrace_tools.so).
 *
 * ct_scan: one pass over a trace file's records (trace_format.h). Events are copied into an array
 * so Python can replay millions of them without a per-record interpreter loop; every other
 * record's offset is returned for Python to decode. Unpublished holes (a writer killed between
 * reserving and publishing) are skipped by searching for the next valid header.
 */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "cevent.h"
#include "scan.h"

/* record types this reader knows */
static int known_type(uint16_t t)
{
    return (t >= CT_REC_PAD && t <= CT_REC_PYFRAME) || t == CT_REC_CEVENT || t == CT_REC_SNAPSLOT ||
           t == CT_REC_CEBLOCK;
}

/* the compact events' per-thread contexts, grown as thread numbers appear */
struct contexts {
    struct ct_ce_ctx *c;
    uint64_t n;
};

/* the context of thread number th; NULL: out of range or out of memory */
static struct ct_ce_ctx *context(struct contexts *cx, uint64_t th)
{
    if (th >= (1u << 24))
        return NULL;
    if (th >= cx->n) {
        uint64_t n = cx->n ? cx->n : 16;
        while (n <= th)
            n *= 2;
        struct ct_ce_ctx *c = realloc(cx->c, n * sizeof *c);
        if (!c)
            return 0;
        memset(c + cx->n, 0, (n - cx->n) * sizeof *c);
        cx->c = c;
        cx->n = n;
    }
    return &cx->c[th];
}

/* decode one CEVENT body; 0: malformed (or out of memory) */
static int decode_cevent(struct contexts *cx, const uint8_t *body, uint32_t len,
                         struct ct_event *out)
{
    uint64_t th;
    struct ct_ce_ctx *c = ct_ce_thread(body, len, &th) ? context(cx, th) : NULL;
    return c && ct_ce_decode(c, body, len, out);
}

/* decode the events of one CEBLOCK (body of len bytes) into events[res->n_events...] */
static void decode_block(struct contexts *cx, const uint8_t *body, uint32_t len,
                         struct ct_event *events, uint64_t max_events, struct ct_scan_result *res)
{
    struct ct_rec_ceblock bh;
    if (len < sizeof bh) {
        res->bad_events++;
        return;
    }
    memcpy(&bh, body, sizeof bh);
    /* a block being filled while we read: what was published when `used` was read */
    uint32_t used = __atomic_load_n((const uint32_t *)(const void *)body, __ATOMIC_ACQUIRE);
    const uint8_t *p = body + sizeof bh,
                  *end = p + (used < len - sizeof bh ? used : len - sizeof bh);
    struct ct_ce_ctx *c = context(cx, bh.thread);
    if (!c) {
        res->bad_events++;
        return;
    }
    if (p < end && !c->lost) {
        /* the START bit of the first event clears the context: look at it before the seq */
        const uint8_t *q = p + 1;
        uint64_t mask = 0;
        int start = ct_ce_get(&q, end, &mask) && (mask & CT_CE_START);
        if (!start && (uint8_t)bh.seq != c->seq)
            c->lost = 1; /* an earlier block of the thread is missing */
    }
    while (p < end) {
        struct ct_event e;
        if (!ct_ce_decode_fields(c, &p, end, &e)) {
            res->bad_events++;
            return; /* the rest of the block cannot be placed */
        }
        if (events && res->n_events < max_events)
            events[res->n_events] = e;
        res->n_events++;
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

int ct_scan(const uint8_t *buf, uint64_t len, struct ct_event *events, uint64_t max_events,
            uint64_t *others, uint64_t max_others, struct ct_scan_result *res)
{
    if (!buf || !res)
        return -1;
    memset(res, 0, sizeof *res);
    const struct ct_file_header *fh = (const struct ct_file_header *)buf;
    if (len < CT_HEADER_SIZE || memcmp(fh->magic, "CUDATRC", 8) != 0 ||
        fh->version < CT_FORMAT_VERSION_MIN || fh->version > CT_FORMAT_VERSION ||
        fh->header_size != CT_HEADER_SIZE) {
        res->status = CT_SCAN_BAD_HEADER;
        return 0;
    }
    uint64_t off = CT_HEADER_SIZE;
    struct contexts cx = {NULL, 0};
    res->status = CT_SCAN_TRUNCATED;
    while (off + sizeof(struct ct_rec_hdr) <= len) {
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
            if (events && res->n_events < max_events)
                memcpy(&events[res->n_events], buf + off + sizeof h, sizeof(struct ct_event));
            res->n_events++;
        } else if (h.type == CT_REC_CEVENT) {
            struct ct_event e;
            if (decode_cevent(&cx, buf + off + sizeof h, h.size - (uint32_t)sizeof h, &e)) {
                if (events && res->n_events < max_events)
                    events[res->n_events] = e;
                res->n_events++;
            } else {
                res->bad_events++;
            }
        } else if (h.type == CT_REC_CEBLOCK) {
            decode_block(&cx, buf + off + sizeof h, h.size - (uint32_t)sizeof h, events, max_events,
                         res);
        } else if (h.type != CT_REC_PAD) {
            if (others && res->n_other < max_others)
                others[res->n_other] = off;
            res->n_other++;
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
    for (uint64_t i = cx.n; i > 0; i--) {
        if (cx.c[i - 1].started || cx.c[i - 1].lost) {
            res->threads = i;
            break;
        }
    }
    free(cx.c);
    return 0;
}
