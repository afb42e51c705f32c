/* unwind.h - cached CFI rules (unwind.c): the stack a full unwind gives, cheaply. */
#ifndef CUDATRACE_UNWIND_H
#define CUDATRACE_UNWIND_H
#include <stdint.h>

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
#endif
