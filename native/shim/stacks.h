/* stacks.h - the call-stack tree (stacks.c): each distinct stack written once. */
#ifndef CUDATRACE_STACKS_H
#define CUDATRACE_STACKS_H

#include <stdint.h>

void ct_stacks_init(void);
/* wrapper_cfa: __builtin_dwarf_cfa() of the wrapper (0 if unknown) */
uint32_t ct_stack_capture(uintptr_t wrapper_cfa);
#if defined(__GNUC__) && !defined(__clang__)
#define CT_CFA() ((uintptr_t)__builtin_dwarf_cfa())
#else
#define CT_CFA() ((uintptr_t)0)
#endif
void ct_stacks_atfork_prepare(void);
void ct_stacks_atfork_parent(void);
void ct_stacks_reset(void); /* new file: forget every node (child after fork) */
/* first frame outside the shim and the CUDA libraries, for messages */
uintptr_t ct_stack_first_user_frame(void); /* of this thread's last captured stack */
/* up to max frames of that stack from the first user frame outwards; the count */
int ct_stack_user_frames(uintptr_t *out, int max);

#endif
