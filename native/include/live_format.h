/* live_format.h - what the shim knows now, readable from inside the traced process.
 *
 * The preload library keeps these counters in its own memory (native/shim/live.c) and exports
 * cudatrace_live(), which sums them into this struct and returns a pointer to it; Python in the
 * traced process reads the struct through cffi (cudatrace/api.py: ffi.dlopen(None) reaches the
 * preloaded library) while the program runs. Version 3: each thread counts on its own (no
 * counter shared by threads is written per allocation while no mark is open), so the struct
 * holds what the last cudatrace_live() call summed: call it before every reading. A call takes
 * the shim's lock a moment (a free in another thread waits that long before its driver call);
 * it never stops a thread otherwise. Each field is one aligned 64-bit word, so a read of one
 * field is whole; fields read one after the other may belong to slightly different calls.
 * Peaks are exact: a row's peak rises by what its live bytes passed it (live.c), in the order
 * the threads' counts changed.
 *
 * Rows: dev[0 .. CT_LIVE_DEVICES-1] are devices 0 to 15 (an unknown device counts in row 0; a
 * device of index 16 or more only in the all-devices row), dev[CT_LIVE_ALL] is every device
 * together (its peak is the peak of the sum, not the sum of the peaks), host is pinned host
 * memory (cuMemHostAlloc ...). Counted: successful allocations of the hooked allocation calls
 * (an import maps memory another process paid for: not counted), ended by their free. A free
 * leaves the counters just before its driver call (a failed one puts it back), an allocation
 * enters them after its call: what is counted is always held by the device (and by the budget
 * ledger), so no peak here exceeds the device's or the budget. cuMemRelease of a cuMemCreate
 * handle that is still mapped ends it at its last cuMemUnmap, when the driver frees it (as the
 * report and the budget do).
 *
 * Marks: a reader opens a mark (cudatrace_live_mark_open) and gets a slot whose peak[] follows
 * the highest live bytes of each row from that moment on (kept current as it rises, live.c),
 * and whose base[] holds what was live when it opened; own[] holds the bytes of the allocations made since it opened that are still
 * live (what was live before it opened and is freed meanwhile does not lower it), own_peak[]
 * the highest own[] since it opened. Closing it frees the slot. CT_LIVE_MARKS may be open at
 * once (any threads). An allocation in flight in another thread at the moment a mark opens or
 * closes may count on either side of it; own[] is signed: read a value below 0 as 0. Keep the
 * CFFI part to plain structs of fixed-width integers and integer #defines (cudatrace/native.py,
 * CFFI_HEADERS). */
#ifndef CUDATRACE_LIVE_FORMAT_H
#define CUDATRACE_LIVE_FORMAT_H
#include <stdint.h>

/* CFFI-BEGIN */
#define CT_LIVE_VERSION 3
#define CT_LIVE_DEVICES 16
/* CT_LIVE_ALL: the row of every device together; CT_LIVE_ROWS = CT_LIVE_DEVICES + 1 */
#define CT_LIVE_ALL 16
#define CT_LIVE_ROWS 17
#define CT_LIVE_MARKS 64
struct ct_live_row {
    uint64_t live;     /* bytes live now */
    uint64_t peak;     /* the highest live since the process started */
    uint64_t allocs;   /* successful allocations */
    uint64_t frees;    /* counted allocations freed */
    uint64_t failures; /* allocations the driver refused */
    uint64_t denials;  /* allocations the budget refused */
};
struct ct_live_mark {
    uint64_t opened_ns;   /* CLOCK_MONOTONIC, as the trace's times */
    uint64_t epoch;       /* allocations of this epoch or later are the mark's own (live.c) */
    uint64_t base[17];    /* live bytes of each row when the mark opened */
    uint64_t peak[17];    /* the highest live bytes of each row since then */
    int64_t own[17];      /* bytes of the allocations made since then, still live */
    int64_t own_peak[17]; /* the highest own since then */
};
struct ct_live_stats {
    uint32_t version;    /* CT_LIVE_VERSION */
    uint32_t active;     /* 1 while the shim counts (a trace or a budget), 0 pass-through */
    uint64_t marks_open; /* bit i: mark slot i is open */
    uint64_t untracked;  /* allocations the shim's table could not hold (not in live) */
    struct ct_live_row dev[17];
    struct ct_live_row host;
    struct ct_live_mark marks[64];
};
/* the counters (never NULL; read .active) */
const struct ct_live_stats *cudatrace_live(void);
/* open a mark: its slot, or -1 when CT_LIVE_MARKS are open */
int cudatrace_live_mark_open(void);
/* close a mark opened by cudatrace_live_mark_open (read its peak first) */
void cudatrace_live_mark_close(int slot);
/* CFFI-END */

#endif
