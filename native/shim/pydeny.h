/* pydeny.h - the code a denial names when Python code made the call (pydeny.c): the Python
 * line the reports name (docs/python-frames.md), or that the frames could not be read. */
#ifndef CUDATRACE_PYDENY_H
#define CUDATRACE_PYDENY_H

#include <stddef.h>
#include <stdint.h>

/* ips[0..n): the denied call's frames outside CUDA, innermost first. When the calling thread
 * runs Python code (its frames, or the interpreter among ips), writes into out either
 *   `SITE (file.py:line) via OUTER > ... > INNER, called from CALLER (file.py:line) <- ...`
 * or `Python code whose frames the shim could not read (WHY); raw native location, not the
 * site: INNER (module+0xoff) <- ... <- _PyEval_EvalFrameDefault` and returns 1; 0 (out
 * untouched) when the call did not come from Python: the native rules apply (deny.c). */
int ct_pydeny_describe(const uintptr_t *ips, int n, char *out, size_t cap);

#endif
