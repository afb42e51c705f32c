/* events.c - one event, written as a compact record (native/include/cevent.h: the encoding).
 *
 * Each thread keeps the context its records are encoded against (its number in the file, its
 * last time and its last event of each class), in thread-local storage. A new file (the first
 * one, or a child's after fork) renumbers the threads: the writer's generation tells a thread
 * its context is stale. The context moves on only once a record is published, so a record the
 * writer could not place leaves the encoding of the next one right.
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

static CT_TLS struct ct_ce_ctx tls_ctx;
static CT_TLS uint32_t tls_gen; /* writer generation tls_ctx belongs to (0: none) */
static CT_TLS uint32_t tls_thread;

/* thread exit: give the number back (its records are all published by now) */
static void on_thread_exit(void *arg)
{
    (void)arg;
    uint32_t gen = tls_gen;
    if (gen && tls_thread < SMALL_NUMBERS)
        __atomic_compare_exchange_n(&owners[tls_thread], &gen, 0, 0, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);
    tls_gen = 0;
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

int ct_event_write(const struct ct_event *e)
{
    uint8_t body[CT_CE_MAX_BODY];
    uint32_t gen = ct_writer_generation();
    if (__builtin_expect(!gen, 0)) { /* the first record of the process opens the file */
        ct_writer_open_now();
        gen = ct_writer_generation();
        if (!gen)
            return 0;
    }
    if (tls_gen != gen) {
        memset(&tls_ctx, 0, sizeof tls_ctx);
        tls_thread = take_number(gen);
        tls_gen = gen;
    }
    uint32_t ref;
    uint32_t n = ct_ce_encode(&tls_ctx, tls_thread, e, body, &ref);
    ct_slot s;
    if (!ct_rec_begin(&s, (uint32_t)sizeof(struct ct_rec_hdr) + n))
        return 0;
    /* the padding (under 8 bytes) is zero: clear the record's last word, then copy */
    __builtin_memset(s.p + s.size - 8, 0, 8);
    memcpy(s.p + sizeof(struct ct_rec_hdr), body, n);
    ct_rec_commit(&s, CT_REC_CEVENT);
    ct_ce_commit(&tls_ctx, e, ref);
    return 1;
}
