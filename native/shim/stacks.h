/* stacks.h - the call-stack tree (stacks.c): each distinct stack written once. */
#ifndef CUDATRACE_STACKS_H
#define CUDATRACE_STACKS_H

#include <stdint.h>

#include "pyframes.h"
#include "unwind.h"
#include "util.h"
#include "writer.h"

void ct_stacks_init(void);
/* Where the program's own frames start: the registers its code had at its call of the hooked
 * function (ra: the return address into it, sp: its SP there, which is the wrapper's CFA, fp: its
 * frame pointer, which the wrapper saved in its frame record). A walk from there never visits
 * the shim's own frames. sp 0: unknown (the walk starts inside the shim and skips its frames). */
struct ct_caller {
    uintptr_t ra, sp, fp;
};
/* the stack's id (a node of the tree), from where the program's frames start; 0: none. A
 * repeated call site is answered inline (the unwinder's memo of an identical walk, every word
 * it read re-checked, carries the id: its tag); anything else goes to stacks.c. *cached: 1 when
 * the unwinder's cache gave the stack (the event says so, CT_EV_STACK_CACHED), 0 when a full
 * unwind did (counted in the file header there). */
uint32_t ct_stack_capture_slow(const struct ct_caller *from, int *cached);
extern CT_HIDDEN uint32_t ct_stack_generation; /* bumped on reset: tags of older ones are stale */
/* the frames kept (ct_cfg.stack_depth) when a memo's answer may be used (stacks on, not
 * verifying), else 0 */
extern CT_HIDDEN int ct_stack_recall_depth;
extern CT_HIDDEN CT_TLS const uintptr_t *ct_stack_last; /* the last stack's return addresses */
extern CT_HIDDEN CT_TLS int ct_stack_last_n;
/* keep: remember the stack as this thread's last (the denial's line reads it: ct_pre) */
static inline __attribute__((always_inline)) uint32_t ct_stack_capture(const struct ct_caller *from,
                                                                       int *cached, int keep)
{
    int depth = ct_stack_recall_depth;
    if (__builtin_expect(depth && from->sp && !ct_py_maybe(), 1)) {
        const struct ct_uw_memo *m = ct_uw_recall(from->ra, from->sp, from->fp, depth);
        /* a tag is a leaf's (a memo of no frames has none); a memo of an older tree of stacks
         * (before fork) is never found: the reset empties the memos (ct_stacks_reset) */
        if (m && m->tag) {
            if (keep) {
                ct_stack_last = m->ips;
                ct_stack_last_n = m->n;
            }
            *cached = 1;
            return (uint32_t)m->tag;
        }
    }
    return ct_stack_capture_slow(from, cached);
}
/* in a wrapper (built with frame pointers: its frame record holds the caller's FP and the
 * return address, on x86-64 and aarch64 alike) */
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__aarch64__))
#define CT_CALLER(c)                                                                               \
    do {                                                                                           \
        const uintptr_t *ct_fr_ = (const uintptr_t *)__builtin_frame_address(0);                   \
        (c).sp = (uintptr_t)__builtin_dwarf_cfa();                                                 \
        (c).fp = ct_fr_[0];                                                                        \
        (c).ra = ct_fr_[1];                                                                        \
    } while (0)
#else
#define CT_CALLER(c) ((c).sp = (c).fp = (c).ra = 0)
#endif
void ct_stacks_atfork_prepare(void);
void ct_stacks_atfork_parent(void);
void ct_stacks_reset(void); /* new file: forget every node (child after fork) */
/* first frame outside the shim and the CUDA libraries, for messages */
uintptr_t ct_stack_first_user_frame(void); /* of this thread's last captured stack */
/* up to max frames of that stack from the first user frame outwards; the count */
int ct_stack_user_frames(uintptr_t *out, int max);
/* a copy of the stack tree so far (cold path: a denial's call graph, graph.c): (*ips)[id] and
 * (*parents)[id] for ids 1..n, malloc'd, the caller frees both; 0 (nothing) when empty */
uint32_t ct_stacks_copy(uint64_t **ips, uint32_t **parents);

#endif
