/* ctxhold.c - the CUDA contexts a process counts against its budget, and the hold around a
 * device's first figure (ctxhold.h).
 *
 * A context and the modules loaded into it hold device memory that no hooked call allocates
 * (~0.5 GiB a process on an H200). With a budget the shim counts it: at the first counted
 * allocation on a device (before and after it, as the context may be made by that very call)
 * and then at most once a second at allocations, it reads NVML's figure for this process
 * (nvmlDeviceGetComputeRunningProcesses_v3) and counts what of it is not counted allocations as
 * the member's context (ct_ledger_set_context: held, never denied, shown apart). No lock is
 * taken: a compare-and-swap picks the thread that measures. A reading is exact only when no
 * budgeted call of the process is between its ledger change and its driver call's end
 * (ct_budget_inflight); else it can only read low, and a low reading never lowers the figure.
 *
 * The budget starts from the context, not from the context less the allocations then in
 * flight, nor from nothing while allocations fill it (NVML takes a while to start): a correction
 * upward with the allocations at the limit puts the ledger above the budget (seen on an H200:
 * 1.19 and 1.4-1.5 GiB under 1 GiB). So until a device's first figure (each rule has its case in
 * tests/ctxhold/ctxhold_test.c, which fails without it):
 * - the process's other allocations wait for it as long as the first measurement runs (NVML's
 *   start-up, the calls under way: 10 s at most, for an NVML that hangs), also while the thread
 *   that claimed it has not set the hold yet (a thread preempted there let 16 others allocate
 *   past it, and a budget of 40 MiB reach 48);
 * - they sleep after a few yields, so that on a loaded machine the measuring thread and the
 *   calls it waits for get the CPU (a 1 s hold spent yielding let 40 MiB reach 48 with 64
 *   threads on 2 busy CPUs);
 * - frees wait too: a free the device has taken back and the ledger not yet makes the reading
 *   low, and threads that free without pause kept every reading of a loaded machine inexact (the
 *   first figure came out 0 or 1 MiB of an 8 MiB context);
 * - the measuring thread lets the calls under way end first, and reads again a reading that
 *   calls disturbed (threads that passed the hold before it was set reserve during it), 16
 *   times at most;
 * - the figure is in the ledger before the waiting allocations go;
 * - when NVML does not list the process yet (the context is made by the allocation about to be
 *   made), that allocation measures again when it returns, and the others wait 1 s more (the
 *   next reading, claimed, holds them by a deadline of its own, not that expired second); after
 *   CTX_TRIES such readings nothing is held.
 * Where NVML lists no figure for this pid (integrated devices, a container that does not share
 * the host's pid namespace), nothing is counted and `cudatrace status` shows no context.
 * CUDATRACE_COUNT_CONTEXTS=0 turns it off. */
#include "ctxhold.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define CTX_PERIOD_NS 1000000000ull   /* between two readings of a counted context, at least */
#define CTX_TRIES 4                   /* readings that found no figure before giving up */
#define CTX_HOLD_NS 1000000000ull     /* after a first reading that found no figure yet */
#define CTX_MEASURE_NS 10000000000ull /* while the first measurement runs, at most */
#define CTX_FIRST_TRIES 16       /* more readings of the first figure, while calls disturb it */
#define CTX_RETRY_NS 10000000ull /* without a budget: after a reading disturbed by other calls */
#define CTX_YIELDS 16            /* a held thread's waits that yield; sleeps after */

uint32_t ct_budget_inflight;
uint64_t ct_budget_reserved;
uint32_t ct_budget_ctx_first;

/* one device's context */
struct ctx_dev {
    uint32_t state;          /* enum ct_ctx_state */
    uint32_t misses;         /* readings that found no figure */
    uint64_t next_ns;        /* when the next reading is due (MEASURED, GIVEN_UP, and the watch) */
    uint64_t measure_until;  /* MEASURING: allocations wait until then; 0 not set yet */
    uint64_t unlisted_until; /* UNLISTED: those held wait until then */
    uint64_t counted;        /* what this process counts now */
};
static struct ctx_dev ctx_devs[CT_LEDGER_MAX_DEVICES];
static void (*ctx_report)(int dev, uint64_t bytes);

void ct_budget_set_context_report(void (*fn)(int dev, uint64_t bytes)) { ctx_report = fn; }

/* ---- the real table: the clock, NVML, the calls under way, the waits -------------------- */
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_index[CT_LEDGER_MAX_DEVICES]; /* CUDA ordinal -> NVML index, -1 none */
static nvmlReturn_t (*nvml_handle)(unsigned, nvmlDevice_t *);
static nvmlReturn_t (*nvml_procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *);

/* CUDA_VISIBLE_DEVICES's ordinals name NVML indices: a UUID or MIG name ends the mapping */
static void nvml_map_devices(void)
{
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        nvml_index[d] = d;
    const char *v = ct_setting(CT_SET_CUDA_VISIBLE_DEVICES);
    if (!v)
        return;
    int d = 0;
    for (const char *p = v; d < CT_LEDGER_MAX_DEVICES; d++) {
        if (*p < '0' || *p > '9')
            break; /* a UUID or MIG name, or the end: no mapping from here on */
        int idx = 0;
        while (*p >= '0' && *p <= '9')
            idx = idx * 10 + (*p++ - '0');
        nvml_index[d] = idx;
        if (*p != ',')
            break;
        p++;
    }
    for (int k = d + 1; k < CT_LEDGER_MAX_DEVICES; k++)
        nvml_index[k] = -1;
    if (!*v)
        nvml_index[0] = -1;
}

/* CUDATRACE_COUNT_CONTEXTS as the fence has it (budget.c tells it at load: a sealed record's
 * value, or the environment's where it is stricter); on until told */
static int counting = 1;
void ct_ctxhold_set_counting(int on) { __atomic_store_n(&counting, on, __ATOMIC_RELEASE); }

static void nvml_init(void)
{
    nvml_map_devices();
    if (!__atomic_load_n(&counting, __ATOMIC_ACQUIRE))
        return;
    ct_dlsym_fn ds = ct_real_dlsym();
    void *h = ds ? dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h)
        return;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))ds(h, "nvmlInit_v2");
    nvml_handle = (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))ds(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *))ds(
            h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (init && nvml_handle && procs && init() == NVML_SUCCESS)
        __atomic_store_n(&nvml_procs, procs, __ATOMIC_RELEASE);
}

static int real_nvml_start(void)
{
    pthread_once(&nvml_once, nvml_init);
    return __atomic_load_n(&nvml_procs, __ATOMIC_ACQUIRE) != NULL;
}

/* NVML's figure for this process on dev: 1 found; 0 not listed (no context there yet); -1 NVML
 * cannot say (an error: integrated devices answer NOT_SUPPORTED, more than 128 processes
 * INSUFFICIENT_SIZE; or the figure is N/A, as in some containers) */
static int real_nvml_used(int dev, uint64_t *used)
{
    int idx = nvml_index[dev];
    nvmlDevice_t h;
    if (idx < 0 || nvml_handle((unsigned)idx, &h) != NVML_SUCCESS)
        return -1;
    nvmlProcessInfo_v2_t info[128];
    unsigned n = 128;
    if (nvml_procs(h, &n, info) != NVML_SUCCESS)
        return -1;
    unsigned me = (unsigned)getpid();
    for (unsigned i = 0; i < n && i < 128; i++)
        if (info[i].pid == me) {
            if (info[i].usedGpuMemory == ~0ull)
                return -1;
            *used = info[i].usedGpuMemory;
            return 1;
        }
    return 0;
}

static uint32_t real_calls(uint64_t *reserved)
{
    uint32_t n = __atomic_load_n(&ct_budget_inflight, __ATOMIC_ACQUIRE);
    *reserved = __atomic_load_n(&ct_budget_reserved, __ATOMIC_ACQUIRE);
    return n;
}

static uint64_t real_now(void) { return ct_now_ns(); }
static void real_yield(void) { sched_yield(); }
static void real_nap(void)
{
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}
static void real_moved(int dev, int state) {}

static const struct ct_ctx_ops real_ops = {real_now,   real_nvml_start, real_nvml_used, real_calls,
                                           real_yield, real_nap,        real_moved};
static const struct ct_ctx_ops *ops = &real_ops;

void ct_ctxhold_set_ops(const struct ct_ctx_ops *o) { ops = o ? o : &real_ops; }

/* ---- the transitions ------------------------------------------------------------------ */
static void move(int dev, struct ctx_dev *d, uint32_t state)
{
    __atomic_store_n(&d->state, state, __ATOMIC_RELEASE);
    ops->moved(dev, (int)state);
}

/* UNSET or UNLISTED -> MEASURING: this thread reads the first figure (the others wait); 0 when
 * another thread claimed it first. Until the deadline is set here, a thread that comes waits
 * all the same (hold). */
static int claim_first(int dev, struct ctx_dev *d, uint32_t from, uint64_t now)
{
    if (!__atomic_compare_exchange_n(&d->state, &from, CT_CTX_MEASURING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return 0;
    ops->moved(dev, CT_CTX_MEASURING);
    __atomic_store_n(&d->next_ns, now + CTX_PERIOD_NS, __ATOMIC_RELAXED);
    /* allocations wait as long as it measures (NVML's start-up included), 10 s at most */
    __atomic_store_n(&d->measure_until, now + CTX_MEASURE_NS, __ATOMIC_RELEASE);
    __atomic_add_fetch(&ct_budget_ctx_first, 1, __ATOMIC_ACQ_REL); /* and frees */
    return 1;
}

/* -> MEASURED: a figure was read (put in the ledger first: the allocations it lets go must fit
 * beside it). 1 when it is a new figure to report. */
static int measured(ct_ledger *l, int dev, struct ctx_dev *d, uint64_t ctx, int exact)
{
    uint64_t mine = __atomic_load_n(&d->counted, __ATOMIC_RELAXED);
    /* a low reading while calls were under way says only that the context is at least that */
    int take = ctx != mine && (exact || ctx > mine);
    if (take && ct_ledger_set_context(l, dev, ctx) != CT_LEDGER_OK)
        take = 0;
    if (take)
        __atomic_store_n(&d->counted, ctx, __ATOMIC_RELAXED);
    if (__atomic_load_n(&d->state, __ATOMIC_ACQUIRE) != CT_CTX_MEASURED)
        move(dev, d, CT_CTX_MEASURED);
    return take;
}

/* A reading found no figure. NVML does not list the process yet: the next allocation (which may
 * be the one that makes the context) measures again, and the threads held wait 1 s more, until
 * CTX_TRIES (UNLISTED); NVML cannot say (never: nothing can be counted), or CTX_TRIES readings
 * found none: no more holding (GIVEN_UP). A counted figure stays (MEASURED). */
static void missed(int dev, struct ctx_dev *d, int never)
{
    if (never)
        __atomic_store_n(&d->misses, CTX_TRIES, __ATOMIC_RELAXED);
    int more = __atomic_add_fetch(&d->misses, 1, __ATOMIC_RELAXED) < CTX_TRIES;
    if (more)
        __atomic_store_n(&d->next_ns, 0, __ATOMIC_RELAXED);
    uint32_t s = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (s == CT_CTX_MEASURED || s == CT_CTX_GIVEN_UP)
        return;
    /* the next claim's deadline is its own: 0 until it sets it */
    __atomic_store_n(&d->measure_until, 0, __ATOMIC_RELEASE);
    if (more)
        __atomic_store_n(&d->unlisted_until, ops->now() + CTX_HOLD_NS, __ATOMIC_RELEASE);
    move(dev, d, more ? CT_CTX_UNLISTED : CT_CTX_GIVEN_UP);
}

/* ---- the readings ----------------------------------------------------------------------- */
/* one wait of a thread held for the first figure: a few yields, then naps of 100 us, which
 * leave the CPU to the thread that measures and to the calls it waits for */
static void ctx_pause(unsigned *waits)
{
    if ((*waits)++ < CTX_YIELDS)
        ops->yield();
    else
        ops->nap();
}

/* NVML's figure for this process on dev less the allocations the ledger holds (mine: the
 * context counted now, part of what the ledger holds): 1 with *ctx, else nvml_used's 0 or -1.
 * *exact when no budgeted call was under way or begun across the reading. Else *ctx is a
 * lower bound: calls under way only make it read low (an allocation reserved and not made, a
 * free made and not given back), and what allocations reserved during the reading is taken
 * off (one made and freed again within it is in NVML's figure and in neither ledger read). */
static int measure(ct_ledger *l, int dev, uint64_t mine, uint64_t *ctx, int *exact)
{
    uint64_t r0, r1, used = 0;
    uint32_t b0 = ops->calls(&r0);
    uint64_t h0 = ct_ledger_held(l, dev);
    int found = ops->nvml_used(dev, &used);
    if (found != 1)
        return found;
    uint64_t h1 = ct_ledger_held(l, dev);
    uint32_t b1 = ops->calls(&r1);
    uint64_t held = h0 > h1 ? h0 : h1;
    uint64_t allocs = (held > mine ? held - mine : 0) + (r1 - r0);
    *ctx = ((used > allocs ? used - allocs : 0) + 1023) & ~1023ull; /* the ledger keeps KiB */
    *exact = !b0 && !b1 && r0 == r1 && h0 == h1;
    return 1;
}

/* the measuring thread, the first time: let the budgeted calls under way end (within the
 * hold) */
static void quiet(struct ctx_dev *d)
{
    unsigned waits = 0;
    uint64_t r;
    while (ops->calls(&r) && ops->now() < __atomic_load_n(&d->measure_until, __ATOMIC_ACQUIRE))
        ctx_pause(&waits);
}

/* MEASURING: the first figure, the one the budget starts from */
static void measure_first(ct_ledger *l, int dev, struct ctx_dev *d)
{
    uint64_t mine = __atomic_load_n(&d->counted, __ATOMIC_RELAXED), ctx = 0;
    int exact = 0, found = -1;
    if (ops->nvml_start()) { /* else no NVML: nothing to count */
        quiet(d);            /* an exact first reading */
        found = measure(l, dev, mine, &ctx, &exact);
        /* a reading that calls disturbed (threads that passed the hold before it was set
         * reserve during it, and read low) is made again once they ended */
        for (int again = 0; found == 1 && !exact && again < CTX_FIRST_TRIES; again++) {
            quiet(d);
            found = measure(l, dev, mine, &ctx, &exact);
        }
    }
    int report = 0;
    if (found == 1)
        report = measured(l, dev, d, ctx, exact);
    else
        missed(dev, d, found < 0);
    __atomic_sub_fetch(&ct_budget_ctx_first, 1, __ATOMIC_ACQ_REL);
    if (report && ctx_report)
        ctx_report(dev, ctx);
}

/* MEASURED or GIVEN_UP, a second after the last reading: read it again (a context grows as
 * modules load) */
static void measure_again(ct_ledger *l, int dev, struct ctx_dev *d)
{
    uint64_t mine = __atomic_load_n(&d->counted, __ATOMIC_RELAXED), ctx = 0;
    int exact = 0;
    int found = ops->nvml_start() ? measure(l, dev, mine, &ctx, &exact) : -1;
    if (found != 1)
        missed(dev, d, found < 0);
    else if (measured(l, dev, d, ctx, exact) && ctx_report)
        ctx_report(dev, ctx);
}

/* before dev's first figure: an allocation waits for it, until the deadline of the state it is
 * in; while the deadline is not set (the thread that claimed the measurement has not set it
 * yet), 10 s at most */
static void hold(struct ctx_dev *d)
{
    unsigned waits = 0;
    uint64_t limit = ops->now() + CTX_MEASURE_NS;
    uint32_t s;
    while ((s = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE)) < CT_CTX_MEASURED) {
        uint64_t until = __atomic_load_n(
            s == CT_CTX_UNLISTED ? &d->unlisted_until : &d->measure_until, __ATOMIC_ACQUIRE);
        uint64_t now = ops->now();
        if ((until && now >= until) || now >= limit)
            return;
        ctx_pause(&waits);
    }
}

void ct_ctxhold_count(ct_ledger *l, int dev)
{
    if (!l || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return;
    struct ctx_dev *d = &ctx_devs[dev];
    uint32_t s = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (s >= CT_CTX_MEASURED) { /* counted, or nothing to count: read again once a second */
        uint64_t now = ops->now(), due = __atomic_load_n(&d->next_ns, __ATOMIC_RELAXED);
        if (now >= due && __atomic_compare_exchange_n(&d->next_ns, &due, now + CTX_PERIOD_NS, 0,
                                                      __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            measure_again(l, dev, d);
        return;
    }
    if (s != CT_CTX_MEASURING && claim_first(dev, d, s, ops->now()))
        measure_first(l, dev, d);
    else
        hold(d); /* another thread measures: wait for its figure */
}

/* Frees wait while a device's first figure is read: a free the device has taken back and the
 * ledger not yet makes the reading low (10 s at most, as allocations). */
void ct_budget_free_wait(void)
{
    unsigned waits = 0;
    uint64_t until = ops->now() + CTX_MEASURE_NS;
    while (__atomic_load_n(&ct_budget_ctx_first, __ATOMIC_ACQUIRE) && ops->now() < until)
        ctx_pause(&waits);
}

void ct_ctxhold_watch(int dev, uint64_t (*held)(int dev), uint64_t pending)
{
    if (dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return;
    struct ctx_dev *d = &ctx_devs[dev];
    if (__atomic_load_n(&d->state, __ATOMIC_ACQUIRE) == CT_CTX_GIVEN_UP)
        return;
    uint64_t now = ops->now(), due = __atomic_load_n(&d->next_ns, __ATOMIC_RELAXED);
    if (now < due || !__atomic_compare_exchange_n(&d->next_ns, &due, now + CTX_PERIOD_NS, 0,
                                                  __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return; /* measured less than a second ago, or by another thread now */
    if (!ops->nvml_start()) {
        missed(dev, d, 1); /* no NVML: nothing to record */
        return;
    }
    uint64_t r0, r1, used = 0;
    uint32_t b0 = ops->calls(&r0);
    uint64_t h0 = held(dev) + pending;
    int found = ops->nvml_used(dev, &used);
    uint64_t h1 = held(dev) + pending;
    uint32_t b1 = ops->calls(&r1);
    if (found != 1) {
        missed(dev, d, found < 0);
        return;
    }
    if (b0 || b1 || r0 != r1 || h0 != h1) { /* another call was under way: again soon */
        __atomic_store_n(&d->next_ns, now + CTX_RETRY_NS, __ATOMIC_RELAXED);
        return;
    }
    uint64_t ctx = ((used > h0 ? used - h0 : 0) + 1023) & ~1023ull; /* in KiB, as the ledger */
    if (ctx > __atomic_load_n(&d->counted, __ATOMIC_RELAXED)) {
        __atomic_store_n(&d->counted, ctx, __ATOMIC_RELAXED);
        if (ctx_report)
            ctx_report(dev, ctx);
    }
}

/* every device back to UNSET: measured anew at its next counted allocation */
static void ctx_reset(void)
{
    for (int dev = 0; dev < CT_LEDGER_MAX_DEVICES; dev++) {
        struct ctx_dev *d = &ctx_devs[dev];
        __atomic_store_n(&d->counted, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&d->misses, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&d->next_ns, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&d->measure_until, 0, __ATOMIC_RELEASE); /* a stale one ends no hold */
        __atomic_store_n(&d->unlisted_until, 0, __ATOMIC_RELEASE);
        move(dev, d, CT_CTX_UNSET);
    }
}

void ct_ctxhold_forget(void) { ctx_reset(); }

void ct_ctxhold_atfork_child(void)
{
    ct_budget_ctx_first = 0;
    ct_budget_inflight = 0; /* the parent's other threads' calls are not the child's */
    ctx_reset();
}
