/* budget.h - the budget inside the target (budget.c): the ledger shared by a process tree or a
 * named group, this process's table of counted live allocations (to give bytes back on free),
 * and the budget's answers to memory queries (cuMemGetInfo, NVML). */
#ifndef CUDATRACE_BUDGET_H
#define CUDATRACE_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "ledger.h"
#include "util.h"

/* the open ledger, NULL without a budget (set at load, or published by the first thread that
 * joins an environment's group: ct_budget_ensure; a child keeps its parent's). Another thread
 * may be publishing it: read through ct_budget_current() (or an acquire load before reading
 * through it); shim.c's ct_post and free wrappers gate on a plain load (said there). */
extern CT_HIDDEN ct_ledger *ct_budget_ledger;
/* CT_BUDGET_PENDING: a budget from the environment (CUDATRACE_GROUP) this process has not
 * joined yet, or a reason fencing cannot be set up not said yet, both at the first CUDA call
 * that needs the budget; CT_BUDGET_REFUSING: fencing cannot be set up and
 * CUDATRACE_ON_FENCE_ERROR=refuse: that call and every later one is refused */
extern CT_HIDDEN int ct_budget_pending;
#define CT_BUDGET_PENDING 1
#define CT_BUDGET_REFUSING 2
/* CT_BUDGET_OBSERVING: cudatrace's own process (cudatrace_exempt) inside a sealed fence: it
 * observes (no member, the real figures, cuInit) and its counted allocations are refused */
#define CT_BUDGET_OBSERVING 3
/* the ledger as this thread sees it now: a relaxed atomic load (a plain load's instruction,
 * without the data race); what the ledger holds is published by ct_budget_ensure's release */
static inline ct_ledger *ct_budget_current(void)
{
    return __atomic_load_n(&ct_budget_ledger, __ATOMIC_RELAXED);
}
static inline int ct_budget_on(void)
{
    return ct_budget_current() != NULL || __atomic_load_n(&ct_budget_pending, __ATOMIC_ACQUIRE);
}
/* The ledger to count against, joining the environment's group first when that is pending (the
 * process's first CUDA call that needs the budget). NULL: no budget. */
ct_ledger *ct_budget_ensure(void);

/* Open the ledger of ct_cfg.ledger_path (when set) and join it; or, with CUDATRACE_GROUP and no
 * launcher, note the group to join at the first CUDA call that needs it. */
void ct_budget_init(void);
/* cuInit: with a budget from the environment, open its group's ledger now (joined at the
 * first allocation); 0: fencing cannot be set up and the process's CUDA is refused (said). */
int ct_budget_cuinit(void);
/* A counted call found that fencing broke (what, detail: why): say it once; 1 when the call
 * is to be refused (CUDATRACE_ON_FENCE_ERROR=refuse), 0 when it runs unfenced. */
int ct_budget_fence_failed(const char *what, const char *detail);
static inline int ct_budget_refusing(void)
{
    return __atomic_load_n(&ct_budget_pending, __ATOMIC_ACQUIRE) >= CT_BUDGET_REFUSING;
}
/* fn(verdict, why): told when fencing could not be set up ("refused" / "unfenced"; shim.c
 * writes it into the trace) */
void ct_budget_set_fence_report(void (*fn)(const char *verdict, const char *why));
/* The share this process counts in ("" none) and how a denial names it (CUDATRACE_SHARE_LABEL,
 * e.g. "slurm job 42"). */
const char *ct_budget_share_label(void);
uint64_t ct_budget_share_limit(void); /* CUDATRACE_SHARE_BUDGET's bytes, 0 without a share */
/* fn(): told when this process joins its environment's group (after its trace's preamble may
 * have been written: shim.c writes the budget's INFO records) */
void ct_budget_set_join_report(void (*fn)(void));
void ct_budget_join(void); /* again in a child after fork */
void ct_budget_leave(void);

/* Join again after another member judged this process dead, counting what it still holds.
 * 1 if a member again. */
int ct_budget_rejoin(void);

/* whether an allocation of this kind on dev counts against the budget */
int ct_budget_counted(int kind, int dev);

/* the table of counted live allocations, keyed (space, address) */
int ct_budget_track(uint64_t addr, int space, uint64_t size, int dev);
/* a free: 1 with the bytes to give back (0 none, or a VMM handle still mapped) */
int ct_budget_untrack(uint64_t addr, int space, uint64_t *size, int *dev);
void ct_budget_map(uint64_t ptr, uint64_t size, uint64_t handle);
void ct_budget_unmap(uint64_t ptr, uint64_t size); /* gives back what the unmap frees */

/* A memory query's answer rewritten to tell the budget: total = min(real total, limit),
 * free = limit - in use, no more than the real free when clamp. 1 if it did (a budget with a
 * limit on dev, and virtualization on). */
int ct_budget_virtualize(int dev, uint64_t *total, uint64_t *free_, int clamp);

/* Budgeted calls of this process between their ledger change and their driver call's end (an
 * allocation reserved, a free not given back yet), and the bytes allocations have reserved so
 * far (only grows): a context is measured from NVML and the ledger only with both in view
 * (budget.c). The call protocol (shim.c) brackets each call; reserved: what an allocation
 * reserves, 0 for a free. */
extern CT_HIDDEN uint32_t ct_budget_inflight;
extern CT_HIDDEN uint64_t ct_budget_reserved;
static inline void ct_budget_call_begins(uint64_t reserved)
{
    __atomic_add_fetch(&ct_budget_reserved, reserved, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&ct_budget_inflight, 1, __ATOMIC_ACQ_REL);
}
/* nonzero while a device's first context figure is read: frees wait for it (budget.c) */
extern CT_HIDDEN uint32_t ct_budget_ctx_first;
void ct_budget_free_wait(void);
static inline void ct_budget_call_ends(void)
{
    __atomic_sub_fetch(&ct_budget_inflight, 1, __ATOMIC_ACQ_REL);
}

/* Count this process's CUDA context on dev (measured through NVML, at most once a second;
 * see budget.c). Called around counted allocations. */
void ct_budget_context(int dev);
/* Without a budget (ct_cfg.ctx_watch): the figure a budget would count for this process's
 * context on dev, measured the same way after an allocation (held(dev) + pending: the bytes
 * this process holds there, by its live counters, and the allocation's own not counted yet),
 * only while no other call of the process is under way (the calls bracketed by
 * ct_budget_call_begins(1) / ct_budget_call_ends), and told to the context report when it
 * grew. */
void ct_budget_context_watch(int dev, uint64_t (*held)(int dev), uint64_t pending);
/* fn(dev, bytes): told each new figure (shim.c writes it into the trace) */
void ct_budget_set_context_report(void (*fn)(int dev, uint64_t bytes));

void ct_budget_atfork_prepare(void);
void ct_budget_atfork_parent(void);
void ct_budget_atfork_child(void);

#endif
