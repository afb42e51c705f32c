/* replay_table.h - the table of what is live during the replay (replay.c alone includes it):
 * (trace, state, space, address) -> an index, open addressing with linear probing and
 * backward-shift deletion, in pages mapped as it grows. Its functions are static inline: the
 * replay's speed is bound by these lookups, and they stay inlined into its rules. */
#ifndef CT_REPLAY_TABLE_H
#define CT_REPLAY_TABLE_H

#include <stdint.h>
#include <sys/mman.h>

#include "replay_model.h" /* mix */

/* The table of what is live: (trace, space, address) -> an index into lives (device memory),
 * hosts (pinned host memory) or maps (VMM mappings). 16 bytes a slot, open addressing with
 * linear probing and backward-shift deletion (no tombstones). The replay's speed is bound by
 * its cache misses, so a slot holds only the key and the index; a free's other needs (size,
 * device) are in its life record, which the free writes anyway. */
struct slot {
    uint64_t addr;
    uint32_t ref;
    uint32_t tag; /* trace << 10 | state << 8 | space; 0: empty */
};
#define TAG(trace, state, space)                                                                   \
    ((uint32_t)(trace) << 10 | (uint32_t)(state) << 8 | (uint32_t)(space))
#define TAG_KEY(tag) ((tag) & ~0x300u)
#define TAG_STATE(tag) (((tag) >> 8) & 3u)
#define TAG_TRACE(tag) ((tag) >> 10)

struct table {
    struct slot *s;
    uint64_t cap, used;
    size_t bytes; /* of the mapping */
};

/* index of the key's slot, or of the empty slot where it would go */
static inline uint64_t tfind(const struct table *t, uint32_t key, uint64_t addr)
{
    uint64_t mask = t->cap - 1, i = mix(key, addr) & mask;
    for (;;) {
        const struct slot *s = &t->s[i];
        if (!s->tag || (s->addr == addr && TAG_KEY(s->tag) == key))
            return i;
        i = (i + 1) & mask;
    }
}

static inline struct slot *slots_alloc(uint64_t n, size_t *bytes)
{
    *bytes = n * sizeof(struct slot);
    void *p = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    return p; /* zero-filled */
}

static inline int tgrow(struct table *t)
{
    uint64_t nc = t->cap ? t->cap * 2 : 4096;
    struct slot *old = t->s;
    uint64_t oc = t->cap;
    size_t ob = t->bytes, nb;
    struct slot *s = slots_alloc(nc, &nb);
    if (!s)
        return -1;
    t->s = s;
    t->cap = nc;
    t->bytes = nb;
    for (uint64_t i = 0; i < oc; i++)
        if (old[i].tag)
            s[tfind(t, TAG_KEY(old[i].tag), old[i].addr)] = old[i];
    if (old)
        munmap(old, ob);
    return 0;
}

static inline void tfree(struct table *t)
{
    if (t->s)
        munmap(t->s, t->bytes);
    t->s = NULL;
}

/* the slot of the key, new (tag 0) when there was none; NULL when out of memory */
static inline struct slot *tput(struct table *t, uint32_t key, uint64_t addr)
{
    if ((t->used + 1) * 2 > t->cap && tgrow(t) != 0)
        return NULL;
    struct slot *s = &t->s[tfind(t, key, addr)];
    if (!s->tag) {
        s->addr = addr;
        s->ref = 0;
        t->used++;
    }
    return s;
}

static inline struct slot *tget(const struct table *t, uint32_t key, uint64_t addr)
{
    if (!t->cap)
        return NULL;
    struct slot *s = &t->s[tfind(t, key, addr)];
    return s->tag ? s : NULL;
}

/* delete with backward shift */
static inline void tdel(struct table *t, struct slot *s)
{
    uint64_t mask = t->cap - 1, i = (uint64_t)(s - t->s), j = i;
    for (;;) {
        j = (j + 1) & mask;
        struct slot *sj = &t->s[j];
        if (!sj->tag)
            break;
        uint64_t k = mix(TAG_KEY(sj->tag), sj->addr) & mask;
        int move = (i <= j) ? (k <= i || k > j) : (k <= i && k > j);
        if (move) {
            t->s[i] = *sj;
            i = j;
        }
    }
    t->s[i].tag = 0;
    t->used--;
}

#endif
