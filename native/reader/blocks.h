/* blocks.h - one thread's blocks of events read in turn, whatever their form: compact
 * (CEBLOCK, cevent.h; version 3, and version 4's sealed chunks) or raw (RAWBLOCK, rawevent.h;
 * version 4). The scanner (scan.c), the replay's streams (replay.c) and the sealer's transcoder
 * (transcode.c) decode with these, so they read every block alike. A thread may change form
 * from one chunk to the next (its first block in each chunk starts it anew), so it keeps a
 * context of each. */
#ifndef CUDATRACE_BLOCKS_H
#define CUDATRACE_BLOCKS_H
#include <stdint.h>

#include "cevent.h"
#include "rawevent.h"
#include "trace_format.h"

struct ct_blk_ctx {
    struct ct_ce_ctx ce;
    struct ct_raw_ctx raw;
};

/* A block of the thread begins: its events are p..end; seq and flags from its header (a
 * RAWBLOCK's flags; a CEBLOCK has none). */
static inline void ct_blk_begin(struct ct_blk_ctx *c, int raw, uint32_t seq, uint32_t flags,
                                const uint8_t *p, const uint8_t *end)
{
    if (raw)
        ct_raw_block_begin(&c->raw, seq, flags);
    else
        ct_ce_block_begin(&c->ce, seq, p, end);
}

/* The next event of the block at *pp (before end) into out. 0: malformed, or the thread cannot
 * be decoded further. */
static inline int ct_blk_decode(struct ct_blk_ctx *c, int raw, const uint8_t **pp,
                                const uint8_t *end, struct ct_event *out)
{
    return raw ? ct_raw_decode(&c->raw, pp, end, out) : ct_ce_decode_fields(&c->ce, pp, end, out);
}

/* What ct_blk_decode does to the context and *pp, for a reader that needs the time alone
 * (*ts; *cached: its stack came from the cache, known for raw events only) */
static inline int ct_blk_skip(struct ct_blk_ctx *c, int raw, const uint8_t **pp, const uint8_t *end,
                              uint64_t *ts, int *cached)
{
    if (!raw) {
        *cached = 0;
        return ct_ce_skip_fields(&c->ce, pp, end, ts);
    }
    struct ct_event e;
    if (!ct_raw_decode(&c->raw, pp, end, &e))
        return 0;
    *ts = e.ts_ns;
    *cached = (e.reserved & CT_EV_STACK_CACHED) != 0;
    return 1;
}

#endif
