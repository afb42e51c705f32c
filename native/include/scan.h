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
    uint64_t bad_events;   /* compact or raw events that did not decode (skipped) */
    uint64_t threads;      /* compact or raw events: highest thread number + 1 (contexts kept) */
    uint64_t stack_cached; /* events whose stack came from the unwinder's cache (version 4) */
};
/* One block of one thread's events (CEBLOCK, compact; RAWBLOCK, raw), as the scan found it: what
 * the replay needs to decode the thread's events again, in the same way, without holding them. */
struct ct_seg {
    uint64_t off;   /* file offset of its first event */
    uint64_t first; /* index of its first event in the trace (file order) */
    uint32_t len;   /* bytes of events published when the scan read it */
    uint32_t thread;
    uint32_t seq;   /* the block header's seq */
    uint32_t count; /* events decoded from it */
    uint32_t next;  /* the thread's next block (index in the array), all ones: none */
    uint32_t bad;   /* 1: decoding stopped at a malformed event after count */
    uint32_t raw;   /* 1: a RAWBLOCK (rawevent.h), 0: a CEBLOCK (cevent.h) */
    uint32_t flags; /* a RAWBLOCK's flags (CT_RAWB_*) */
};
/* The scan of a file, with its blocks (ct_scan_index): every array allocated by it. */
struct ct_scan_index {
    struct ct_scan_result res;
    uint64_t *others; /* res.n_other offsets of the records other than events */
    struct ct_seg *segs;
    uint64_t n_segs;
    uint32_t streamable; /* 1: every event is in a block and each thread's are in time order:
                            the replay can decode them as it goes (ct_replay_trace.segs) */
    uint32_t reserved;
    uint64_t min_ts, max_ts; /* of the events decoded (0, 0: none) */
};
/* One pass: counts, other records, blocks. NULL when out of memory or on bad arguments; free
 * it with ct_scan_index_free. */
struct ct_scan_index *ct_scan_index(const uint8_t *buf, uint64_t len);
void ct_scan_index_free(struct ct_scan_index *ix);
/* A read-only private mapping of len bytes of the open file fd (the fd may be closed after);
 * NULL on failure. ct_unmap releases it. */
void *ct_map_file(int fd, uint64_t len);
void ct_unmap(void *p, uint64_t len);
/* One part of ct_map_parts: bytes [off, off + len) of the file fd, at the same offset. */
struct ct_map_part {
    uint64_t off; /* a multiple of the page size */
    uint64_t len;
    int32_t fd;
    uint32_t reserved;
};
/* len bytes read-only: the parts mapped from their files, zeros elsewhere (anonymous: a hole of
 * the file is never read); NULL on failure. ct_unmap(p, len) releases it all. */
void *ct_map_parts(uint64_t len, const struct ct_map_part *parts, uint64_t n);
/* 1: a process holds a lock on byte 0 of the open file fd (the shim's writer holds a read lock
 * on its trace while it lives, CT_FH_LIVE_LOCK), 0: none, -1: cannot tell. */
int ct_file_locked(int fd);
/* The end of the last whole record at or after from in buf (len bytes, records from `from` on,
 * holes skipped as the scan does): where a file's data ends. from if there is none. */
uint64_t ct_scan_used(const uint8_t *buf, uint64_t len, uint64_t from);
/* The distinct devices of a file's successful allocations of the kinds device_kinds (bit k:
 * CT_KIND k), decoded without holding the events: returns how many, writes the first max. */
uint64_t ct_scan_alloc_devices(const uint8_t *buf, uint64_t len, uint64_t device_kinds,
                               int32_t *out, uint64_t max);
/* Its pages out of memory (read again from the file when next touched). */
void ct_drop_pages(void *p, uint64_t len);
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
/* The same as raw blocks (CT_REC_RAWBLOCK, format version 4) as the shim's writer lays them out,
 * encoded by its encoder (rawevent.h); state: ct_rawblock_state_size(nthreads) bytes, zeroed
 * once. */
uint64_t ct_rawblock_state_size(uint32_t nthreads);
uint64_t ct_rawblock_pack(const struct ct_event *events, uint64_t n, const uint32_t *threads,
                          uint8_t *state, uint32_t nthreads, uint64_t pos, uint8_t *out,
                          uint64_t cap);
/* A sealed chunk (len bytes at in, a chunk of a version 4 trace other than the first) with its
 * raw events rewritten as compact ones into out (len bytes): the same records in the same order,
 * each RAWBLOCK a CEBLOCK of the same events, zeros after them (native/reader/transcode.c).
 * Returns where out's records end, 0 when the chunk is to be kept as it is. */
uint64_t ct_chunk_compact(const uint8_t *in, uint64_t len, uint8_t *out);
/* CFFI-END */

#endif
