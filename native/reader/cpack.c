/* cpack.c - event records written from an array with the shim's own encoders (scan.h): compact
 * records (ct_cevent_pack, cevent.h: version 2), compact blocks (ct_ceblock_pack: version 3) and
 * raw blocks (ct_rawblock_pack, rawevent.h: version 4), laid out as the shim's writer lays them:
 * what tests and tools/ use to write traces without a second copy of an encoding. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cevent.h"
#include "rawevent.h"
#include "scan.h"

uint64_t ct_cevent_pack(const struct ct_event *events, uint64_t n, const uint32_t *threads,
                        uint8_t *out, uint64_t cap)
{
    struct ct_ce_ctx *cx = NULL;
    uint64_t ncx = 0, len = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t th = threads ? threads[i] & 0x7fffffffu : 0;
        if (th >= ncx) {
            uint64_t m = (uint64_t)th + 16;
            struct ct_ce_ctx *c = realloc(cx, m * sizeof *c);
            if (!c) {
                free(cx);
                return UINT64_MAX;
            }
            memset(c + ncx, 0, (m - ncx) * sizeof *c);
            cx = c;
            ncx = m;
        }
        if (threads && threads[i] >> 31) /* a new thread takes this number */
            memset(&cx[th], 0, sizeof cx[th]);
        uint8_t body[CT_CE_MAX_BODY];
        uint32_t ref;
        uint32_t b = ct_ce_encode(&cx[th], th, &events[i], body, &ref);
        uint32_t size = (uint32_t)((sizeof(struct ct_rec_hdr) + b + 7) & ~(uint64_t)7);
        if (out && len + size <= cap) {
            struct ct_rec_hdr h = {CT_REC_MAGIC, CT_REC_CEVENT, size};
            memcpy(out + len, &h, sizeof h);
            memcpy(out + len + sizeof h, body, b);
            memset(out + len + sizeof h + b, 0, size - sizeof h - b);
        }
        len += size;
        ct_ce_commit(&cx[th], &events[i], ref);
    }
    free(cx);
    return len;
}

/* ---- event blocks (CEBLOCK, format version 3), laid out as the shim's events.c does ---- */
#define CB_FIRST 256 /* a thread's first block; each next one twice the last, to CB_MAX */
#define CB_MAX 8192
#define CB_HEAD (sizeof(struct ct_rec_hdr) + sizeof(struct ct_rec_ceblock))

struct cb_thread {
    struct ct_ce_ctx ctx;
    uint32_t count;     /* the thread's events so far */
    uint32_t next_size; /* of its next block */
};

uint64_t ct_ceblock_state_size(uint32_t nthreads) { return nthreads * sizeof(struct cb_thread); }

/* a new block of thread th at out + *len (file offset pos + *len); 0: no room in out */
static uint64_t take_block(struct cb_thread *t, uint32_t th, uint8_t *out, uint64_t cap,
                           uint64_t pos, uint64_t *len)
{
    uint32_t size = t->next_size < CB_FIRST ? CB_FIRST : t->next_size;
    uint64_t rest = CT_CHUNK_SIZE - (pos + *len) % CT_CHUNK_SIZE;
    if (size > rest) { /* never across a chunk: PAD the chunk's rest, as the writer does */
        if (*len + rest > cap)
            return 0;
        memset(out + *len, 0, rest);
        if (rest >= sizeof(struct ct_rec_hdr)) {
            struct ct_rec_hdr h = {CT_REC_MAGIC, CT_REC_PAD, (uint32_t)rest};
            memcpy(out + *len, &h, sizeof h);
        }
        *len += rest;
    }
    if (*len + size > cap)
        return 0;
    uint64_t at = *len;
    memset(out + at, 0, size);
    struct ct_rec_hdr h = {CT_REC_MAGIC, CT_REC_CEBLOCK, size};
    struct ct_rec_ceblock bh = {0, th, t->count, 0};
    memcpy(out + at, &h, sizeof h);
    memcpy(out + at + sizeof h, &bh, sizeof bh);
    *len += size;
    t->next_size = size < CB_MAX ? size * 2 : CB_MAX;
    return at + 1;
}

uint64_t ct_ceblock_pack(const struct ct_event *events, uint64_t n, const uint32_t *threads,
                         uint8_t *state, uint32_t nthreads, uint64_t pos, uint8_t *out,
                         uint64_t cap)
{
    struct cb_thread *ts = (struct cb_thread *)(void *)state;
    uint64_t len = 0;
    /* per thread: where its open block is in out (0: none), its used bytes and room */
    uint64_t *open = calloc(nthreads ? nthreads : 1, sizeof *open);
    uint32_t *used = calloc(nthreads ? nthreads : 1, sizeof *used);
    if (!open || !used || !state) {
        free(open);
        free(used);
        return UINT64_MAX;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint32_t th = threads ? threads[i] & 0x7fffffffu : 0;
        if (th >= nthreads)
            goto fail;
        struct cb_thread *t = &ts[th];
        if (threads && threads[i] >> 31) { /* a new thread takes this number */
            memset(&t->ctx, 0, sizeof t->ctx);
            t->count = 0;
            open[th] = 0;
        }
        if (open[th]) {
            uint32_t size;
            memcpy(&size, out + open[th] - 1 + 4, 4);
            if (size - CB_HEAD - used[th] < CT_CE_MAX_BODY)
                open[th] = 0;
        }
        if (!open[th]) {
            open[th] = take_block(t, th, out, cap, pos, &len);
            used[th] = 0;
            if (!open[th])
                goto fail;
        }
        uint8_t *blk = out + open[th] - 1;
        uint8_t *at = blk + CB_HEAD + used[th];
        uint8_t *end = ct_ce_write(&t->ctx, &events[i], at); /* as the shim writes */
        used[th] += (uint32_t)(end - at);
        memcpy(blk + sizeof(struct ct_rec_hdr), &used[th], 4);
        t->count++;
    }
    free(open);
    free(used);
    return len;
fail:
    free(open);
    free(used);
    return UINT64_MAX;
}

/* ---- raw blocks (RAWBLOCK, format version 4), laid out as the shim's events.c does ---- */
#define RB_HEAD (sizeof(struct ct_rec_hdr) + sizeof(struct ct_rec_rawblock))

struct rb_thread {
    struct ct_raw_wctx w;
    uint32_t count;      /* its events since its START */
    uint32_t next_size;  /* of its next block */
    uint64_t last_chunk; /* of its last block, + 1 (0: none) */
    uint32_t tid, pad;   /* of its last event */
};

uint64_t ct_rawblock_state_size(uint32_t nthreads) { return nthreads * sizeof(struct rb_thread); }

/* a new block of thread th at out + *len (file offset pos + *len); 0: no room in out */
static uint64_t take_raw_block(struct rb_thread *t, uint32_t th, uint8_t *out, uint64_t cap,
                               uint64_t pos, uint64_t *len)
{
    uint32_t size = t->next_size < CB_FIRST ? CB_FIRST : t->next_size;
    uint64_t rest = CT_CHUNK_SIZE - (pos + *len) % CT_CHUNK_SIZE;
    if (size > rest) { /* never across a chunk: PAD the chunk's rest, as the writer does */
        if (*len + rest > cap)
            return 0;
        memset(out + *len, 0, rest);
        if (rest >= sizeof(struct ct_rec_hdr)) {
            struct ct_rec_hdr h = {CT_REC_MAGIC, CT_REC_PAD, (uint32_t)rest};
            memcpy(out + *len, &h, sizeof h);
        }
        *len += rest;
    }
    if (*len + size > cap)
        return 0;
    uint64_t at = *len, chunk = (pos + at) / CT_CHUNK_SIZE;
    int start = t->last_chunk != chunk + 1;
    if (start) {
        memset(&t->w, 0, sizeof t->w);
        t->count = 0;
        t->tid = 0;
    }
    t->last_chunk = chunk + 1;
    memset(out + at, 0, size);
    struct ct_rec_hdr h = {CT_REC_MAGIC, CT_REC_RAWBLOCK, size};
    struct ct_rec_rawblock bh = {0, th, t->count, start ? CT_RAWB_START : 0};
    memcpy(out + at, &h, sizeof h);
    memcpy(out + at + sizeof h, &bh, sizeof bh);
    *len += size;
    t->next_size = size < CB_MAX ? size * 2 : CB_MAX;
    return at + 1;
}

uint64_t ct_rawblock_pack(const struct ct_event *events, uint64_t n, const uint32_t *threads,
                          uint8_t *state, uint32_t nthreads, uint64_t pos, uint8_t *out,
                          uint64_t cap)
{
    struct rb_thread *ts = (struct rb_thread *)(void *)state;
    uint64_t len = 0;
    uint64_t *open = calloc(nthreads ? nthreads : 1, sizeof *open);
    uint32_t *used = calloc(nthreads ? nthreads : 1, sizeof *used);
    if (!open || !used || !state) {
        free(open);
        free(used);
        return UINT64_MAX;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint32_t th = threads ? threads[i] & 0x7fffffffu : 0;
        if (th >= nthreads)
            goto fail;
        struct rb_thread *t = &ts[th];
        if (threads && threads[i] >> 31) { /* a new thread takes this number */
            memset(t, 0, sizeof *t);
            open[th] = 0;
        }
        if (open[th]) {
            uint32_t size;
            memcpy(&size, out + open[th] - 1 + 4, 4);
            if (size - RB_HEAD - used[th] < CT_RAW_MAX)
                open[th] = 0;
        }
        if (!open[th]) {
            open[th] = take_raw_block(t, th, out, cap, pos, &len);
            used[th] = 0;
            if (!open[th])
                goto fail;
        }
        uint8_t *blk = out + open[th] - 1;
        /* a short record takes its reference's tid: another tid, no reference holds */
        if (events[i].tid != t->tid)
            memset(t->w.ref, 0, sizeof t->w.ref);
        t->tid = events[i].tid;
        used[th] += ct_raw_encode(&t->w, &events[i], events[i].tid, blk + RB_HEAD + used[th]);
        memcpy(blk + sizeof(struct ct_rec_hdr), &used[th], 4);
        t->count++;
    }
    free(open);
    free(used);
    return len;
fail:
    free(open);
    free(used);
    return UINT64_MAX;
}
