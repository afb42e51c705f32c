/* ctxhold.h - the CUDA contexts a process counts against its budget, read from NVML, and the hold
 * that keeps its allocations (and frees) waiting while a device's first figure is read
 * (ctxhold.c). Each device's context is in one of the states below; the transitions are
 * ctxhold.c's functions. The clock, NVML, the count of budgeted calls under way and the waits are
 * reached through a table (struct ct_ctx_ops): the shim's are the real ones, and the harness
 * tests/ctxhold/ctxhold_test.c puts its own there to stop the measuring thread at each step.
 * The names the call protocol (shim.c) uses keep the budget's prefix: they are the budget's,
 * kept in a module of their own; budget.h includes this header and hands the ledger in. */
#ifndef CUDATRACE_CTXHOLD_H
#define CUDATRACE_CTXHOLD_H

#include <stdint.h>

#include "ledger.h"
#include "util.h"

/* a device's context, as this process counts it (the order matters: below MEASURED, a counted
 * allocation waits for the first figure) */
enum ct_ctx_state {
    CT_CTX_UNSET,     /* no figure yet: the first counted allocation measures, the others wait */
    CT_CTX_MEASURING, /* the first figure is read: allocations wait for it (10 s at most), frees
                         too */
    CT_CTX_UNLISTED,  /* NVML did not list the process (no context yet): the next allocation,
                         which may make it, measures again; those held wait 1 s more */
    CT_CTX_MEASURED,  /* counted; read again at most once a second (raised, never lowered by a
                         reading that calls disturbed) */
    CT_CTX_GIVEN_UP,  /* NVML cannot say (none, an integrated device, another pid namespace) or
                         did not list the process CTX_TRIES times: nothing counted or held; read
                         again once a second */
};

/* What the hold reads and how it waits. Every entry is called outside any lock. */
struct ct_ctx_ops {
    uint64_t (*now)(void); /* the clock, ns (ct_now_ns) */
    /* 1 when NVML can be asked; the first call starts it (seconds on some machines) */
    int (*nvml_start)(void);
    /* NVML's figure for this process on dev: 1 (*used); 0 not listed; -1 NVML cannot say */
    int (*nvml_used)(int dev, uint64_t *used);
    /* the budgeted calls under way (ct_budget_inflight), *reserved: ct_budget_reserved */
    uint32_t (*calls)(uint64_t *reserved);
    void (*yield)(void);               /* a held thread's first waits */
    void (*nap)(void);                 /* its later ones: 100 us asleep */
    void (*moved)(int dev, int state); /* told each transition, right after it (shim: nothing) */
};
/* whether contexts are counted at all (CUDATRACE_COUNT_CONTEXTS=0: no NVML is opened); before
 * any thread counts a context */
void ct_ctxhold_set_counting(int on);
/* the table to use from now on (NULL: the real one); before any thread counts a context */
void ct_ctxhold_set_ops(const struct ct_ctx_ops *ops);

/* Count this process's context on dev in l: at the first counted allocation on dev (before and
 * after it: the call may make the context), then at most once a second; before the first
 * figure, wait for it (ctxhold.c). Called around counted allocations (budget.h
 * ct_budget_context). */
void ct_ctxhold_count(ct_ledger *l, int dev);
/* Without a budget (ct_cfg.ctx_watch): the figure a budget would count for dev, measured after
 * an allocation (held(dev) + pending: what this process holds there by its live counters, and
 * the allocation's own not counted yet), only while no other call is under way (those
 * bracketed by ct_budget_call_begins(1) / ct_budget_call_ends), and told to the context report
 * when it grew (budget.h ct_budget_context_watch). */
void ct_ctxhold_watch(int dev, uint64_t (*held)(int dev), uint64_t pending);
/* fn(dev, bytes): told each new figure (shim.c writes it into the trace) */
void ct_budget_set_context_report(void (*fn)(int dev, uint64_t bytes));
/* membership lost and joined again (budget.c ct_budget_rejoin): every context measured anew */
void ct_ctxhold_forget(void);
/* in a child after fork: no context of its own yet, no call of the parent's under way */
void ct_ctxhold_atfork_child(void);

/* Budgeted calls of this process between their ledger change and their driver call's end (an
 * allocation reserved, a free not given back yet), and the bytes allocations have reserved so
 * far (only grows): a context is measured from NVML and the ledger only with both in view. The
 * call protocol (shim.c) brackets each call; reserved: what an allocation reserves, 0 for a
 * free. */
extern CT_HIDDEN uint32_t ct_budget_inflight;
extern CT_HIDDEN uint64_t ct_budget_reserved;
static inline void ct_budget_call_begins(uint64_t reserved)
{
    __atomic_add_fetch(&ct_budget_reserved, reserved, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&ct_budget_inflight, 1, __ATOMIC_ACQ_REL);
}
static inline void ct_budget_call_ends(void)
{
    __atomic_sub_fetch(&ct_budget_inflight, 1, __ATOMIC_ACQ_REL);
}
/* nonzero while a device's first context figure is read: frees wait for it
 * (ct_budget_free_wait, 10 s at most) */
extern CT_HIDDEN uint32_t ct_budget_ctx_first;
void ct_budget_free_wait(void);

#endif
