/* deny.h - the code a budget denial names, at the moment (deny.c): the boundary rule of
 * cudatrace/analyze/sites/layers.py in its cheap form, over the frames of the denied call. */
#ifndef CUDATRACE_DENY_H
#define CUDATRACE_DENY_H

#include <stddef.h>
#include <stdint.h>

/* ips[0..n): the denied call's frames outside CUDA, innermost first. Writes into out either
 *   `SITE (module+0xoff) via OUTER > ... > INNER, called from CALLER <- ... <- main`
 * when the frames show where the allocator's code ends (another library family, another
 * namespace), or the raw path `INNER (module+0xoff) <- CALLER <- ... <- main` when they do
 * not (a plain C program: its innermost function is the site). Names demangled, shortened. */
void ct_deny_describe(const uintptr_t *ips, int n, char *out, size_t cap);

#endif
