/* graph.h - the call graph's fold at a denial (graph.c): allocator layers found, as the
 * reports find them (cudatrace/analyze/layers.py CallGraph), from the stacks this process
 * recorded so far. */
#ifndef CUDATRACE_GRAPH_H
#define CUDATRACE_GRAPH_H

#include <stdint.h>

/* fn[0..n): the functions (start addresses) of the denied call's frames outside CUDA,
 * innermost first; module[k]: frame k's module basename. How many of them fold into allocator
 * layers (a function that two callers reach allocation through only, and what lies below it);
 * 0 when none, or when nothing was recorded (no trace is written) */
int ct_graph_cut(const uint64_t *fn, const char *const *module, int n);

#endif
