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
/* A thread's own block of raw events: a RAWBLOCK record of size bytes (header and struct
 * ct_rec_rawblock filled and published), kept mapped until ct_block_drop. It starts the
 * thread's context anew (CT_RAWB_START, b->start) when it is not in chunk last_chunk (the
 * thread's last block's; UINT32_MAX: none), else it follows on with seq. 0: no trace. */
typedef struct {
    uint8_t *p; /* the record (header) */
    uint32_t chunk, size, gen, start;
} ct_block;
int ct_block_take(ct_block *b, uint32_t size, uint32_t thread, uint32_t seq, uint32_t last_chunk);
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
/* CT_SC_*: header counters, in the mapped file: a full unwind, and with
 * CUDATRACE_STACK_VERIFY the checks; a cached stack only under --aggregate (a written event says
 * it itself: CT_EV_STACK_CACHED) */
void ct_writer_stack_count(int which);
extern CT_HIDDEN struct ct_file_header *ct_writer_stats_hdr;
extern CT_HIDDEN int ct_writer_state; /* 1: the file is open */
/* the events --aggregate took in (the END record counts them with ct_writer_set_counter's) */
extern CT_HIDDEN uint64_t ct_events_written;
/* what tells the END record how many events the file holds (events.c, set once at load) */
void ct_writer_set_counter(uint64_t (*fn)(void));

#endif
