/* pyframes.c: the Python stack of the calling thread, read as data (docs/python-frames.md). */
#ifndef CT_PYFRAMES_H
#define CT_PYFRAMES_H

#include <stdint.h>

/* The link node's ip for this event (trace_format.h CT_PYLINK_*), 0 when the process has no
 * Python */
uint64_t ct_py_capture(void);
void ct_py_detect(void);          /* at start-up: find the interpreter before threads race */
void ct_py_modules_changed(void); /* new modules mapped: look for the interpreter again */
void ct_py_atfork_prepare(void);
void ct_py_atfork_parent(void);
void ct_py_reset(void); /* child after fork */

#endif
