/* events.c - one event, written as a compact record (native/include/cevent.h: the encoding).
 *
 * Each thread keeps the context its records are encoded against (its number in the file, its
 * last time and its last event of each class), in thread-local storage. A new file (the first
 * one, or a child's after fork) renumbers the threads: the writer's generation tells a thread
 * its context is stale. The context moves on only once a record is published, so a record the
 * writer could not place leaves the encoding of the next one right.
 */
#include "events.h"

#include "cevent.h"
#include "util.h"
#include "writer.h"

#include <string.h>

static CT_TLS struct ct_ce_ctx tls_ctx;
static CT_TLS uint32_t tls_gen; /* writer generation tls_ctx belongs to (0: none) */
static CT_TLS uint32_t tls_thread;

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
        tls_thread = ct_writer_new_thread();
        tls_gen = gen;
    }
    uint32_t n = ct_ce_encode(&tls_ctx, tls_thread, e, body);
    ct_slot s;
    if (!ct_rec_begin(&s, (uint32_t)sizeof(struct ct_rec_hdr) + n))
        return 0;
    uint8_t *p = s.p + sizeof(struct ct_rec_hdr);
    memcpy(p, body, n);
    memset(p + n, 0, s.size - sizeof(struct ct_rec_hdr) - n);
    ct_rec_commit(&s, CT_REC_CEVENT);
    ct_ce_commit(&tls_ctx, e, ct_ce_ref(&tls_ctx, e));
    return 1;
}
