/* writer.h - the trace file, an mmap'd append-only sink (writer.c). */
#ifndef CUDATRACE_WRITER_H
#define CUDATRACE_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "trace_format.h"
#include "util.h"

typedef struct {
    uint8_t *p; /* record start (header) */
    uint32_t size;
    uint32_t chunk;
} ct_slot;

/* Called (under the writer lock, by the thread that opened it) right after a new file is
 * opened, to write its opening records; it may call ct_rec_write. Set once at load. */
typedef void (*ct_preamble_fn)(void);
void ct_writer_set_preamble(ct_preamble_fn fn);

/* Reserve size bytes (a multiple of 8, header included). 0: no trace (disabled or full). */
int ct_rec_begin(ct_slot *s, uint32_t size);
/* Publish the header: the record becomes visible to readers in one store. */
void ct_rec_commit(ct_slot *s, uint16_t type);
/* Write a whole record whose body is given in up to three parts. */
int ct_rec_write(uint16_t type, const void *a, size_t na, const void *b, size_t nb, const void *c,
                 size_t nc);
/* A thread's own block of compact events: a CEBLOCK record of size bytes (header and struct
 * ct_rec_ceblock filled and published), kept mapped until ct_block_drop. 0: no trace. */
typedef struct {
    uint8_t *p; /* the record (header) */
    uint32_t chunk, size, gen;
} ct_block;
int ct_block_take(ct_block *b, uint32_t size, uint32_t thread, uint32_t seq);
void ct_block_drop(ct_block *b); /* done with it: its chunk may be unmapped */
void ct_writer_close(int exit_code);
void ct_writer_atfork_prepare(void);
void ct_writer_atfork_parent(void);
void ct_writer_atfork_child(void);
void ct_writer_open_now(void);
/* the open file's generation (0: none): a thread's compact-event context is valid only for
 * the generation it was made in (events.c) */
extern CT_HIDDEN uint32_t ct_writer_gen; /* written by writer.c alone */
static inline uint32_t ct_writer_generation(void)
{
    return __atomic_load_n(&ct_writer_gen, __ATOMIC_ACQUIRE);
}
uint32_t ct_writer_new_thread(void); /* the next thread number of the open file */
uint64_t ct_writer_pos(void);        /* the next free byte of the file */
/* CT_SC_*: header counters, in the mapped file (a hit, on every repeated stack, is inline) */
void ct_writer_stack_count_slow(int which);
extern CT_HIDDEN struct ct_file_header *ct_writer_stats_hdr;
extern CT_HIDDEN int ct_writer_state; /* 1: the file is open */
static inline void ct_writer_stack_count(int which)
{
    struct ct_file_header *h = __atomic_load_n(&ct_writer_stats_hdr, __ATOMIC_ACQUIRE);
    if (which == CT_SC_HIT && h && __atomic_load_n(&ct_writer_state, __ATOMIC_RELAXED) == 1)
        __atomic_add_fetch(&h->stack_cache_hits, 1, __ATOMIC_RELAXED);
    else
        ct_writer_stack_count_slow(which);
}
extern CT_HIDDEN uint64_t ct_events_written;

#endif
