/* events.h - writing one event (events.c): compact records (cevent.h), a context per thread.
 * The common case (a repeated call site, room in the thread's block, the same file) is inline:
 * the caller's own code encodes and publishes the event; anything else goes to events.c. */
#ifndef CUDATRACE_EVENTS_H
#define CUDATRACE_EVENTS_H

#include <stdint.h>

#include "cevent.h"
#include "trace_format.h"
#include "util.h"
#include "writer.h"

/* the thread's writing state, one thread-local object (one TLS offset to load, not eight);
 * events.c alone changes it outside ct_event_write's inline path */
#define CT_EV_BLOCK_HEAD (sizeof(struct ct_rec_hdr) + sizeof(struct ct_rec_ceblock))
struct ct_ev_thread {
    struct ct_ce_ctx ctx; /* what the next record is encoded against */
    uint32_t gen;         /* writer generation ctx belongs to (0: none) */
    uint32_t thread;      /* the thread's number in the file */
    uint32_t count;       /* the thread's events in this file */
    uint32_t used, room, next_size;
    ct_block block;
};
extern CT_HIDDEN CT_TLS struct ct_ev_thread ct_ev_tw;

/* the general case of ct_event_write (events.c) */
int ct_event_write_slow(const struct ct_event *e);

/* Write e as a compact event into the thread's block. 0: not written (no trace, or the file
 * could not grow). */
static inline __attribute__((always_inline)) int ct_event_write(const struct ct_event *e)
{
    struct ct_ev_thread *tw = &ct_ev_tw;
    uint32_t gen = ct_writer_generation();
    if (__builtin_expect(gen != 0 && tw->gen == gen && tw->room - tw->used >= CT_CE_MAX_BODY, 1)) {
        uint8_t *at = tw->block.p + CT_EV_BLOCK_HEAD + tw->used;
        uint8_t *end = ct_ce_encode_repeat(&tw->ctx, e, at);
        if (__builtin_expect(end != NULL, 1)) {
            tw->used += (uint32_t)(end - at);
            struct ct_rec_ceblock *bh =
                (struct ct_rec_ceblock *)(tw->block.p + sizeof(struct ct_rec_hdr));
            __atomic_store_n(&bh->used, tw->used, __ATOMIC_RELEASE);
            tw->count++;
            return 1;
        }
    }
    return ct_event_write_slow(e);
}

#endif
