/* pyframes.c: the Python stack of the calling thread, read as data (docs/python-frames.md). */
#ifndef CT_PYFRAMES_H
#define CT_PYFRAMES_H

#include <stddef.h>
#include <stdint.h>

/* The link node's ip for this event (trace_format.h CT_PYLINK_*), 0 when the process has no
 * Python. Inline: a process that is not Python pays two loads. */
struct pyrt;
extern __attribute__((visibility("hidden"))) struct pyrt *ct_py_rt;   /* the interpreter, found */
extern __attribute__((visibility("hidden"))) int ct_py_modules_dirty; /* look for it again */
uint64_t ct_py_capture_now(void);
/* 0: the process has no interpreter (found none, and no module mapped since it looked) */
extern __attribute__((visibility("hidden"))) int ct_py_state; /* rt found: 2, dirty: 1 */
static inline int ct_py_maybe(void) { return __atomic_load_n(&ct_py_state, __ATOMIC_ACQUIRE) != 0; }
static inline uint64_t ct_py_capture(void) { return ct_py_maybe() ? ct_py_capture_now() : 0; }
void ct_py_detect(void);          /* at start-up: find the interpreter before threads race */
void ct_py_modules_changed(void); /* new modules mapped: look for the interpreter again */
void ct_py_atfork_prepare(void);
void ct_py_atfork_parent(void);
void ct_py_reset(void); /* child after fork */

/* At a denial (cold path: docs/python-frames.md, deny.c) */
/* whose code a Python file is (cudatrace/symbols/python.py origin): an installed package's
 * (pkg[0..pkg_len) its top-level name), the standard library's, or the program's; where: the
 * path from the package root (library, stdlib) or the file name (program), inside path */
#define CT_PYO_PROGRAM 0
#define CT_PYO_LIBRARY 1
#define CT_PYO_STDLIB 2
struct ct_py_origin {
    int kind;
    const char *pkg, *where;
    size_t pkg_len;
};
void ct_py_origin(const char *path, struct ct_py_origin *o);
/* a Python function's identity (its origin's where, its qualified name), as the reports' call
 * graph tells functions apart; never 0 or 1 */
uint64_t ct_py_ident(const char *filename, const char *qualname);
/* one Python frame as a denial line reads it */
struct ct_pyd_frame {
    char name[160];  /* co_qualname */
    char base[96];   /* the file's name */
    char where[256]; /* its origin's where */
    char pkg[64];    /* its package (a library's), else "" */
    int kind;        /* CT_PYO_* */
    int line;        /* -1: unknown */
    uint64_t ident;  /* ct_py_ident */
};
/* The calling thread's Python frames, innermost first, into out[0..max): how many. 0 with
 * *why saying why there are none to read (Python frames off, a version not supported, no
 * frame on this thread); -1 when the process has no interpreter known (*why NULL, or why
 * none is read) */
int ct_py_deny_frames(struct ct_pyd_frame *out, int max, const char **why);
/* a hash of the calling thread's innermost Python frames (0: none): a denial's rate-limit key */
uint64_t ct_py_stack_key(void);
/* the eval loop's first address (0: unknown) */
uintptr_t ct_py_eval_start(void);
/* The Python stack tree so far: (*parent)[id] and (*ident)[id] (its function's ct_py_ident, 0
 * unknown) for ids 1..n, malloc'd, the caller frees both; 0 when empty */
uint32_t ct_py_nodes_copy(uint32_t **parent, uint64_t **ident);

#endif
