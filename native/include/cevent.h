/* cevent.h - the compact event record (CT_REC_CEVENT), encoder and decoder in one place.
 *
 * The shim encodes (native/shim/shim.c's emit), the scanner decodes (native/reader/scan.c) into
 * the same struct ct_event the replay reads: the encoding is lossless, written once here.
 *
 * A compact event is a record like any other (8-byte header published by one release store,
 * size a multiple of 8), whose body holds the event's differences from the previous event of
 * the same thread ("context"), as varints:
 *
 *   +--------+-----+----+--------+------------+-------------------------------------+-------+
 *   | thread | seq | op | mask   | time delta | the fields whose mask bit is set,   | zeros |
 *   | varint | u8  |+ref| varint | varint     | in bit order (see CT_CE_*)          | to 8  |
 *   +--------+-----+----+--------+------------+-------------------------------------+-------+
 *
 *   thread  the writer's number for the calling thread in this file (0, 1, ...: dense)
 *   seq     the thread's records so far, modulo 256: a reader that finds one missing (a file
 *           damaged in the middle, never a kill) stops decoding that thread, it never guesses
 *   START   (a mask bit) the thread's first record: the context starts zeroed. Numbers of
 *           threads that exited are given to new threads, so a reader keeps one context per
 *           thread alive at once, not per thread ever seen
 *   time    ts_ns minus the thread's previous event's ts_ns (a thread's clock never goes
 *           back; CT_CE_TS_BACK says the delta is to be subtracted)
 *   op+ref  the op (low 4 bits) and the reference (high 4 bits): which of the thread's
 *           CT_CE_REFS last events (one per recent API and op: the writer keeps the one of the
 *           same API and op, else replaces them in turn) the fields are compared with; the
 *           event then takes that place.
 *   fields  a field equal to the reference's costs nothing. Addresses, stacks, aux and aux2
 *           are stored as zigzag deltas; a release of an address one of the references
 *           allocated (the common free) stores that reference's number (CT_CE_ADDR_REF).
 *
 * A thread's context starts zeroed (tid 0, ts 0, every field 0) at its first record in a file.
 * Records of one thread are in file order (a thread publishes a record before it reserves the
 * next), so a reader decoding in file order rebuilds every context. A torn record (reserved,
 * never published: the process was killed while writing it) belongs to a thread that wrote
 * nothing after it, so skipping it corrupts no later record. A record the writer could not
 * reserve (full disk) leaves the writer's context unchanged.
 */
#ifndef CUDATRACE_CEVENT_H
#define CUDATRACE_CEVENT_H
#include <stdint.h>
#include <string.h>

#include "trace_format.h"

/* mask bits, most frequent first (a mask below 128 is one byte) */
#define CT_CE_ADDR 0x1u       /* zigzag(addr - previous addr of the class) */
#define CT_CE_ADDR_REF 0x2u   /* u8 k: addr = reference k's addr */
#define CT_CE_SIZE 0x4u       /* varint size */
#define CT_CE_STACK 0x8u      /* zigzag(stack - previous stack of the class) */
#define CT_CE_AUX 0x10u       /* zigzag(aux - previous aux) */
#define CT_CE_AUX2 0x20u      /* zigzag(aux2 - previous aux2) */
#define CT_CE_API 0x40u       /* varint api, varint rt_api */
#define CT_CE_TID 0x80u       /* varint tid */
#define CT_CE_DEVICE 0x100u   /* zigzag device */
#define CT_CE_RESULT 0x200u   /* zigzag result */
#define CT_CE_KSF 0x400u      /* kind, space, flags: three bytes */
#define CT_CE_RESERVED 0x800u /* varint reserved */
#define CT_CE_TS_BACK 0x1000u /* the time delta is negative */
#define CT_CE_START 0x2000u   /* the thread's first record: its context starts zeroed here */
#define CT_CE_REFS 8
#define CT_CE_MAX_BODY 128 /* the most a body can take (every field at its longest) */

struct ct_ce_ctx {
    uint64_t ts;
    uint32_t tid;
    uint8_t seq;     /* records of the thread so far, modulo 256 */
    uint8_t lost;    /* reader: a record of the thread is missing, the rest cannot be decoded */
    uint8_t next;    /* writer: the reference replaced next */
    uint8_t started; /* 0: the next record is the thread's first (CT_CE_START) */
    struct ct_event prev[CT_CE_REFS];
};

/* the reference an event is encoded against: the last of its API and op, else the next one
 * in turn */
static inline uint32_t ct_ce_ref(const struct ct_ce_ctx *c, const struct ct_event *e)
{
    for (uint32_t k = 0; k < CT_CE_REFS; k++)
        if (c->prev[k].api == e->api && c->prev[k].op == e->op)
            return k;
    return c->next % CT_CE_REFS;
}

/* the 8 bytes of an event at offset off (the fields the fast path compares as words) */
static inline uint64_t ct_ce_w(const struct ct_event *e, unsigned off)
{
    uint64_t w;
    memcpy(&w, (const uint8_t *)e + off, 8);
    return w;
}
_Static_assert(__builtin_offsetof(struct ct_event, size) == 8 &&
                   __builtin_offsetof(struct ct_event, aux) == 24 &&
                   __builtin_offsetof(struct ct_event, aux2) == 32 &&
                   __builtin_offsetof(struct ct_event, tid) == 40 &&
                   __builtin_offsetof(struct ct_event, result) == 48 &&
                   __builtin_offsetof(struct ct_event, api) == 56 &&
                   __builtin_offsetof(struct ct_event, reserved) == 64,
               "the words ct_ce_encode_fields compares");

static inline int ct_ce_allocates(uint8_t op)
{
    return op == CT_OP_ALLOC || op == CT_OP_MAP || op == CT_OP_IMPORT;
}

static inline uint8_t *ct_ce_put(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint64_t ct_ce_zz(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }
static inline int64_t ct_ce_unzz(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

/* nonzero when e differs from its reference pv (or the thread's tid) in a field other than the
 * time and the address: a few word compares instead of one per field */
static inline uint64_t ct_ce_diff(const struct ct_ce_ctx *c, const struct ct_event *e,
                                  const struct ct_event *pv)
{
    return (ct_ce_w(e, 8) ^ ct_ce_w(pv, 8)) | (ct_ce_w(e, 24) ^ ct_ce_w(pv, 24)) |
           (ct_ce_w(e, 32) ^ ct_ce_w(pv, 32)) | (ct_ce_w(e, 40) ^ ct_ce_w(pv, 40)) |
           (ct_ce_w(e, 48) ^ ct_ce_w(pv, 48)) | (ct_ce_w(e, 56) ^ ct_ce_w(pv, 56)) |
           (uint64_t)(e->reserved ^ pv->reserved) | (uint64_t)(e->tid ^ c->tid);
}

/* the address's mask bits against reference pv: CT_CE_ADDR, or CT_CE_ADDR_REF with *aref the
 * reference that allocated it (the common free), or 0 when it is pv's */
static inline uint32_t ct_ce_addr_mask(const struct ct_ce_ctx *c, const struct ct_event *e,
                                       const struct ct_event *pv, uint32_t *aref)
{
    if (e->addr == pv->addr)
        return 0;
    if (e->addr && !ct_ce_allocates(e->op))
        for (uint32_t k = 0; k < CT_CE_REFS; k++)
            if (ct_ce_allocates(c->prev[k].op) && c->prev[k].addr == e->addr) {
                *aref = k;
                return CT_CE_ADDR_REF;
            }
    return CT_CE_ADDR;
}

/* Encode e's op, reference, mask, time and fields (everything after thread and seq) at p;
 * returns the end. *refp: the reference used. The context is NOT updated. */
static inline uint8_t *ct_ce_encode_fields(const struct ct_ce_ctx *c, const struct ct_event *e,
                                           uint8_t *p, uint32_t *refp)
{
    uint32_t ref = ct_ce_ref(c, e), aref = 0;
    *refp = ref;
    const struct ct_event *pv = &c->prev[ref];
    uint32_t mask = c->started ? 0 : CT_CE_START;
    /* the common case (a repeated call site): every field but the time and the address equal
     * the reference's, found with a few word compares instead of one per field */
    uint64_t diff = ct_ce_diff(c, e, pv) | mask;
    mask |= ct_ce_addr_mask(c, e, pv, &aref);
    if (__builtin_expect(diff != 0, 0)) {
        if (e->size != pv->size)
            mask |= CT_CE_SIZE;
        if (e->stack != pv->stack)
            mask |= CT_CE_STACK;
        if (e->aux != pv->aux)
            mask |= CT_CE_AUX;
        if (e->aux2 != pv->aux2)
            mask |= CT_CE_AUX2;
        if (e->api != pv->api || e->rt_api != pv->rt_api)
            mask |= CT_CE_API;
        if (e->tid != c->tid)
            mask |= CT_CE_TID;
        if (e->device != pv->device)
            mask |= CT_CE_DEVICE;
        if (e->result != pv->result)
            mask |= CT_CE_RESULT;
        if (e->kind != pv->kind || e->space != pv->space || e->flags != pv->flags)
            mask |= CT_CE_KSF;
        if (e->reserved != pv->reserved)
            mask |= CT_CE_RESERVED;
    }
    uint64_t dt = e->ts_ns - c->ts;
    if (e->ts_ns < c->ts) {
        mask |= CT_CE_TS_BACK;
        dt = c->ts - e->ts_ns;
    }
    *p++ = (uint8_t)((e->op & 0xf) | ref << 4);
    p = ct_ce_put(p, mask);
    p = ct_ce_put(p, dt);
    if (mask & CT_CE_ADDR_REF)
        *p++ = (uint8_t)aref;
    if (mask & CT_CE_ADDR)
        p = ct_ce_put(p, ct_ce_zz((int64_t)(e->addr - pv->addr)));
    if (!(mask & ~(CT_CE_ADDR | CT_CE_ADDR_REF | CT_CE_TS_BACK)))
        return p;
    if (mask & CT_CE_SIZE)
        p = ct_ce_put(p, e->size);
    if (mask & CT_CE_STACK)
        p = ct_ce_put(p, ct_ce_zz((int64_t)(int32_t)(e->stack - pv->stack)));
    if (mask & CT_CE_AUX)
        p = ct_ce_put(p, ct_ce_zz((int64_t)(e->aux - pv->aux)));
    if (mask & CT_CE_AUX2)
        p = ct_ce_put(p, ct_ce_zz((int64_t)(e->aux2 - pv->aux2)));
    if (mask & CT_CE_API) {
        p = ct_ce_put(p, e->api);
        p = ct_ce_put(p, e->rt_api);
    }
    if (mask & CT_CE_TID)
        p = ct_ce_put(p, e->tid);
    if (mask & CT_CE_DEVICE)
        p = ct_ce_put(p, ct_ce_zz(e->device));
    if (mask & CT_CE_RESULT)
        p = ct_ce_put(p, ct_ce_zz(e->result));
    if (mask & CT_CE_KSF) {
        *p++ = e->kind;
        *p++ = e->space;
        *p++ = e->flags;
    }
    if (mask & CT_CE_RESERVED)
        p = ct_ce_put(p, e->reserved);
    return p;
}

/* The common case of a repeated call site, encoded and committed at once: e equals the
 * reference of its API and op in every field but the time and the address, and its time does not
 * go back. The bytes are those ct_ce_encode_fields writes for it, and the context ends as
 * ct_ce_commit leaves it (only the time, the address and seq move), without the copy of the
 * whole event. Returns the end, or NULL when the case does not apply (nothing is changed). */
static inline __attribute__((always_inline)) uint8_t *
ct_ce_encode_repeat(struct ct_ce_ctx *c, const struct ct_event *e, uint8_t *p)
{
    if (!c->started || e->ts_ns < c->ts)
        return NULL;
    uint32_t ref = ct_ce_ref(c, e);
    struct ct_event *pv = &c->prev[ref];
    if (ct_ce_diff(c, e, pv)) /* a field changed, or no reference of this API and op yet */
        return NULL;
    uint32_t aref = 0, mask = ct_ce_addr_mask(c, e, pv, &aref);
    *p++ = (uint8_t)((e->op & 0xf) | ref << 4);
    *p++ = (uint8_t)mask; /* below 128: one byte */
    p = ct_ce_put(p, e->ts_ns - c->ts);
    if (mask == CT_CE_ADDR_REF)
        *p++ = (uint8_t)aref;
    else if (mask == CT_CE_ADDR)
        p = ct_ce_put(p, ct_ce_zz((int64_t)(e->addr - pv->addr)));
    c->ts = e->ts_ns;
    c->seq++;
    pv->ts_ns = e->ts_ns;
    pv->addr = e->addr;
    return p;
}

/* Encode e (of thread number `thread`, whose context is c) into body as a CEVENT body; returns
 * its length and the reference used (*refp). The context is NOT updated: call
 * ct_ce_commit(c, e, *refp) once the record is written. */
static inline uint32_t ct_ce_encode(const struct ct_ce_ctx *c, uint32_t thread,
                                    const struct ct_event *e, uint8_t *body, uint32_t *refp)
{
    uint8_t *p = ct_ce_put(body, thread);
    *p++ = c->seq;
    p = ct_ce_encode_fields(c, e, p, refp);
    return (uint32_t)(p - body);
}

/* e was written against reference ref: it takes its place */
static inline void ct_ce_commit(struct ct_ce_ctx *c, const struct ct_event *e, uint32_t ref)
{
    c->ts = e->ts_ns;
    c->tid = e->tid;
    c->seq++;
    c->started = 1;
    if (ref == c->next % CT_CE_REFS && (c->prev[ref].api != e->api || c->prev[ref].op != e->op))
        c->next++;
    c->prev[ref] = *e;
}

/* the general path of ct_ce_write, out of line: inlined, it made the compiler load every field
 * of the event before the short path's test (the short path then paid for the general one) */
__attribute__((noinline, unused)) static uint8_t *
ct_ce_write_general(struct ct_ce_ctx *c, const struct ct_event *e, uint8_t *p)
{
    uint32_t ref;
    uint8_t *end = ct_ce_encode_fields(c, e, p, &ref);
    ct_ce_commit(c, e, ref);
    return end;
}

/* Encode e into a block at p and commit it to c (the writer's way, native/shim/events.c, and
 * the test packer's, native/reader/cpack.c): the repeated site's short path, else the general
 * one. Returns the end. The caller has made room for CT_CE_MAX_BODY bytes. */
static inline uint8_t *ct_ce_write(struct ct_ce_ctx *c, const struct ct_event *e, uint8_t *p)
{
    uint8_t *end = ct_ce_encode_repeat(c, e, p);
    return __builtin_expect(end != NULL, 1) ? end : ct_ce_write_general(c, e, p);
}

/* ---- decoding ---- */
static inline int ct_ce_get(const uint8_t **pp, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;
    const uint8_t *p = *pp;
    for (int shift = 0; shift < 64; shift += 7) {
        if (p >= end)
            return 0;
        uint8_t b = *p++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *v = r;
            return 1;
        }
    }
    return 0;
}

/* the thread number of a body (to find its context); 0 when malformed */
static inline int ct_ce_thread(const uint8_t *body, uint32_t len, uint64_t *thread)
{
    const uint8_t *p = body;
    return ct_ce_get(&p, body + len, thread);
}

/* Decode one event's op, reference, mask, time and fields at *pp (before end) into out, given
 * its thread's context (updated on success; *pp moves past it). 0: malformed, or the thread's
 * records cannot be decoded any more (c->lost). */
static inline int ct_ce_decode_fields(struct ct_ce_ctx *c, const uint8_t **pp, const uint8_t *end,
                                      struct ct_event *out)
{
    const uint8_t *p = *pp;
    uint64_t mask, dt, v;
    if (p >= end)
        return 0;
    uint8_t op = *p & 0xf, ref = *p >> 4;
    p++;
    if (ref >= CT_CE_REFS || !ct_ce_get(&p, end, &mask))
        return 0;
    if (mask & CT_CE_START) /* a thread's first record (its number may be a reused one) */
        memset(c, 0, sizeof *c);
    if (c->lost)
        return 0;
    if (!ct_ce_get(&p, end, &dt))
        return 0;
    struct ct_event e = c->prev[ref];
    e.op = op;
    e.tid = c->tid;
    e.ts_ns = (mask & CT_CE_TS_BACK) ? c->ts - dt : c->ts + dt;
#define CT_CE_GET(x) (ct_ce_get(&p, end, &(x)))
    if (mask & CT_CE_ADDR_REF) {
        if (p >= end || *p >= CT_CE_REFS)
            return 0;
        e.addr = c->prev[*p++].addr;
    }
    if ((mask & CT_CE_ADDR) && !(CT_CE_GET(v) && (e.addr += (uint64_t)ct_ce_unzz(v), 1)))
        return 0;
    if ((mask & CT_CE_SIZE) && !(CT_CE_GET(v) && (e.size = v, 1)))
        return 0;
    if ((mask & CT_CE_STACK) && !(CT_CE_GET(v) && (e.stack += (uint32_t)ct_ce_unzz(v), 1)))
        return 0;
    if ((mask & CT_CE_AUX) && !(CT_CE_GET(v) && (e.aux += (uint64_t)ct_ce_unzz(v), 1)))
        return 0;
    if ((mask & CT_CE_AUX2) && !(CT_CE_GET(v) && (e.aux2 += (uint64_t)ct_ce_unzz(v), 1)))
        return 0;
    if (mask & CT_CE_API) {
        uint64_t a, r;
        if (!CT_CE_GET(a) || !CT_CE_GET(r))
            return 0;
        e.api = (uint16_t)a;
        e.rt_api = (uint16_t)r;
    }
    if ((mask & CT_CE_TID) && !(CT_CE_GET(v) && (e.tid = (uint32_t)v, 1)))
        return 0;
    if ((mask & CT_CE_DEVICE) && !(CT_CE_GET(v) && (e.device = (int32_t)ct_ce_unzz(v), 1)))
        return 0;
    if ((mask & CT_CE_RESULT) && !(CT_CE_GET(v) && (e.result = (int32_t)ct_ce_unzz(v), 1)))
        return 0;
    if (mask & CT_CE_KSF) {
        if (end - p < 3)
            return 0;
        e.kind = p[0];
        e.space = p[1];
        e.flags = p[2];
        p += 3;
    }
    if ((mask & CT_CE_RESERVED) && !(CT_CE_GET(v) && (e.reserved = (uint32_t)v, 1)))
        return 0;
#undef CT_CE_GET
    *out = e;
    *pp = p;
    ct_ce_commit(c, &e, ref);
    return 1;
}

/* What ct_ce_decode_fields does to the context and to *pp, without the event: for a reader
 * that only counts events and follows each thread's time (*ts). The same checks, so it fails
 * exactly where decoding would. */
static inline int ct_ce_skip_fields(struct ct_ce_ctx *c, const uint8_t **pp, const uint8_t *end,
                                    uint64_t *ts)
{
    const uint8_t *p = *pp;
    uint64_t mask, dt, v;
    if (p >= end)
        return 0;
    uint8_t ref = *p >> 4;
    p++;
    if (ref >= CT_CE_REFS || !ct_ce_get(&p, end, &mask))
        return 0;
    if (mask & CT_CE_START)
        memset(c, 0, sizeof *c);
    if (c->lost || !ct_ce_get(&p, end, &dt))
        return 0;
    if (mask & CT_CE_ADDR_REF) {
        if (p >= end || *p >= CT_CE_REFS)
            return 0;
        p++;
    }
    static const uint32_t varints[] = {CT_CE_ADDR,   CT_CE_SIZE,  CT_CE_STACK, CT_CE_AUX,
                                       CT_CE_AUX2,   CT_CE_API,   CT_CE_API,   CT_CE_TID,
                                       CT_CE_DEVICE, CT_CE_RESULT};
    for (unsigned k = 0; k < sizeof varints / sizeof varints[0]; k++)
        if ((mask & varints[k]) && !ct_ce_get(&p, end, &v))
            return 0;
    if (mask & CT_CE_KSF) {
        if (end - p < 3)
            return 0;
        p += 3;
    }
    if ((mask & CT_CE_RESERVED) && !ct_ce_get(&p, end, &v))
        return 0;
    c->ts = (mask & CT_CE_TS_BACK) ? c->ts - dt : c->ts + dt;
    c->seq++;
    c->started = 1;
    *ts = c->ts;
    *pp = p;
    return 1;
}

/* Decode a CEVENT body into out, given the thread's context (updated on success). 0: malformed. */
static inline int ct_ce_decode(struct ct_ce_ctx *c, const uint8_t *body, uint32_t len,
                               struct ct_event *out)
{
    const uint8_t *p = body, *end = body + len;
    uint64_t thread;
    if (!ct_ce_get(&p, end, &thread) || end - p < 3)
        return 0;
    uint8_t seq = *p++;
    /* the seq check needs the START bit first: it is in the mask, after op+ref */
    const uint8_t *q = p + 1;
    uint64_t mask;
    if (!ct_ce_get(&q, end, &mask))
        return 0;
    if (mask & CT_CE_START)
        memset(c, 0, sizeof *c);
    if (c->lost)
        return 0;
    if (seq != c->seq) {
        c->lost = 1;
        return 0;
    }
    return ct_ce_decode_fields(c, &p, end, out);
}

/* The start of one of a thread's blocks (CEBLOCK) whose events are p..end, written when the
 * thread had seq (modulo 256) events before: a block that does not follow the thread's last
 * one (an earlier block is missing: a damaged file) makes the rest of the thread unreadable,
 * unless its first event starts a new thread (START). The scanner and the replay's streams
 * call it at each block, so both decode a thread alike. */
static inline void ct_ce_block_begin(struct ct_ce_ctx *c, uint32_t seq, const uint8_t *p,
                                     const uint8_t *end)
{
    if (p < end && !c->lost) {
        /* the START bit of the first event clears the context: look at it before the seq */
        const uint8_t *q = p + 1;
        uint64_t mask = 0;
        int start = ct_ce_get(&q, end, &mask) && (mask & CT_CE_START);
        if (!start && (uint8_t)seq != c->seq)
            c->lost = 1;
    }
}

#endif
