/* rawevent.h - the raw event record (format version 4): what the shim writes on the calling
 * thread, and how readers decode it. Encoder (native/shim/events.h) and decoder
 * (native/reader/scan.c, replay.c, transcode.c) in one place, as cevent.h is for the compact form.
 *
 * A thread appends its events to a block of its own (a RAWBLOCK record: struct ct_rec_rawblock,
 * then records back to back), each published by one release store of the block's `used`. A
 * record is fixed-size and needs no encoding on the caller's thread beyond a few word compares:
 *
 *   short (24 bytes), the common case, a call like the thread's last full record of its API:
 *     w0  size (bits 0-47) | api (48-55) | CT_RAW_SHORT (56-59) | cached stack (bit 60)
 *     w1  time since the thread's previous event (bits 0-31) | stack node (32-63)
 *     w2  address
 *   full (80 bytes), anything else (a new API, another stream or device, a failure, a size of
 *   2^48 or more, more than 4.3 s since the thread's last event, a time going back):
 *     w0  CT_RAW_FULL (bits 56-59)
 *     struct ct_event, whole
 *
 * A short record takes every other field (the API's op, kind, space, flags, runtime API, aux,
 * aux2, device, result, tid) from the thread's last full record of the same API: its
 * *reference*, one per api % CT_RAW_REFS. The writer writes a full record whenever one of those
 * fields differs from the reference's, and that record becomes the reference.
 *
 * A thread's references and time start anew (zeros) at a block whose header says
 * CT_RAWB_START: the thread's first block in the file, and its first in each chunk, so each
 * chunk reads on its own (a reader that lost a chunk reads the next one; the sealer transcodes
 * a chunk alone). A block without START must follow the thread's previous one: its `seq` is the
 * thread's events since the start, or an earlier block is missing (a damaged file) and the
 * thread is not decoded further until its next START.
 *
 * A trace of repeated sites takes ~24 bytes an event raw (docs/format.md); the launcher's
 * sealer turns each sealed chunk into compact blocks (CEBLOCK, cevent.h) before it compresses
 * it (native/reader/transcode.c).
 */
#ifndef CUDATRACE_RAWEVENT_H
#define CUDATRACE_RAWEVENT_H
#include <stdint.h>
#include <string.h>

#include "trace_format.h"

#define CT_RAW_SHORT 1u
#define CT_RAW_FULL 2u
#define CT_RAW_SHORT_SIZE 24u
#define CT_RAW_FULL_SIZE (8u + (uint32_t)sizeof(struct ct_event))
#define CT_RAW_MAX CT_RAW_FULL_SIZE /* the most one record takes */
#define CT_RAW_REFS 32
#define CT_RAW_SIZE_MASK ((1ull << 48) - 1)
#define CT_RAW_CACHED (1ull << 60)
_Static_assert(sizeof(struct ct_event) == 72, "a full raw record is 80 bytes");

/* the kind of the record whose first word is w0 (CT_RAW_*; anything else is damage) */
static inline uint32_t ct_raw_kind(uint64_t w0) { return (uint32_t)(w0 >> 56) & 0xf; }

/* ---- the writer's side: what a short record must match -----------------------------------
 * The fields a short record takes from its reference, as four words (the writer compares
 * them, native/shim/events.h). meta: api | rt_api << 16 | op << 32 | kind << 40 | space << 48 |
 * flags << 56; dr: device | result << 32. */
struct ct_raw_ref {
    uint64_t meta, aux, aux2, dr;
};
static inline uint64_t ct_raw_meta(uint16_t api, uint16_t rt_api, uint8_t op, uint8_t kind,
                                   uint8_t space, uint8_t flags)
{
    return (uint64_t)api | (uint64_t)rt_api << 16 | (uint64_t)op << 32 | (uint64_t)kind << 40 |
           (uint64_t)space << 48 | (uint64_t)flags << 56;
}
static inline uint64_t ct_raw_dr(int32_t device, int32_t result)
{
    return (uint64_t)(uint32_t)device | (uint64_t)(uint32_t)result << 32;
}

/* e as a full record at p (CT_RAW_FULL_SIZE bytes) */
static inline void ct_raw_put_full(uint8_t *p, const struct ct_event *e)
{
    uint64_t w0 = (uint64_t)CT_RAW_FULL << 56;
    memcpy(p, &w0, 8);
    memcpy(p + 8, e, sizeof *e);
}

/* A writer's state for one thread: its last time and its references. */
struct ct_raw_wctx {
    uint64_t last_ts;
    struct ct_raw_ref ref[CT_RAW_REFS];
};

/* e (an event of the thread whose tid is self) as a short record when it matches its
 * reference, else a full one that becomes the reference; written at p (CT_RAW_MAX bytes of
 * room), the state moved on. Returns the bytes written. The shim's inline path
 * (native/shim/events.h) is this function's short case, specialized. */
static inline uint32_t ct_raw_encode(struct ct_raw_wctx *w, const struct ct_event *e, uint32_t self,
                                     uint8_t *p)
{
    uint64_t meta = ct_raw_meta(e->api, e->rt_api, e->op, e->kind, e->space, e->flags);
    uint64_t dr = ct_raw_dr(e->device, e->result), dt = e->ts_ns - w->last_ts;
    struct ct_raw_ref *r = &w->ref[e->api % CT_RAW_REFS];
    /* a short record takes its reference's tid and no reserved bit but one: only such a full
     * record may be a reference */
    int can_ref =
        e->api && e->api < 256 && e->tid == self && !(e->reserved & ~(uint32_t)CT_EV_STACK_CACHED);
    uint32_t n;
    if (can_ref && !(dt >> 32) && !(e->size >> 48) && r->meta == meta && r->aux == e->aux &&
        r->aux2 == e->aux2 && r->dr == dr) {
        uint64_t x[3] = {e->size | (uint64_t)e->api << 48 | (uint64_t)CT_RAW_SHORT << 56 |
                             ((e->reserved & CT_EV_STACK_CACHED) ? CT_RAW_CACHED : 0),
                         dt | (uint64_t)e->stack << 32, e->addr};
        memcpy(p, x, sizeof x);
        n = CT_RAW_SHORT_SIZE;
    } else {
        ct_raw_put_full(p, e);
        n = CT_RAW_FULL_SIZE;
        if (can_ref) {
            struct ct_raw_ref nr = {meta, e->aux, e->aux2, dr};
            *r = nr;
        } else {
            memset(r, 0, sizeof *r);
        }
    }
    w->last_ts = e->ts_ns;
    return n;
}

/* ---- the reader's side ------------------------------------------------------------------ */
/* A thread's context: its time, its events since its start, its references (api 0: none). */
struct ct_raw_ctx {
    uint64_t ts;
    uint32_t count;
    uint8_t lost;    /* a block is missing: nothing more until the next START */
    uint8_t started; /* a block of the thread was read */
    uint8_t pad[2];
    struct ct_event ref[CT_RAW_REFS];
};

/* A block of the thread begins (its header's seq and flags): START clears the context; a block
 * that does not follow the thread's last one makes the rest of the thread unreadable. */
static inline void ct_raw_block_begin(struct ct_raw_ctx *c, uint32_t seq, uint32_t flags)
{
    if (flags & CT_RAWB_START) {
        memset(c, 0, sizeof *c);
        c->started = 1;
        return;
    }
    if (!c->started || seq != c->count)
        c->lost = 1;
}

/* Decode the record at *pp (before end) into out (*pp moves past it). 0: malformed, cut short,
 * or the thread is lost. */
static inline int ct_raw_decode(struct ct_raw_ctx *c, const uint8_t **pp, const uint8_t *end,
                                struct ct_event *out)
{
    const uint8_t *p = *pp;
    uint64_t w[3];
    if (c->lost || end - p < 8)
        return 0;
    memcpy(w, p, 8);
    uint32_t kind = ct_raw_kind(w[0]);
    if (kind == CT_RAW_SHORT) {
        if (end - p < (long)CT_RAW_SHORT_SIZE)
            return 0;
        memcpy(w + 1, p + 8, 16);
        uint16_t api = (uint16_t)(w[0] >> 48 & 0xff);
        const struct ct_event *ref = &c->ref[api % CT_RAW_REFS];
        if (!api || ref->api != api || (w[0] >> 61))
            return 0;
        *out = *ref;
        out->ts_ns = c->ts + (uint32_t)w[1];
        out->size = w[0] & CT_RAW_SIZE_MASK;
        out->stack = (uint32_t)(w[1] >> 32);
        out->addr = w[2];
        out->reserved = (w[0] & CT_RAW_CACHED) ? CT_EV_STACK_CACHED : 0;
        *pp = p + CT_RAW_SHORT_SIZE;
    } else if (kind == CT_RAW_FULL && (w[0] & ~(0xfull << 56)) == 0) {
        if (end - p < (long)CT_RAW_FULL_SIZE)
            return 0;
        memcpy(out, p + 8, sizeof *out);
        c->ref[out->api % CT_RAW_REFS] = *out; /* (api 0: never a short record's) */
        *pp = p + CT_RAW_FULL_SIZE;
    } else {
        return 0;
    }
    c->ts = out->ts_ns;
    c->count++;
    return 1;
}

#endif
