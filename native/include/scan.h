/* scan.h - the trace scanner's API (native/reader/scan.c, in libcudatrace_tools.so).
 *
 * Python reads the part between the CFFI markers through cffi (cudatrace/native.py). */
#ifndef CUDATRACE_SCAN_H
#define CUDATRACE_SCAN_H
#include <stdint.h>
#include "trace_format.h"

/* CFFI-BEGIN */
/* The trace scanner (native/reader/scan.c), the C half of the Python reader: one pass over a file's
 * records that copies events into an array and notes where every other record starts. */
#define CT_SCAN_CLEAN 0
#define CT_SCAN_TRUNCATED 1
#define CT_SCAN_BAD_HEADER 2
struct ct_scan_result {
    uint64_t n_events;
    uint64_t n_other;
    uint64_t stop_offset; /* where reading ended */
    uint64_t end_offset;  /* offset of the END record, 0 if none */
    uint32_t status;      /* CT_SCAN_* */
    uint32_t gaps;        /* unpublished holes skipped */
    uint64_t gap_bytes;
    uint64_t bad_events; /* compact events that did not decode (skipped) */
    uint64_t threads;    /* compact events: highest thread number + 1 (contexts kept) */
};
/* Pass events=NULL / others=NULL to count only. Returns 0, or -1 on bad arguments. */
int ct_scan(const uint8_t *buf, uint64_t len, struct ct_event *events, uint64_t max_events,
            uint64_t *others, uint64_t max_others, struct ct_scan_result *res);
/* Encode n events as compact records (CT_REC_CEVENT, header included, back to back) into
 * out (cap bytes), event i as written by thread number threads[i] (NULL: all thread 0; the
 * high bit set: a new thread takes that number, its context starts anew).
 * Returns the bytes they take (written only when they fit), all ones when out of memory. */
uint64_t ct_cevent_pack(const struct ct_event *events, uint64_t n, const uint32_t *threads,
                        uint8_t *out, uint64_t cap);
/* Encode n events as event blocks (CT_REC_CEBLOCK records, PAD where a block would cross a
 * chunk) as the shim's writer lays them out, into out (cap bytes), starting at file offset
 * pos; event i written by thread number threads[i] (< nthreads; NULL: all thread 0; the high
 * bit set: a new thread takes that number). state (ct_ceblock_state_size(nthreads) bytes,
 * zeroed once) keeps the threads' contexts from one call to the next; each call closes the
 * blocks it opened. Returns the bytes written, all ones when out is too small or bad args. */
uint64_t ct_ceblock_state_size(uint32_t nthreads);
uint64_t ct_ceblock_pack(const struct ct_event *events, uint64_t n, const uint32_t *threads,
                         uint8_t *state, uint32_t nthreads, uint64_t pos, uint8_t *out,
                         uint64_t cap);
/* CFFI-END */

#endif
