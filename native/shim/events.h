/* events.h - writing one event (events.c): compact records (cevent.h), a context per thread. */
#ifndef CUDATRACE_EVENTS_H
#define CUDATRACE_EVENTS_H

#include <stdint.h>

#include "trace_format.h"

/* Write e as a CT_REC_CEVENT record. 0: not written (no trace, or the file could not grow). */
int ct_event_write(const struct ct_event *e);

#endif
