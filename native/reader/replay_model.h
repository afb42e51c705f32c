/* replay_model.h - what the replay's pass (replay.c) writes and its queries (replay_query.c)
 * read: the lives of device allocations, their rests, the listed events, the run's devices,
 * processes and timelines. Private to native/reader (the API is native/include/replay.h). */
#ifndef CT_REPLAY_MODEL_H
#define CT_REPLAY_MODEL_H
#include <stdint.h>
#include "replay.h"

#define NONE64 UINT64_MAX
/* between the files of the reader, never exported from the tools library */
#define CT_REPLAY_PRIVATE __attribute__((visibility("hidden")))

/* One device allocation: 56 bytes, for millions of them. The fields of its event other than
 * the time, size and address (trace, stack, API, device, thread...) repeat: they are kept once,
 * in the table of "rests" (struct rest), and the life holds their number. What ended it
 * (CT_END_*) is in the parallel array hows; a VMM handle's mappings in vmm (when there are). */
struct life {
    uint64_t seq, end_seq, ts, end_ts, size, addr;
    uint32_t idx, rest;
};

/* an event without its time, size and address (the words of a struct ct_event, those zero),
 * and its trace */
struct rest {
    union {
        struct ct_event ev;
        uint64_t key[9];
    };
    uint32_t trace, pad;
};
/* a listed event (failed, denied, memory query), whole */
struct listed {
    uint64_t seq;
    uint32_t trace, idx;
    struct ct_event ev;
};

struct vec {
    void *p;
    uint64_t n, cap;
    size_t elem;
    int mapped; /* p is a mapping (vec_map): grown in place, never copied */
};

struct ct_replay {
    uint32_t ntraces;
    const struct ct_event **ev; /* per trace (an array source; the replay's time only) */
    uint64_t *nev;
    uint32_t **order; /* per trace: NULL (in time order) or a sorted permutation */
    struct vec lives, failed, denied, meminfo;
    struct vec hows; /* uint8_t per life: CT_END_* */
    uint32_t *vmm;   /* per life: mappings | VMM_RELEASED; NULL until a VMM handle is seen */
    uint64_t vmm_cap;
    struct vec rests; /* struct rest */
    uint32_t *rhash;  /* rests by their fields: index + 1, 0 empty */
    uint64_t rhash_cap;
    struct ct_replay_device dev[CT_REPLAY_DEV_SLOTS];
    uint64_t dev_cur[CT_REPLAY_DEV_SLOTS];
    struct ct_replay_proc *proc;
    uint32_t buckets;
    uint64_t t0, span;
    uint64_t sl_i, sl_lo, sl_hi; /* changed(): the slice of times [sl_lo, sl_hi) */
    struct ct_replay_bucket *tl_all;
    struct ct_replay_bucket *tl_dev[CT_REPLAY_DEV_SLOTS];
    int oom;
};

static inline uint64_t mix(uint32_t key, uint64_t addr)
{
    uint64_t h = addr ^ ((uint64_t)key * 0x9E3779B97F4A7C15ull);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static inline uint32_t dev_slot(int32_t d)
{
    if (d < -1)
        return 0;
    if (d >= CT_REPLAY_DEV_SLOTS - 1)
        return CT_REPLAY_DEV_SLOTS - 1;
    return (uint32_t)(d + 1);
}

static inline struct life *life_at(const ct_replay *r, uint64_t li)
{
    return &((struct life *)r->lives.p)[li];
}

static inline const struct rest *rest_at(const ct_replay *r, uint32_t ri)
{
    return &((const struct rest *)r->rests.p)[ri];
}

static inline int32_t life_dev(const ct_replay *r, const struct life *L)
{
    return rest_at(r, L->rest)->ev.device;
}

static inline uint8_t *how_at(const ct_replay *r, uint64_t li)
{
    return &((uint8_t *)r->hows.p)[li];
}

/* LSD radix sort of n values (tmp: room for n) (replay_query.c) */
CT_REPLAY_PRIVATE void ct_replay_radix_u64(uint64_t *a, uint64_t *tmp, uint64_t n);

#endif
