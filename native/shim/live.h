/* live.h - the live counters a program reads about itself (live.c; the layout and the exported
 * reader API: native/include/live_format.h). The one call protocol (shim.c) tells them each
 * allocation, free and denial; the table of live addresses they need to end an allocation at its
 * free is lock-free, so neither a reader nor another allocating thread is ever waited on. */
#ifndef CUDATRACE_LIVE_H
#define CUDATRACE_LIVE_H

#include <stdint.h>

#include "live_format.h"

/* the shim counts from now on (load, after the settings are read) */
void ct_live_start(void);
/* an allocation call returned: counted when it succeeded (result 0) and space is not 0 */
void ct_live_alloc(int kind, int space, int dev, uint64_t addr, uint64_t size, int result);
/* a free call returned successfully: ends the allocation at (space, addr) if counted, and
 * returns the device it was counted on (-1 for pinned host memory), CT_LIVE_UNKNOWN if it was
 * not counted */
#define CT_LIVE_UNKNOWN (-2)
int ct_live_free(int space, uint64_t addr);
/* the budget refused an allocation on dev */
void ct_live_deny(int dev);
/* a new process after fork: nothing of the parent's counts */
void ct_live_atfork_child(void);

#endif
