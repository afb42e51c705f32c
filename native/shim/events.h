/* events.h - writing one event (events.c): a raw record (rawevent.h) appended to the calling
 * thread's own block of the trace. The common case (a call like the thread's last of its API,
 * room in its block) is inline: a few word compares, three stores and the store that publishes
 * it; anything else goes to events.c. The encoding into compact records happens off the
 * calling thread (the launcher's sealer, native/reader/transcode.c). */
#ifndef CUDATRACE_EVENTS_H
#define CUDATRACE_EVENTS_H

#include <stdint.h>

#include "rawevent.h"
#include "trace_format.h"
#include "util.h"
#include "writer.h"

/* the thread's writing state, one thread-local object; events.c alone changes it outside the
 * inline path below */
#define CT_EV_BLOCK_HEAD (sizeof(struct ct_rec_hdr) + sizeof(struct ct_rec_rawblock))
struct ct_ev_thread {
    struct ct_raw_wctx w; /* its last time and references, since its START */
    uint32_t used, room;  /* bytes of records in its block, and the block's room */
    uint32_t count;       /* events since its START (the next block's seq) */
    uint64_t before;      /* events written to this file before its START */
    uint32_t thread;      /* the thread's number in the file */
    uint32_t gen;         /* writer generation the state belongs to (0: none) */
    uint32_t next_size;   /* of its next block */

    ct_block block;            /* its block (NULL: none) */
    struct ct_ev_thread *next; /* the threads that write (events.c: their totals) */
};
extern CT_HIDDEN CT_TLS struct ct_ev_thread ct_ev_tw;

/* one more to a count only this thread writes and others read: one plain add on x86-64 (an
 * aligned store is whole to a reader), a relaxed atomic store elsewhere and under TSan */
static inline void ct_ev_inc(uint32_t *p)
{
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    __asm__("addl $1, %0" : "+m"(*p));
#else
    __atomic_store_n(p, *p + 1, __ATOMIC_RELAXED);
#endif
}

/* the general case of ct_event_put (events.c): a full record, a new block, a new file */
int ct_event_write_slow(const struct ct_event *e);

/* Write one event, given as the words a short record compares (rawevent.h: meta, aux, aux2,
 * dr) and its own fields; cached: CT_RAW_CACHED when its stack came from the unwinder's cache.
 * 0: not written (no trace, or the file could not grow). */
static inline __attribute__((always_inline)) int
ct_event_put(uint64_t ts, uint64_t size, uint64_t addr, uint32_t stack, uint64_t cached,
             uint64_t meta, uint64_t aux, uint64_t aux2, uint64_t dr)
{
    struct ct_ev_thread *tw = &ct_ev_tw;
    uint64_t dt = ts - tw->w.last_ts;
    const struct ct_raw_ref *r = &tw->w.ref[(uint16_t)meta % CT_RAW_REFS];
    if (__builtin_expect(tw->room - tw->used >= CT_RAW_SHORT_SIZE && !(dt >> 32) && !(size >> 48) &&
                             r->meta == meta && r->aux == aux && r->aux2 == aux2 && r->dr == dr,
                         1)) {
        uint8_t *blk = tw->block.p;
        uint64_t *p = (uint64_t *)(void *)(blk + CT_EV_BLOCK_HEAD + tw->used);
        p[0] = size | (meta & 0xff) << 48 | (uint64_t)CT_RAW_SHORT << 56 | cached;
        p[1] = dt | (uint64_t)stack << 32;
        p[2] = addr;
        uint32_t used = tw->used + CT_RAW_SHORT_SIZE;
        tw->used = used;
        __atomic_store_n((uint32_t *)(void *)(blk + sizeof(struct ct_rec_hdr)), used,
                         __ATOMIC_RELEASE);
        tw->w.last_ts = ts;
        ct_ev_inc(&tw->count); /* (ct_events_total reads it) */
        return 1;
    }
    struct ct_event e = {.ts_ns = ts,
                         .size = size,
                         .addr = addr,
                         .aux = aux,
                         .aux2 = aux2,
                         .tid = ct_gettid(),
                         .device = (int32_t)(uint32_t)dr,
                         .result = (int32_t)(uint32_t)(dr >> 32),
                         .stack = stack,
                         .api = (uint16_t)meta,
                         .rt_api = (uint16_t)(meta >> 16),
                         .op = (uint8_t)(meta >> 32),
                         .kind = (uint8_t)(meta >> 40),
                         .space = (uint8_t)(meta >> 48),
                         .flags = (uint8_t)(meta >> 56),
                         .reserved = cached ? CT_EV_STACK_CACHED : 0};
    return ct_event_write_slow(&e);
}

/* Write e (its tid the calling thread's). 0: not written. */
static inline int ct_event_write(const struct ct_event *e)
{
    return ct_event_put(e->ts_ns, e->size, e->addr, e->stack,
                        (e->reserved & CT_EV_STACK_CACHED) ? CT_RAW_CACHED : 0,
                        ct_raw_meta(e->api, e->rt_api, e->op, e->kind, e->space, e->flags), e->aux,
                        e->aux2, ct_raw_dr(e->device, e->result));
}

/* the events this process wrote to its file (the END record's count) */
uint64_t ct_events_total(void);
/* a forked child: the calling thread (its only one) writes nothing of its parent's */
void ct_events_atfork_child(void);

#endif
