/* unwind.h - cached CFI rules (unwind.c): the stack a full unwind gives, cheaply. */
#ifndef CUDATRACE_UNWIND_H
#define CUDATRACE_UNWIND_H
#include <stdint.h>

#include "util.h"

void ct_uw_init(void);
void ct_uw_invalidate(void); /* modules may have gone: forget every rule */
/* Walk this thread's stack with the cached rules (computing the missing ones), from start (ra,
 * sp, fp of the program's frame that called the hook; NULL: from here, skipping the shim's own
 * frames): up to max return addresses, innermost first. Returns the count, or -1 when
 * a frame is not one the rules describe (then only a full unwind can say). *out: the return
 * addresses (ips, scratch of max words, or the memo of an identical earlier walk, which is not
 * copied). *learned: 1 when a rule had to be computed (the walk did not come from the cache
 * alone). *tag: a word the caller may keep with this walk's memo (0 on a fresh walk, what it
 * stored there on a repeated one: stacks.c keeps the leaf id); it lives as long as the memo,
 * so a tag read back is only ever paired with a walk that re-checked every word it read.
 * Call it from ONE place: the return addresses of the shim's frames are part of what it caches. */
int ct_uw_walk(const uintptr_t *start, uintptr_t *ips, int max, int *learned, const uintptr_t **out,
               uint64_t **tag);

/* ---- the memo of the last walks (unwind.c), here for the inline recall below -------------
 * A walk is a function of its start (return address, SP, FP), the rules (fixed per address
 * within a generation) and the words it reads from the stack. A memo keeps those words and
 * where they were read: a later walk from the same start, reading the same values at the same
 * places, would make every step the same, so its result is the memo's. Checking reads only
 * addresses the walk itself would read, in its order (each one follows from the matched ones).
 *
 * Only the words the result depends on are kept: every return address, and a saved frame
 * pointer only when a later frame's CFA is computed from it before another saved FP replaces
 * it (likewise the starting FP). In code without frame pointers the FP register holds any
 * value (a loop counter, a pointer) that frames save and restore: it changes from call to call
 * and steers nothing, and comparing it would make every repeated call site miss. */
#define CT_UW_MEMO_WAYS 4
#define CT_UW_MEMO_FRAMES (CT_MAX_DEPTH + 32)
struct ct_uw_memo {
    uintptr_t ra0, sp0, fp0;
    uint64_t tag; /* the caller's note on this walk (ct_uw_walk's *tag), 0: none */
    uint32_t gen;
    int max, n, nreads; /* n < 0: empty */
    int fp0_used;       /* the starting FP was a CFA base before any saved FP replaced it */
    int key;            /* a finished walk's 2 * max + fp0_used; -1: empty or being made */
    const void *rd_end; /* &rd[nreads] */
    struct {
        uintptr_t addr, val;
    } rd[2 * CT_UW_MEMO_FRAMES + 1]; /* then a read that never matches (ct_uw_memo_hit) */
    uintptr_t ips[CT_MAX_DEPTH];
};
/* the memos of a thread: the head of its table (unwind.c's struct uw_thread) */
#define CT_UW_HINTS 16
struct ct_uw_memos {
    uint32_t gen; /* ct_uw_generation the table was made in */
    unsigned next;
    struct ct_uw_memo *hint[CT_UW_HINTS]; /* by the start's return address: the memo it met last */
    struct ct_uw_memo memo[CT_UW_MEMO_WAYS];
};
extern CT_HIDDEN CT_TLS struct ct_uw_memos *ct_uw_thread; /* NULL until the thread's first walk */
extern CT_HIDDEN uint32_t ct_uw_generation;               /* bumped when modules may be gone */

static inline uintptr_t ct_uw_strip_pac(uintptr_t ra)
{
#if defined(__aarch64__)
    /* xpaclri (hint #7): what libgcc does with a signed return address; a no-op without PAC */
    register uintptr_t x30 __asm__("x30") = ra;
    __asm__("hint #7" : "+r"(x30));
    return x30;
#else
    return ra;
#endif
}

/* Every word the walk read, re-read in the walk's order and compared; the first that differs
 * ends it. The order matters: a word's address followed from the words before it, so it is read
 * only once they matched (with them changed it may be no stack any more: a fiber's, freed).
 * Each is tested before the next is read. */
static inline __attribute__((always_inline)) int ct_uw_memo_hit(const struct ct_uw_memo *m)
{
    /* the walk's reads end with one that never matches (unwind.c: ct_uw_never): the loop
     * needs no count */
    const __typeof__(m->rd[0]) *r = m->rd;
    while (*(const uintptr_t *)r->addr == r->val)
        r++;
    return (const void *)r == m->rd_end;
}

/* m is the memo of an identical earlier walk from (ra, sp, fp) of max frames */
static inline __attribute__((always_inline)) int
ct_uw_memo_is(const struct ct_uw_memo *m, uintptr_t ra, uintptr_t sp, uintptr_t fp, int max)
{
    return m->ra0 == ra && m->sp0 == sp &&
           (m->key == 2 * max || (m->key == 2 * max + 1 && m->fp0 == fp)) && ct_uw_memo_hit(m);
}

static inline unsigned ct_uw_hint_of(uintptr_t ra)
{
    return (unsigned)((ra ^ ra >> 5) % CT_UW_HINTS);
}

/* the memo of an identical earlier walk from (ra, sp, fp) of max frames, every word it read
 * re-checked; NULL: none. The memo the start's return address met last is tried first (a loop
 * of an allocation and a free alternates between two). (A memo's gen is its table's while it is
 * not empty: a table of an older generation empties every memo, ct_uw_walk's thread_table.) */
static inline __attribute__((always_inline)) const struct ct_uw_memo *
ct_uw_memo_find(struct ct_uw_memos *t, uintptr_t ra, uintptr_t sp, uintptr_t fp, int max)
{
    unsigned h = ct_uw_hint_of(ra);
    const struct ct_uw_memo *first = t->hint[h];
    if (first && ct_uw_memo_is(first, ra, sp, fp, max))
        return first;
    for (unsigned w = 0; w < CT_UW_MEMO_WAYS; w++) {
        if (&t->memo[w] != first && ct_uw_memo_is(&t->memo[w], ra, sp, fp, max)) {
            t->hint[h] = &t->memo[w];
            return &t->memo[w];
        }
    }
    return NULL;
}

/* The answer of an identical earlier walk from (ra, sp, fp) (every word it read re-checked),
 * as ct_uw_walk would give it with *learned 0: the memo, or NULL when there is none (then
 * ct_uw_walk). The fast path of a repeated call site: no walk, no rule lookup, no call. */
static inline __attribute__((always_inline)) const struct ct_uw_memo *
ct_uw_recall(uintptr_t ra, uintptr_t sp, uintptr_t fp, int max)
{
    struct ct_uw_memos *t = ct_uw_thread;
    if (!t || t->gen != __atomic_load_n(&ct_uw_generation, __ATOMIC_ACQUIRE))
        return NULL;
    return ct_uw_memo_find(t, ct_uw_strip_pac(ra), sp, fp, max);
}
#endif
