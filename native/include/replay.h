/* replay.h - the C replay's API (native/reader/replay.c, in libcudatrace_tools.so); the model
 * (cudatrace/analyze/replay/model.py) calls it through cffi, reading the part between the CFFI markers. */
#ifndef CUDATRACE_REPLAY_H
#define CUDATRACE_REPLAY_H
#include <stdint.h>
#include "trace_format.h"
#include "scan.h"

/* CFFI-BEGIN */
#define CT_REPLAY_VERSION 3
#define CT_REPLAY_DEV_SLOTS 64
#define CT_REPLAY_BY_SEQ 0
#define CT_REPLAY_BY_TS 1
/* allocations never freed by their program: live at the end, or when their process ended */
#define CT_REPLAY_NEVER_FREED 2
#define CT_REPLAY_ANY_DEVICE -1000
#define CT_REPLAY_LIST_FAILED 0
#define CT_REPLAY_LIST_DENIED 1
#define CT_REPLAY_LIST_MEMINFO 2
/* ct_live.how: what ended an allocation */
#define CT_END_LIVE 0
#define CT_END_FREE 1
#define CT_END_REUSED 2
#define CT_END_UNMAPPED 3
#define CT_END_EXITED 4 /* its process ended (exit, or exec replaced the image) */

struct ct_replay_trace {
    const struct ct_event *events;
    uint64_t n;
    uint64_t end_ts; /* when its process (image) ended, 0: unknown (still live at the end) */
    /* or, with events NULL, the n events are decoded while the replay goes, never held: the
     * file's bytes and the blocks its scan found (ct_scan_index, streamable) */
    const uint8_t *buf;
    uint64_t len;
    const struct ct_seg *segs;
    uint64_t n_segs;
    uint64_t min_ts, max_ts; /* of its events (ct_scan_index) */
    uint32_t droppable;      /* 1: buf maps a file: pages read may be dropped (they come back) */
    uint32_t reserved;
};

struct ct_replay_config {
    uint64_t device_kinds; /* bit k: CT_KIND k is device memory */
    uint64_t host_kinds;   /* bit k: CT_KIND k is pinned host memory */
    uint32_t buckets;      /* timeline resolution (0: no timeline) */
    uint32_t reserved;
};

struct ct_replay_counts {
    uint64_t events;
    uint64_t allocs;       /* device allocations that succeeded */
    uint64_t frees;        /* frees that ended a device allocation */
    uint64_t failed;       /* allocations that returned an error */
    uint64_t failed_frees; /* frees that returned an error */
    uint64_t denied;       /* refused by the budget before reaching the driver */
    uint64_t host_allocs;
    uint64_t host_frees;
    uint64_t unmatched_frees; /* frees of nothing the trace saw allocated */
    uint64_t null_frees;      /* frees of address 0: no-ops */
    uint64_t reused;          /* allocations at an address still live (old one ended) */
    uint64_t maps;
    uint64_t unmaps;
    uint64_t unmatched_unmaps;
    uint64_t deferred_releases; /* cuMemRelease of a mapped handle: ended at the last unmap */
    uint64_t imports;
    uint64_t unimports;
    uint64_t meminfo;
    uint64_t other;
    uint64_t unsorted_traces;
};

struct ct_replay_summary {
    struct ct_replay_counts c;
    uint64_t t0;         /* first event */
    uint64_t t_end;      /* last event */
    uint64_t peak_bytes; /* highest total of live device bytes */
    uint64_t peak_ts;
    uint64_t peak_seq;  /* merged index of the event that reached it */
    uint64_t end_bytes; /* never freed: live at the end, or when their process ended */
    uint64_t host_peak;
    uint64_t host_peak_ts;
    uint64_t host_end; /* never freed, as end_bytes */
    uint64_t lives;    /* device allocations replayed */
    uint32_t ntraces;
    uint32_t found; /* 1: at least one device allocation */
};

struct ct_replay_device {
    int32_t device; /* -1: unknown */
    uint32_t seen;
    uint64_t allocs;
    uint64_t peak_bytes;
    uint64_t peak_ts;
    uint64_t peak_seq;
    uint64_t end_bytes;
};

struct ct_replay_proc {
    uint64_t events;
    uint64_t allocs;
    uint64_t frees;
    uint64_t failed;
    uint64_t denied;
    uint64_t meminfo;
    uint64_t host_allocs;
    uint64_t peak_bytes; /* this trace's own highest live total */
    uint64_t peak_ts;
    uint64_t end_bytes;
    uint64_t first_ts;
    uint64_t last_ts;
};

/* timeline: changes of the live total inside each of cfg.buckets equal time slices */
struct ct_replay_bucket {
    uint64_t changes; /* 0: nothing happened in this slice */
    uint64_t min, min_ts;
    uint64_t max, max_ts;
    uint64_t last, last_ts;
};

/* one allocation (or listed event), as the queries return it */
struct ct_live {
    struct ct_event ev;
    uint32_t trace;
    uint32_t index;   /* in its trace's event array */
    uint64_t seq;     /* merged index of the event */
    uint64_t end_seq; /* of the event that ended it; all ones: live at the end */
    uint64_t end_ts;  /* all ones: live at the end */
    uint32_t how;     /* CT_END_* */
    uint32_t reserved;
};

/* device allocations over the whole run, per (trace, stack) */
struct ct_stack_total {
    uint32_t trace;
    uint32_t stack;
    uint64_t count;
    uint64_t bytes;
};

/* allocations live at a moment, grouped by (trace, stack, api, rt_api, device) */
struct ct_group {
    uint32_t trace;
    uint32_t stack;
    uint16_t api;
    uint16_t rt_api;
    int32_t device;
    uint64_t count;
    uint64_t bytes;
    uint64_t first_ts;
    uint64_t last_ts;
    uint64_t sizes; /* index of the group's first size in the sizes array */
};

typedef struct ct_replay ct_replay;

/* Replay; NULL when out of memory. The event arrays must outlive the handle. */
ct_replay *ct_replay_run(const struct ct_replay_trace *traces, uint32_t ntraces,
                         const struct ct_replay_config *cfg, struct ct_replay_summary *out);
void ct_replay_free(ct_replay *r);
/* slot 0: device -1 (unknown), slot d+1: device d. 0 when the slot was never seen. */
int32_t ct_replay_device(const ct_replay *r, uint32_t slot, struct ct_replay_device *out);
int32_t ct_replay_proc(const ct_replay *r, uint32_t trace, struct ct_replay_proc *out);
/* the timeline of all devices (device CT_REPLAY_ANY_DEVICE) or one; returns buckets written */
uint32_t ct_replay_timeline(const ct_replay *r, int32_t device, struct ct_replay_bucket *out,
                            uint32_t max);
/* device allocations live after the event of merged index value (by CT_REPLAY_BY_SEQ) or at
 * time value (CT_REPLAY_BY_TS: every event at or before it replayed), on one device or any;
 * CT_REPLAY_NEVER_FREED (value ignored): those never freed (live at the end, or ended with
 * their process).
 * Returns how many there are; writes the first max of them, in allocation order. */
uint64_t ct_replay_select(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                          struct ct_live *out, uint64_t max);
/* the same, only the total bytes and count */
uint64_t ct_replay_live_bytes(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                              uint64_t *count);
/* the allocations ct_replay_select would return, grouped: writes up to max groups (in key
 * order) and every selected allocation's size into sizes (max_sizes: room; a group's sizes are
 * contiguous and ascending). Returns the number of groups, or all ones when out of memory. */
uint64_t ct_replay_groups(const ct_replay *r, uint32_t by, uint64_t value, int32_t device,
                          struct ct_group *out, uint64_t max, uint64_t *sizes, uint64_t max_sizes);
/* traced live bytes at each of n times (ascending; every event at or before a time counted),
 * on one device or any: out[k] for ts[k]. One pass over the lifetimes. */
void ct_replay_bytes_at(const ct_replay *r, const uint64_t *ts, uint64_t n, int32_t device,
                        uint64_t *out);
/* the most traced bytes live at any one moment of each window [lo[k], hi[k]] (lo and hi each
 * ascending; a moment counts what ct_replay_bytes_at would at it), on one device or any: what
 * the trace held while an outside reading (NVML) taken somewhere in the window was made.
 * lo == hi gives ct_replay_bytes_at. Returns 0, or -1 when out of memory (out all zero). */
int32_t ct_replay_bytes_max(const ct_replay *r, const uint64_t *lo, const uint64_t *hi, uint64_t n,
                            int32_t device, uint64_t *out);
/* every device allocation, freed or not (lifetimes) */
uint64_t ct_replay_all(const ct_replay *r, struct ct_live *out, uint64_t max);
/* distinct (trace, stack) pairs of device allocations with their totals over the run; returns
 * how many there are, writes the first max (in order of first appearance) */
uint64_t ct_replay_stack_totals(const ct_replay *r, struct ct_stack_total *out, uint64_t max);
/* failed allocations, denials, memory queries (CT_REPLAY_LIST_*) */
uint64_t ct_replay_list(const ct_replay *r, uint32_t which, struct ct_live *out, uint64_t max);
/* CFFI-END */

#endif
