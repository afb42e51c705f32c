/* graph.h - the call graph's fold at a denial (graph.c): allocator layers found, as the
 * reports find them (cudatrace/analyze/sites/layers.py CallGraph), from the stacks this process
 * recorded so far. */
#ifndef CUDATRACE_GRAPH_H
#define CUDATRACE_GRAPH_H

#include <stdint.h>

/* fn[0..n): the functions (modules.h ct_function_idents) of the denied call's frames outside
 * CUDA, innermost first; module[k]: frame k's module basename. How many of them fold into allocator
 * layers (a function that two callers reach allocation through only, and what lies below it);
 * 0 when none, or when nothing was recorded (no trace is written) */
int ct_graph_cut(const uint64_t *fn, const char *const *module, int n);
/* the same over Python functions: ident[0..n) the identities (ct_py_ident) of the denied call's
 * Python frames from the first that may fold, innermost first, where[k] its file's origin (the
 * module the rule reads); the Python stacks are those the recorded stacks link to */
int ct_graph_py_cut(const uint64_t *ident, const char *const *where, int n);

#endif
