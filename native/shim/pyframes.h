/* pyframes.c: the Python stack of the calling thread, read as data (docs/python-frames.md). */
#ifndef CT_PYFRAMES_H
#define CT_PYFRAMES_H

#include <stdint.h>

/* The link node's ip for this event (trace_format.h CT_PYLINK_*), 0 when the process has no
 * Python. Inline: a process that is not Python pays two loads. */
struct pyrt;
extern __attribute__((visibility("hidden"))) struct pyrt *ct_py_rt;   /* the interpreter, found */
extern __attribute__((visibility("hidden"))) int ct_py_modules_dirty; /* look for it again */
uint64_t ct_py_capture_now(void);
/* 0: the process has no interpreter (found none, and no module mapped since it looked) */
static inline int ct_py_maybe(void)
{
    return __atomic_load_n(&ct_py_rt, __ATOMIC_ACQUIRE) ||
           __atomic_load_n(&ct_py_modules_dirty, __ATOMIC_RELAXED);
}
static inline uint64_t ct_py_capture(void) { return ct_py_maybe() ? ct_py_capture_now() : 0; }
void ct_py_detect(void);          /* at start-up: find the interpreter before threads race */
void ct_py_modules_changed(void); /* new modules mapped: look for the interpreter again */
void ct_py_atfork_prepare(void);
void ct_py_atfork_parent(void);
void ct_py_reset(void); /* child after fork */

#endif
