/* transcode.c - a sealed chunk's raw events rewritten as compact ones (scan.h:
 * ct_chunk_compact), for the launcher's sealer (cudatrace/record/seal.py) before it compresses
 * the chunk: the encoding the shim no longer does on the calling thread (issue 42), done once,
 * off the target. The chunk keeps its records in their order; each RAWBLOCK becomes a CEBLOCK
 * of the same thread with the same events (cevent.h, the writer's encoding of version 3), and
 * the room they no longer take is at the chunk's end: one PAD record where the input's records
 * filled the chunk, zeros where they ended before it (a file's last chunk).
 *
 * A chunk reads on its own (every thread starts anew in its first block of a chunk:
 * rawevent.h), so it is transcoded alone. Anything this cannot carry over exactly (a hole a
 * killed writer left, a block that does not decode to its end, a thread that does not start in
 * the chunk, a record of another format, an output that would not fit where the chunk's records
 * end) leaves the chunk as it is: the sealer then stores it raw. The result is decoded again and
 * held to the input's events before it is returned. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "cevent.h"
#include "rawevent.h"
#include "scan.h"

#define SLOTS 16384 /* threads in one chunk: at most one a 256-byte block, 8192 */

/* the threads of a chunk: contexts, by thread number (open addressing) */
struct threads {
    uint32_t key[SLOTS]; /* thread number + 1, 0: empty */
    struct tctx {
        struct ct_blk_ctx in; /* decoding the input */
        struct ct_ce_ctx out; /* encoding the output, then decoding it back */
    } * ctx[SLOTS];
};

static struct tctx *tctx_of(struct threads *t, uint32_t th, int make)
{
    uint32_t i = (th * 2654435761u) % SLOTS;
    for (uint32_t n = 0; n < SLOTS; n++, i = (i + 1) % SLOTS) {
        if (t->key[i] == th + 1)
            return t->ctx[i];
        if (!t->key[i]) {
            if (!make)
                return NULL;
            t->ctx[i] = calloc(1, sizeof(struct tctx));
            if (!t->ctx[i])
                return NULL;
            t->key[i] = th + 1;
            return t->ctx[i];
        }
    }
    return NULL;
}

static void threads_free(struct threads *t)
{
    for (uint32_t i = 0; i < SLOTS; i++)
        free(t->ctx[i]);
    free(t);
}

/* FNV-1a 64 over bytes, continued from h */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* an event's fields (not its padding) into the sum */
static uint64_t fnv_event(uint64_t h, const struct ct_event *e)
{
    uint64_t w[] = {e->ts_ns,
                    e->size,
                    e->addr,
                    e->aux,
                    e->aux2,
                    (uint64_t)e->tid << 32 | (uint32_t)e->device,
                    (uint64_t)(uint32_t)e->result << 32 | e->stack,
                    ct_raw_meta(e->api, e->rt_api, e->op, e->kind, e->space, e->flags),
                    e->reserved};
    return fnv(h, w, sizeof w);
}

static int header_at(const uint8_t *buf, uint64_t len, uint64_t off, struct ct_rec_hdr *h)
{
    if (off + sizeof *h > len)
        return 0;
    memcpy(h, buf + off, sizeof *h);
    return h->magic == CT_REC_MAGIC && h->size >= sizeof *h && (h->size & 7u) == 0 &&
           h->size <= len - off;
}

static int zeros(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* One RAWBLOCK (body, n bytes) of the input as a CEBLOCK at out + *o (cap bytes in all);
 * *sum goes on over its events. 0: it cannot be carried over. */
static int block_out(struct threads *th, const uint8_t *body, uint32_t n, uint8_t *out,
                     uint64_t cap, uint64_t *o, uint64_t *sum)
{
    struct ct_rec_rawblock rb;
    if (n < sizeof rb)
        return 0;
    memcpy(&rb, body, sizeof rb);
    if (rb.used > n - sizeof rb)
        return 0;
    struct tctx *t = tctx_of(th, rb.thread, rb.flags & CT_RAWB_START);
    if (!t)
        return 0; /* a thread that did not start in this chunk */
    if (rb.flags & CT_RAWB_START)
        memset(&t->out, 0, sizeof t->out);
    const uint8_t *p = body + sizeof rb, *end = p + rb.used;
    ct_blk_begin(&t->in, 1, rb.seq, rb.flags, p, end);
    uint64_t at = *o, head = sizeof(struct ct_rec_hdr) + sizeof(struct ct_rec_ceblock);
    struct ct_rec_ceblock cb = {0, rb.thread, t->out.seq, 0};
    uint64_t w = at + head;
    while (p < end) {
        struct ct_event e;
        if (!ct_blk_decode(&t->in, 1, &p, end, &e) || w + CT_CE_MAX_BODY > cap)
            return 0;
        *sum = fnv_event(*sum, &e);
        cb.cached += (e.reserved & CT_EV_STACK_CACHED) != 0;
        w = (uint64_t)(ct_ce_write(&t->out, &e, out + w) - out);
    }
    cb.used = (uint32_t)(w - at - head);
    uint64_t size = (w - at + 7) & ~7ull;
    if (size > cap - at)
        return 0;
    struct ct_rec_hdr h = {CT_REC_MAGIC, CT_REC_CEBLOCK, (uint32_t)size};
    memcpy(out + at, &h, sizeof h);
    memcpy(out + at + sizeof h, &cb, sizeof cb);
    memset(out + w, 0, at + size - w);
    *o = at + size;
    return 1;
}

/* The output decoded back: its events' sum, or 0 and *ok 0 when it does not decode. */
static uint64_t sum_back(struct threads *th, const uint8_t *out, uint64_t o, int *ok)
{
    uint64_t sum = 0xcbf29ce484222325ull, off = 0;
    struct ct_rec_hdr h;
    for (uint32_t i = 0; i < SLOTS; i++)
        if (th->ctx[i])
            memset(&th->ctx[i]->out, 0, sizeof th->ctx[i]->out);
    *ok = 0;
    while (off < o && header_at(out, o, off, &h)) {
        if (h.type == CT_REC_CEBLOCK) {
            struct ct_rec_ceblock cb;
            memcpy(&cb, out + off + sizeof h, sizeof cb);
            struct tctx *t = tctx_of(th, cb.thread, 0);
            const uint8_t *p = out + off + sizeof h + sizeof cb, *end = p + cb.used;
            if (!t)
                return 0;
            ct_ce_block_begin(&t->out, cb.seq, p, end);
            while (p < end) {
                struct ct_event e;
                if (!ct_ce_decode_fields(&t->out, &p, end, &e))
                    return 0;
                sum = fnv_event(sum, &e);
            }
        } else if (h.type != CT_REC_PAD) {
            sum = fnv(sum, out + off, h.size);
        }
        off += h.size;
    }
    *ok = off == o;
    return sum;
}

uint64_t ct_chunk_compact(const uint8_t *in, uint64_t len, uint8_t *out)
{
    struct threads *th = calloc(1, sizeof *th);
    if (!in || !out || !len || !th) {
        free(th);
        return 0;
    }
    memset(out, 0, len);
    uint64_t off = 0, o = 0, sum = 0xcbf29ce484222325ull;
    int blocks = 0, fits = 1;
    struct ct_rec_hdr h;
    while (fits && off + sizeof h <= len && header_at(in, len, off, &h)) {
        if (h.type == CT_REC_RAWBLOCK) {
            fits =
                block_out(th, in + off + sizeof h, h.size - (uint32_t)sizeof h, out, len, &o, &sum);
            blocks++;
        } else if (h.type == CT_REC_CEBLOCK || h.type == CT_REC_CEVENT || h.type == CT_REC_EVENT) {
            fits = 0; /* another format's events: not this function's */
        } else if (h.type != CT_REC_PAD) {
            fits = h.size <= len - o;
            if (fits) {
                memcpy(out + o, in + off, h.size);
                sum = fnv(sum, in + off, h.size);
                o += h.size;
            }
        }
        off += h.size;
    }
    /* the rest of the input must be zeros (no hole a killed writer left), the output must end
     * before the input's records did (the sealer cuts a killed process's file there) */
    int ok = fits && blocks && zeros(in + off, len - off) && o <= off;
    if (ok && off == len && o < len) { /* the input's records filled the chunk (a PAD at its
                                          end): so do the output's, or a reader sees a hole */
        struct ct_rec_hdr pad = {CT_REC_MAGIC, CT_REC_PAD, (uint32_t)(len - o)};
        memcpy(out + o, &pad, sizeof pad);
        o = len;
    }
    if (ok) {
        int back = 0;
        ok = sum_back(th, out, o, &back) == sum && back;
    }
    threads_free(th);
    return ok ? o : 0;
}
