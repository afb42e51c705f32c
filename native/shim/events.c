/* events.c - one event, written compactly (native/include/cevent.h: the encoding) into the
 * calling thread's own block of the file (a CEBLOCK record, writer.h's ct_block): no shared
 * write per event, no lock, one release store publishes it.
 *
 * Each thread keeps the context its records are encoded against (its number in the file, its
 * last time and its last event of each class), in thread-local storage. A new file (the first
 * one, or a child's after fork) renumbers the threads: the writer's generation tells a thread
 * its context is stale. The context moves on only with a record placed in the thread's block,
 * so a record the writer could not place leaves the encoding of the next one right.
 *
 * Thread numbers are small and reused: a thread takes the first free one of SMALL_NUMBERS (a
 * slot holds the generation that took it; any other value is free) and gives it back when it
 * exits (a pthread key's destructor), after its last record; past SMALL_NUMBERS threads at once,
 * numbers above it, never reused. Its first record says START, so a reader starts that
 * number's context anew, and keeps as many contexts as threads were alive at once.
 */
#include "events.h"

#include "cevent.h"
#include "util.h"
#include "writer.h"

#include <pthread.h>
#include <string.h>

#define SMALL_NUMBERS 4096
static uint32_t owners[SMALL_NUMBERS]; /* generation that holds the number (atomic) */
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_ok;

/* the thread's block: events are appended at body + used, published by storing used */
#define BLOCK_FIRST 256 /* a thread's first block; each next one twice the last, to BLOCK_MAX */
#define BLOCK_MAX 8192
CT_TLS struct ct_ev_thread ct_ev_tw; /* events.h */

/* thread exit: give the number back (its records are all published by now) */
static void on_thread_exit(void *arg)
{
    (void)arg;
    uint32_t gen = ct_ev_tw.gen;
    ct_block_drop(&ct_ev_tw.block); /* its events are all published */
    if (gen && ct_ev_tw.thread < SMALL_NUMBERS)
        __atomic_compare_exchange_n(&owners[ct_ev_tw.thread], &gen, 0, 0, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);
    ct_ev_tw.gen = 0;
}

static void make_key(void) { key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0; }

static uint32_t take_number(uint32_t gen)
{
    pthread_once(&key_once, make_key);
    if (key_ok && pthread_setspecific(exit_key, (void *)1) == 0) {
        for (uint32_t i = 0; i < SMALL_NUMBERS; i++) {
            uint32_t v = __atomic_load_n(&owners[i], __ATOMIC_ACQUIRE);
            if (v != gen && __atomic_compare_exchange_n(&owners[i], &v, gen, 0, __ATOMIC_ACQ_REL,
                                                        __ATOMIC_RELAXED))
                return i;
        }
    }
    return SMALL_NUMBERS + ct_writer_new_thread(); /* never given back */
}

/* the thread's next block (the last one is full); 0: no trace. A block in another chunk than
 * the thread's last one starts its context anew (START): a reader that lost a chunk (a damaged
 * copy of a sealed one) decodes the thread's events again from its next chunk on. */
static int next_block(void)
{
    uint32_t last = ct_ev_tw.block.p ? ct_ev_tw.block.chunk : UINT32_MAX;
    ct_block_drop(&ct_ev_tw.block);
    uint32_t size = ct_ev_tw.next_size < BLOCK_FIRST ? BLOCK_FIRST : ct_ev_tw.next_size;
    if (!ct_block_take(&ct_ev_tw.block, size, ct_ev_tw.thread, ct_ev_tw.count))
        return 0;
    if (last != UINT32_MAX && ct_ev_tw.block.chunk != last) {
        memset(&ct_ev_tw.ctx, 0, sizeof ct_ev_tw.ctx);
        ct_ev_tw.count = 0;
    }
    ct_ev_tw.next_size = size < BLOCK_MAX ? size * 2 : BLOCK_MAX;
    ct_ev_tw.used = 0;
    ct_ev_tw.room = ct_ev_tw.block.size - (uint32_t)CT_EV_BLOCK_HEAD;
    return 1;
}

int ct_event_write_slow(const struct ct_event *e)
{
    uint32_t gen = ct_writer_generation();
    if (__builtin_expect(!gen, 0)) { /* the first record of the process opens the file */
        ct_writer_open_now();
        gen = ct_writer_generation();
        if (!gen)
            return 0;
    }
    if (ct_ev_tw.gen != gen) { /* a new file (or a forked child's): the old block is not ours */
        memset(&ct_ev_tw.ctx, 0, sizeof ct_ev_tw.ctx);
        ct_ev_tw.block.p = NULL;
        ct_ev_tw.used = ct_ev_tw.room = ct_ev_tw.next_size = ct_ev_tw.count = 0;
        ct_ev_tw.thread = take_number(gen);
        ct_ev_tw.gen = gen;
    }
    if (__builtin_expect(ct_ev_tw.room - ct_ev_tw.used < CT_CE_MAX_BODY, 0) && !next_block())
        return 0;
    uint8_t *at = ct_ev_tw.block.p + CT_EV_BLOCK_HEAD + ct_ev_tw.used;
    /* the context moves on before the store that publishes the event: it is this thread's
     * alone, and the block has room, so the event is published */
    uint8_t *end = ct_ce_write(&ct_ev_tw.ctx, e, at);
    ct_ev_tw.used += (uint32_t)(end - at);
    struct ct_rec_ceblock *bh =
        (struct ct_rec_ceblock *)(ct_ev_tw.block.p + sizeof(struct ct_rec_hdr));
    __atomic_store_n(&bh->used, ct_ev_tw.used, __ATOMIC_RELEASE);
    ct_ev_tw.count++;
    return 1;
}
