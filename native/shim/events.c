/* events.c - one event, written raw (native/include/rawevent.h: the record) into the calling
 * thread's own block of the file (a RAWBLOCK record, writer.h's ct_block): no shared write per
 * event, no lock, one release store publishes it.
 *
 * Each thread keeps what its short records are compared with (its references: the last full
 * record of each API) and its last time, in thread-local storage. They start anew (START) in
 * the thread's first block of the file and of each chunk, so every chunk reads on its own. A
 * new file (the first one, or a child's after fork) renumbers the threads: the writer's
 * generation tells a thread its state is stale. The state moves on only with a record placed
 * in the thread's block, so a record the writer could not place leaves the next one right.
 *
 * Thread numbers are small and reused: a thread takes the first free one of SMALL_NUMBERS (a
 * slot holds the generation that took it; any other value is free) and gives it back when it
 * exits (a pthread key's destructor), after its last record; past SMALL_NUMBERS threads at once,
 * numbers above it, never reused. Its first block says START, so a reader starts that
 * number's context anew, and keeps as many contexts as threads were alive at once.
 */
#include "events.h"

#include "rawevent.h"
#include "util.h"
#include "writer.h"

#include <pthread.h>
#include <string.h>

#define SMALL_NUMBERS 4096
static uint32_t owners[SMALL_NUMBERS]; /* generation that holds the number (atomic) */
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int key_ok;

/* the threads that wrote to the open file (their totals: the END record's count), and what
 * the ones that exited wrote */
static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ct_ev_thread *writers;
static uint64_t retired;

/* the thread's block: records are appended at body + used, published by storing used */
#define BLOCK_FIRST 256 /* a thread's first block; each next one twice the last, to BLOCK_MAX */
#define BLOCK_MAX 8192
CT_TLS struct ct_ev_thread ct_ev_tw; /* events.h */

static void unlist(struct ct_ev_thread *tw)
{
    pthread_mutex_lock(&list_mu);
    for (struct ct_ev_thread **p = &writers; *p; p = &(*p)->next)
        if (*p == tw) {
            *p = tw->next;
            retired += tw->before + __atomic_load_n(&tw->count, __ATOMIC_RELAXED);
            break;
        }
    tw->next = NULL;
    pthread_mutex_unlock(&list_mu);
}

/* thread exit: give the number back (its records are all published by now) */
static void on_thread_exit(void *arg)
{
    (void)arg;
    uint32_t gen = ct_ev_tw.gen;
    ct_block_drop(&ct_ev_tw.block); /* its events are all published */
    if (gen && ct_ev_tw.thread < SMALL_NUMBERS)
        __atomic_compare_exchange_n(&owners[ct_ev_tw.thread], &gen, 0, 0, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);
    if (gen)
        unlist(&ct_ev_tw);
    ct_ev_tw.gen = 0;
    ct_ev_tw.used = ct_ev_tw.room = 0; /* a late event (another key's destructor) starts anew */
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

uint64_t ct_events_total(void)
{
    pthread_mutex_lock(&list_mu);
    uint64_t n = retired;
    for (struct ct_ev_thread *t = writers; t; t = t->next)
        n += __atomic_load_n(&t->before, __ATOMIC_RELAXED) +
             __atomic_load_n(&t->count, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&list_mu);
    return n;
}

void ct_events_atfork_child(void)
{
    /* the parent's threads are not here; this one's block is in the parent's file */
    memset(&ct_ev_tw, 0, sizeof ct_ev_tw);
    writers = NULL;
    retired = 0;
    pthread_mutex_init(&list_mu, NULL);
}

/* the thread's next block (the last one is full); 0: no trace. A block in another chunk than
 * the thread's last one starts its context anew (START): a reader that lost a chunk (a damaged
 * copy of a sealed one) decodes the thread's events again from its next chunk on. */
static int next_block(void)
{
    struct ct_ev_thread *tw = &ct_ev_tw;
    uint32_t last = tw->block.p ? tw->block.chunk : UINT32_MAX;
    ct_block_drop(&tw->block);
    uint32_t size = tw->next_size < BLOCK_FIRST ? BLOCK_FIRST : tw->next_size;
    tw->used = tw->room = 0;
    if (!ct_block_take(&tw->block, size, tw->thread, tw->count, last))
        return 0;
    if (tw->block.start) {
        memset(&tw->w, 0, sizeof tw->w);
        __atomic_store_n(&tw->before, tw->before + tw->count, __ATOMIC_RELAXED);
        __atomic_store_n(&tw->count, 0, __ATOMIC_RELAXED);
    }
    tw->next_size = size < BLOCK_MAX ? size * 2 : BLOCK_MAX;
    tw->room = tw->block.size - (uint32_t)CT_EV_BLOCK_HEAD;
    return 1;
}

/* the calling thread's state for the open file (generation gen): a new file's is made anew */
static void join_file(uint32_t gen)
{
    struct ct_ev_thread *tw = &ct_ev_tw;
    if (tw->gen && tw->next)
        unlist(tw); /* (never: a thread's file changes only in a forked child) */
    tw->block.p = NULL;
    tw->used = tw->room = tw->next_size = tw->count = 0;
    tw->before = 0;
    tw->thread = take_number(gen);
    tw->gen = gen;
    pthread_mutex_lock(&list_mu);
    tw->next = writers;
    writers = tw;
    pthread_mutex_unlock(&list_mu);
}

int ct_event_write_slow(const struct ct_event *e)
{
    struct ct_ev_thread *tw = &ct_ev_tw;
    uint32_t gen = ct_writer_generation();
    if (__builtin_expect(!gen, 0)) { /* the first record of the process opens the file */
        ct_writer_open_now();
        gen = ct_writer_generation();
        if (!gen)
            return 0;
    }
    if (tw->gen != gen) /* a new file (or a forked child's): the old block is not ours */
        join_file(gen);
    if (tw->room - tw->used < CT_RAW_MAX && !next_block())
        return 0;
    uint8_t *at = tw->block.p + CT_EV_BLOCK_HEAD + tw->used;
    uint32_t n = ct_raw_encode(&tw->w, e, ct_gettid(), at);
    /* the state moves on before the store that publishes the record: it is this thread's
     * alone, and the block has room, so the record is published */
    tw->used += n;
    __atomic_store_n((uint32_t *)(void *)(tw->block.p + sizeof(struct ct_rec_hdr)), tw->used,
                     __ATOMIC_RELEASE);
    __atomic_store_n(&tw->count, tw->count + 1, __ATOMIC_RELAXED);
    return 1;
}
