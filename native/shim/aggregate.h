/* aggregate.h - --aggregate (aggregate.c): totals, live set and peaks in the process, written as
 * snapshots rewritten in place (trace_format.h: struct ct_snap_*), so disk use stays bounded. */
#ifndef CUDATRACE_AGGREGATE_H
#define CUDATRACE_AGGREGATE_H

#include <stdint.h>

#include "trace_format.h"

/* one hooked call's event, in place of writing it; returns 1 when it was counted */
int ct_agg_event(const struct ct_event *e);
/* a free about to be called (before the driver can hand its memory to anyone): the allocation
 * stops counting now; the free's event settles it (a failed free counts it again) */
void ct_agg_freeing(uint8_t space, uint64_t addr);
void ct_agg_final(void); /* the last snapshot (exit) */
void ct_agg_atfork_prepare(void);
void ct_agg_atfork_parent(void);
void ct_agg_atfork_child(void); /* a new process: nothing of the parent's counts */

#endif
