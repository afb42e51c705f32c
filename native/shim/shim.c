/* shim.c - the interposer's wrappers (generated from hooks.def), the protocol of one hooked
 * call (enter, budget check, real call, event, leave), the opening records of a trace, and the
 * lifecycle (load, fork, exit). How calls reach the wrappers: entry.h.
 * Runtime (cuda*) hooks only tag the driver events that happen inside them, so each allocation
 * is counted once, at the driver layer. A thread-local depth guard makes nested driver calls
 * pass straight through. With CUDATRACE_DIR unset the shim is pure pass-through.
 */
#include "shim.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "aggregate.h"
#include "budget.h"
#include "cuda_abi.h"
#include "deny.h"
#include "events.h"
#include "fence.h"
#include "live.h"
#include "modules.h"
#include "pyframes.h"
#include "route.h"
#include "stacks.h"
#include "trace_format.h"
#include "util.h"
#include "writer.h"

/* ---- expressions of hooks.def -------------------------------------------------------------- */
static inline uint64_t ct_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static uint64_t ct_array2d_bytes(const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!d)
        return 0;
    return (uint64_t)d->Width * (d->Height ? d->Height : 1) *
           (d->NumChannels ? d->NumChannels : 1) * ct_array_format_bytes(d->Format);
}

static uint64_t ct_array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
    if (!d)
        return 0;
    uint64_t w = d->Width, h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1, total = 0;
    uint64_t elem =
        (uint64_t)(d->NumChannels ? d->NumChannels : 1) * ct_array_format_bytes(d->Format);
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        total += w * h * z * elem;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        z = z > 1 ? z / 2 : 1;
    }
    return total;
}

/* clang-format off */
#define CT_OUT(p) ((p) ? (uint64_t)*(p) : 0)
#define CT_OUTP(p) ((p) ? (uint64_t)(uintptr_t)*(p) : 0)
/* clang-format on */

/* The device of the calling thread's current context. A context's device never changes, so the
 * thread remembers the one it last asked about: cuCtxGetCurrent (a thread-local read in the
 * driver) tells whether the context is still that one, and only a new context costs
 * cuCtxGetDevice. (The cache is per thread because the current context is; a context that ends
 * moves the epoch below, so a handle given again to another device's context is asked again.) */

static CUresult (*get_ctx)(CUcontext *);
static CUresult (*get_dev)(CUdevice *);

/* A context's device never changes, but a context can end and its handle come back as another
 * device's context: every call that may end one (hooks.def CT_OP_CTX_END) moves the epoch
 * first, and a thread drops what it learned in an earlier epoch. */
static uint32_t ctx_epoch;
static inline void ctx_answers_check(void)
{
    uint32_t now = __atomic_load_n(&ctx_epoch, __ATOMIC_ACQUIRE);
    if (__builtin_expect(ct_thr.ctx_epoch != now, 0)) {
        ct_thr.dev_ctx = ct_thr.sdev_ctx = 0;
        ct_thr.ctx_epoch = now;
    }
}
/* looked up by the first threads to need them, perhaps several at once: atomics, relaxed for
 * get_ctx (get_dev's release store publishes it) */
static void device_syms(void)
{
    __atomic_store_n(&get_ctx, (CUresult(*)(CUcontext *))ct_driver_sym("cuCtxGetCurrent"),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&get_dev, (CUresult(*)(CUdevice *))ct_driver_sym("cuCtxGetDevice"),
                     __ATOMIC_RELEASE);
}

static int current_device(void)
{
    CUresult (*gd)(CUdevice *) = __atomic_load_n(&get_dev, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!gd, 0)) {
        device_syms();
        gd = __atomic_load_n(&get_dev, __ATOMIC_ACQUIRE);
    }
    ctx_answers_check();
    CUcontext ctx = NULL;
    CUresult (*gc)(CUcontext *) = __atomic_load_n(&get_ctx, __ATOMIC_RELAXED);
    if (gc && gc(&ctx) == CUDA_SUCCESS && ctx && (uintptr_t)ctx == ct_thr.dev_ctx)
        return ct_thr.dev;
    CUdevice d = -1;
    if (!gd || gd(&d) != CUDA_SUCCESS)
        return -1;
    ct_thr.dev_ctx = (uintptr_t)ctx;
    ct_thr.dev = d;
    return d;
}

/* The device of context ctx, which need not be current: cuCtxGetDevice_v2 where the driver has
 * it (CUDA 13), else ctx made current for the question and the thread's own put back. -1: the
 * driver could not say. */
static int context_device(CUcontext ctx)
{
    static CUresult (*get_dev2)(CUdevice *, CUcontext);
    static CUresult (*push)(CUcontext), (*pop)(CUcontext *);
    static int looked; /* several threads may look them up at once: atomics, relaxed */
    if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&get_dev2,
                         (CUresult(*)(CUdevice *, CUcontext))ct_driver_sym("cuCtxGetDevice_v2"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&push, (CUresult(*)(CUcontext))ct_driver_sym("cuCtxPushCurrent_v2"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&pop, (CUresult(*)(CUcontext *))ct_driver_sym("cuCtxPopCurrent_v2"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    CUresult (*gd2)(CUdevice *, CUcontext) = __atomic_load_n(&get_dev2, __ATOMIC_RELAXED);
    CUresult (*gd)(CUdevice *) = __atomic_load_n(&get_dev, __ATOMIC_ACQUIRE);
    CUresult (*pu)(CUcontext) = __atomic_load_n(&push, __ATOMIC_RELAXED);
    CUresult (*po)(CUcontext *) = __atomic_load_n(&pop, __ATOMIC_RELAXED);
    CUdevice d = -1;
    if (gd2)
        return gd2(&d, ctx) == CUDA_SUCCESS ? d : -1;
    if (!gd || !pu || !po || pu(ctx) != CUDA_SUCCESS)
        return -1;
    CUresult r = gd(&d);
    CUcontext back;
    po(&back);
    return r == CUDA_SUCCESS ? d : -1;
}

/* The device a stream-ordered allocation on stream s comes from: the stream's (the pool current
 * to the stream's device, the driver's rule), which need not be the current context's. -1 for
 * the NULL, legacy and per-thread streams (the current context's: current_device) or when the
 * driver cannot say. cuStreamGetCtx costs what cuCtxGetCurrent does, and is allowed while the
 * stream is being captured; the thread remembers the device of the last other context. */
static int stream_device_of(CUstream s)
{
    static CUresult (*get_sctx)(CUstream, CUcontext *);
    static int looked;
    if (__builtin_expect(!__atomic_load_n(&looked, __ATOMIC_ACQUIRE), 0)) {
        if (!__atomic_load_n(&get_dev, __ATOMIC_ACQUIRE))
            device_syms();
        __atomic_store_n(&get_sctx,
                         (CUresult(*)(CUstream, CUcontext *))ct_driver_sym("cuStreamGetCtx"),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    ctx_answers_check();
    CUcontext ctx = NULL;
    CUresult (*gs)(CUstream, CUcontext *) = __atomic_load_n(&get_sctx, __ATOMIC_RELAXED);
    if (!gs || gs(s, &ctx) != CUDA_SUCCESS || !ctx)
        return -1;
    if ((uintptr_t)ctx == ct_thr.dev_ctx)
        return ct_thr.dev;
    if ((uintptr_t)ctx == ct_thr.sdev_ctx)
        return ct_thr.sdev;
    int d = context_device(ctx);
    if (d >= 0) {
        ct_thr.sdev_ctx = (uintptr_t)ctx;
        ct_thr.sdev = d;
    }
    return d;
}
static inline int stream_device(CUstream s)
{
    /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the current context's */
    return (uintptr_t)s <= 2 ? -1 : stream_device_of(s);
}

/* ---- where a pool's memory lives ---------------------------------------------------------
 * No driver call tells a pool's location, so the shim notes it where a pool is made or named
 * (hooks.def's CT_OP_POOL calls: cuMemPoolCreate's properties, a device's default or current
 * pool, a location's) in a process-wide lock-free table: pool -> what its allocations are. A
 * handle the driver gives out again after cuMemPoolDestroy is noted again when it is made, so
 * the entry of a live pool is never another pool's. */
#define POOL_SLOTS 1024          /* pools alive at once: a destroyed pool's slot is taken again */
#define POOL_GONE ((uintptr_t)1) /* a slot whose pool was destroyed */
static struct {
    uintptr_t pool;
    uint32_t what; /* 0: not yet written; else (device + 2) << 8 | kind */
} pools[POOL_SLOTS];

static unsigned pool_home(uintptr_t pool)
{
    return (unsigned)(((uint64_t)pool * 0x9E3779B97F4A7C15ull) >> 54) % POOL_SLOTS;
}

/* the pool's slot index: found, or claimed for it when claim (an empty or a destroyed pool's
 * slot); -1 when absent (or the table full, or no pool: 0 marks an empty slot) */
static int pool_index(uintptr_t pool, int claim)
{
    if (pool <= POOL_GONE)
        return -1;
    unsigned k0 = pool_home(pool);
    for (unsigned i = 0, k = k0; i < POOL_SLOTS; i++, k = (k + 1) % POOL_SLOTS) {
        uintptr_t cur = __atomic_load_n(&pools[k].pool, __ATOMIC_ACQUIRE);
        if (cur == pool)
            return (int)k;
        if (cur == 0)
            break;
    }
    for (unsigned i = 0, k = k0; claim && i < POOL_SLOTS; i++, k = (k + 1) % POOL_SLOTS) {
        uintptr_t cur = __atomic_load_n(&pools[k].pool, __ATOMIC_ACQUIRE);
        if ((cur == 0 || cur == POOL_GONE) &&
            __atomic_compare_exchange_n(&pools[k].pool, &cur, pool, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return (int)k;
        if (cur == pool) /* found, or claimed by another thread meanwhile */
            return (int)k;
    }
    return -1;
}

static uint32_t *pool_slot(uintptr_t pool, int claim)
{
    int k = pool_index(pool, claim);
    return k < 0 ? NULL : &pools[k].what;
}

/* cuMemPoolDestroy, before the call: what the table knew of the pool (0: nothing), its slot
 * freed (a handle the driver gives out again is noted again when it is made) */
static uint32_t pool_forget(uintptr_t pool)
{
    int k = pool_index(pool, 0);
    if (k < 0)
        return 0;
    uint32_t what = __atomic_exchange_n(&pools[k].what, 0, __ATOMIC_ACQ_REL);
    uintptr_t cur = pool;
    __atomic_compare_exchange_n(&pools[k].pool, &cur, POOL_GONE, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    return what;
}

/* the destroy failed: the pool lives on as it was */
static void pool_restore(uintptr_t pool, uint32_t what)
{
    uint32_t *slot = pool_slot(pool, 1);
    if (slot && what)
        __atomic_store_n(slot, what, __ATOMIC_RELEASE);
}

static int location_is_host(int type)
{
    return type == CU_MEM_LOCATION_TYPE_HOST || type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
           type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

static int location_dev(int type, int id)
{
    return type == CU_MEM_LOCATION_TYPE_DEVICE && id >= 0 && id < (1 << 20) ? id : -1;
}

/* a pool was made or named: its allocations are pinned memory at (loc_type, loc_id), or managed
 * memory (alloc_type). Device memory: its device; a host location (host, a host NUMA node):
 * pinned host memory (CT_KIND_HOST, counted as cuMemHostAlloc's is); managed: CT_KIND_MANAGED,
 * on the device it prefers if one */
static int pool_note(uintptr_t pool, int loc_type, int loc_id, int alloc_type)
{
    int kind = alloc_type == CU_MEM_ALLOCATION_TYPE_MANAGED ? CT_KIND_MANAGED
               : location_is_host(loc_type)                 ? CT_KIND_HOST
                                                            : CT_KIND_ASYNC;
    int dev = location_dev(loc_type, loc_id);
    uint32_t *what = pool_slot(pool, 1);
    if (what)
        __atomic_store_n(what, (uint32_t)(dev + 2) << 8 | (uint32_t)kind, __ATOMIC_RELEASE);
    return what != NULL;
}

/* A pool made or named while POOL_SLOTS pools live cannot be noted: under a budget its
 * allocations would be charged to another device, so the call is refused (a pool made is
 * destroyed again) with a line; without one, its allocations are recorded on their stream's
 * device. Returns the call's result. */
__attribute__((noinline)) static CUresult pool_unnoted(uint16_t api, uintptr_t pool)
{
    static int said;
    int budget = ct_budget_on();
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        ct_log("more than 1024 memory pools are alive: ",
               budget ? "a new one is refused (CUDA_ERROR_OUT_OF_MEMORY), as the budget could "
                        "not tell its device"
                      : "a new one's allocations are recorded on their stream's device",
               NULL, NULL);
    if (!budget)
        return CUDA_SUCCESS;
    if (api == CT_API_cuMemPoolCreate) {
        CUresult (*destroy)(CUmemoryPool) =
            (CUresult(*)(CUmemoryPool))ct_real(CT_SLOT_cuMemPoolDestroy);
        if (destroy)
            destroy((CUmemoryPool)pool);
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* ---- one hooked call ------------------------------------------------------------------ */
/* The call's fields are the event's own (a union with struct ct_event, same layout): the
 * wrapper fills them in place and emit adds the time, the thread and the op, no copy. */
struct ct_call {
    union {
        struct ct_event ev;
        struct {
            uint64_t ts; /* 0: stamp the event when it is written; a free's: before its real call */
            uint64_t size, addr, aux, aux2;
            uint32_t ev_tid;
            int32_t dev;
            int32_t result;
            uint32_t stack;
            uint16_t api, ev_rt_api;
            uint8_t ev_op, kind, space, flags;
            uint32_t ev_reserved;
        };
    };
    uint64_t reserve;
    struct ct_caller caller;   /* where the program's frames start (stacks.h) */
    uint8_t op, held, stacked; /* held: the budget holds c->reserve for this call */
    uint8_t inflight;          /* counted in ct_budget_inflight until post_budget */
    struct ct_live_taken live; /* a free: what it took out of the live counters (live.h) */
};
_Static_assert(
    __builtin_offsetof(struct ct_call, dev) == __builtin_offsetof(struct ct_event, device) &&
        __builtin_offsetof(struct ct_call, result) == __builtin_offsetof(struct ct_event, result) &&
        __builtin_offsetof(struct ct_call, api) == __builtin_offsetof(struct ct_event, api) &&
        __builtin_offsetof(struct ct_call, flags) == __builtin_offsetof(struct ct_event, flags) &&
        __builtin_offsetof(struct ct_call, ev_reserved) ==
            __builtin_offsetof(struct ct_event, reserved),
    "struct ct_call's fields are struct ct_event's");

/* The device memory made at loc lives on (cuMemCreate's, a graph's allocation node's): a
 * device's ordinal; a host location makes it pinned host memory (the call's kind becomes
 * CT_KIND_HOST, counted as cuMemHostAlloc's is) of the current context's device (-1) */
static int location_device(struct ct_call *c, const CUmemLocation *loc)
{
    if (location_is_host(loc->type))
        c->kind = CT_KIND_HOST;
    return location_dev(loc->type, loc->id);
}

/* The device an allocation from pool on stream s is on (and, for a host or managed pool, the
 * call's kind): the pool's as noted; a pool never noted (imported from another process) is
 * taken for the stream's device's, as cuMemAllocAsync's allocation is. */
static int pool_device(struct ct_call *c, CUmemoryPool pool, CUstream s)
{
    uint32_t *slot = pool_slot((uintptr_t)pool, 0);
    uint32_t what = slot ? __atomic_load_n(slot, __ATOMIC_ACQUIRE) : 0;
    if (!what)
        return stream_device(s);
    c->kind = (uint8_t)(what & 0xff);
    return (int)(what >> 8) - 2;
}

static inline __attribute__((always_inline)) void emit(struct ct_call *c, uint8_t op)
{
    if (ct_cfg.mode == CT_MODE_NONE)
        return;
    struct ct_event *e = &c->ev;
    if (!e->ts_ns)
        e->ts_ns = ct_now_ns();
    e->tid = ct_gettid();
    e->rt_api = ct_thr.rt_api;
    e->op = op;
    e->flags |= ct_thr.rt_api ? CT_EF_RUNTIME_KNOWN : 0;
    if (ct_cfg.mode == CT_MODE_AGGREGATE ? ct_agg_event(e) : ct_event_write(e))
        __atomic_add_fetch(&ct_events_written, 1, __ATOMIC_RELAXED);
}

static void init_once(void);
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int init_done; /* init_once has run (the hot path tests it before pthread_once) */

/* exit(status) runs on_exit handlers, then the loader's destructors (ours among them) — but
 * only handlers registered after the loader's own, i.e. once main() runs. So the handler is
 * registered at the first hooked call, and the END record carries the status. (_exit and death
 * by signal skip both: the file then reads as truncated.) */
static int exit_status = -1;
static int exit_hooked;
static void on_exit_handler(int status, void *arg)
{
    (void)arg;
    exit_status = status;
}

static inline int ct_enter(struct ct_call *c, uint16_t api, uint8_t op, uint8_t kind, uint8_t space,
                           uint8_t flags)
{
    if (__builtin_expect(!__atomic_load_n(&init_done, __ATOMIC_ACQUIRE), 0))
        pthread_once(&once, init_once);
    if (!ct_cfg.active || ct_thr.depth)
        return 0;
    if (__builtin_expect(!__atomic_load_n(&exit_hooked, __ATOMIC_RELAXED), 0) &&
        !__atomic_exchange_n(&exit_hooked, 1, __ATOMIC_ACQ_REL))
        on_exit(on_exit_handler, NULL);
    ct_thr.depth++;
    c->ev =
        (struct ct_event){.device = -1, .api = api, .kind = kind, .space = space, .flags = flags};
    c->reserve = 0;
    c->caller.sp = 0;
    c->op = op;
    c->held = c->stacked = c->inflight = c->live.state = 0;
    return 1;
}

static inline void ct_leave(void) { ct_thr.depth--; }

/* Budget lines are rate-limited per call site: the first DENY_LINES of a site are printed, then
 * one line at its 10th, 100th, 1000th ... denial with the count (a loop retrying a denied
 * allocation would otherwise print one line per try). Lock-free: a small open-addressed table of
 * sites; a site that finds the table full is counted with the others in slot 0's overflow. */
#define DENY_LINES 3
#define DENY_SITES 64
static struct {
    uintptr_t ip;
    uint64_t n;
} deny_sites[DENY_SITES];

/* 0: stay silent; 1: print the line; 2: print it with the count (n) */
static int deny_rate(uintptr_t ip, uint64_t *n)
{
    uintptr_t key = ip ? ip : 1;
    for (unsigned i = 0; i < DENY_SITES; i++) {
        unsigned k = (unsigned)((key >> 4) + i) % DENY_SITES;
        uintptr_t cur = __atomic_load_n(&deny_sites[k].ip, __ATOMIC_ACQUIRE);
        if (cur == 0) {
            uintptr_t zero = 0;
            if (__atomic_compare_exchange_n(&deny_sites[k].ip, &zero, key, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                cur = key;
            else
                cur = zero;
        }
        if (cur != key)
            continue;
        *n = __atomic_add_fetch(&deny_sites[k].n, 1, __ATOMIC_RELAXED);
        if (*n <= DENY_LINES)
            return 1;
        for (uint64_t p = 10; p && p <= *n; p *= 10)
            if (p == *n)
                return 2;
        return 0;
    }
    *n = 0;
    return 1;
}

/* The denial line names the code at the moment of the denial (deny.c): the boundary rule over
 * the denied call's frames names the code above the allocator (`at CacheBuffer::CacheBuffer
 * (app+0x1234) via vt::Alloc > vt::cuda::(anon)::AllocOnDevice, called from ...`), or, when
 * the frames show no boundary, the raw path from the first frame outside CUDA, innermost
 * first. The launcher prints the attributed line as soon as it reads the DENY record
 * (docs/attribution.md). Printed under CUDATRACE_QUIET too: -q silences chatter, never the
 * reason a program failed (the rate limit applies). */
#define DENY_PATH_FRAMES 48 /* a framework (libtorch: ~25 frames) up to the program */

static uint64_t ctx_bytes[CT_LEDGER_MAX_DEVICES]; /* this process's context, as counted */

/* what the in-use figure is made of: "(allocations X, CUDA contexts Y of N processes)", and
 * when this process's context alone fills the budget, that every allocation will be denied */
static void write_info(const char *key, const char *value);

static size_t in_use_parts(char *out, size_t cap, int dev, uint64_t in_use, uint64_t limit)
{
    struct ct_ledger_view *v = malloc(sizeof *v); /* cold path: large, not on the stack */
    uint64_t ctx = 0, procs = 0;
    if (v && ct_ledger_snapshot(ct_budget_ledger, v) == CT_LEDGER_OK)
        for (uint32_t i = 0; i < v->nmembers; i++)
            if (v->members[i].context[dev]) {
                ctx += v->members[i].context[dev];
                procs++;
            }
    free(v);
    char num[48], key[40] = "deny_contexts.";
    size_t l = 0;
    /* what the group's contexts were at this denial: the launcher's attributed line says the
     * same figure (present/denials.py), not only this run's own contexts */
    ct_fmt_u64(key + 14, (uint64_t)dev);
    ct_fmt_u64(num, ctx);
    write_info(key, num);
    if (!ctx)
        return 0;
    if (ctx > in_use)
        ctx = in_use;
    l += ct_strlcpy(out + l, " (allocations ", cap - l);
    ct_fmt_bytes(num, in_use - ctx);
    l += ct_strlcpy(out + l, num, cap - l);
    l += ct_strlcpy(out + l, ", CUDA contexts ", cap - l);
    ct_fmt_bytes(num, ctx);
    l += ct_strlcpy(out + l, num, cap - l);
    l += ct_strlcpy(out + l, " of ", cap - l);
    ct_fmt_u64(num, procs);
    l += ct_strlcpy(out + l, num, cap - l);
    l += ct_strlcpy(out + l, procs == 1 ? " process)" : " processes)", cap - l);
    uint64_t mine = dev >= 0 && dev < CT_LEDGER_MAX_DEVICES ? ctx_bytes[dev] : 0;
    if (mine && mine >= limit) {
        l += ct_strlcpy(out + l, "; the budget is below this process's CUDA context (", cap - l);
        ct_fmt_bytes(num, mine);
        l += ct_strlcpy(out + l, num, cap - l);
        l += ct_strlcpy(out + l,
                        "), which it counts: every allocation will be denied; give a budget "
                        "above the context plus what the program allocates",
                        cap - l);
    }
    return l < cap ? l : cap - 1;
}

static void deny_message(struct ct_call *c, uint64_t in_use, uint64_t limit, const char *verdict)
{
    char line[2400], num[48], site[1200], parts[400];
    uintptr_t ips[DENY_PATH_FRAMES];
    int n = ct_stack_user_frames(ips, DENY_PATH_FRAMES);
    uint64_t count = 0;
    /* a site is its native call and, from Python, its Python stack (one ctypes call serves all) */
    int how = deny_rate((n > 0 ? ips[0] : 0) ^ (uintptr_t)ct_py_stack_key(), &count);
    if (how == 0 && ct_cfg.on_exceed != CT_EXCEED_ABORT)
        return;
    if (n > 0)
        ct_deny_describe(ips, n, site, sizeof site);
    else
        ct_strlcpy(site,
                   ct_cfg.stack_depth > 0 ? "unknown call site (its stack could not be read)"
                                          : "unknown call site (stacks off: --stack-depth 0)",
                   sizeof site);
    parts[0] = 0;
    in_use_parts(parts, sizeof parts, c->dev < 0 ? 0 : c->dev, in_use, limit);
    size_t l = ct_strlcpy(line, "cudatrace: budget exceeded: ", sizeof line);
    l += ct_strlcpy(line + l, ct_api_name(c->api), sizeof line - l);
    if (ct_thr.rt_api) {
        l += ct_strlcpy(line + l, " (", sizeof line - l);
        l += ct_strlcpy(line + l, ct_api_name(ct_thr.rt_api), sizeof line - l);
        l += ct_strlcpy(line + l, ")", sizeof line - l);
    }
    l += ct_strlcpy(line + l, " of ", sizeof line - l);
    ct_fmt_bytes(num, c->reserve);
    l += ct_strlcpy(line + l, num, sizeof line - l);
    l += ct_strlcpy(line + l, " on device ", sizeof line - l);
    ct_fmt_u64(num, (uint64_t)(c->dev < 0 ? 0 : c->dev));
    l += ct_strlcpy(line + l, num, sizeof line - l);
    l += ct_strlcpy(line + l, ": budget ", sizeof line - l);
    ct_fmt_bytes(num, limit);
    l += ct_strlcpy(line + l, num, sizeof line - l);
    if (ct_budget_share_label()[0]) { /* which job's share, or the whole group's budget */
        l += ct_strlcpy(line + l, ct_thr.deny_share ? " (share of " : " (whole group; ",
                        sizeof line - l);
        l += ct_strlcpy(line + l, ct_budget_share_label(), sizeof line - l);
        l += ct_strlcpy(line + l, ")", sizeof line - l);
    }
    l += ct_strlcpy(line + l, ", in use ", sizeof line - l);
    ct_fmt_bytes(num, in_use);
    l += ct_strlcpy(line + l, num, sizeof line - l);
    l += ct_strlcpy(line + l, parts, sizeof line - l);
    l += ct_strlcpy(line + l, "; at ", sizeof line - l);
    l += ct_strlcpy(line + l, site, sizeof line - l);
    l += ct_strlcpy(line + l, "; ", sizeof line - l);
    l += ct_strlcpy(line + l, verdict, sizeof line - l);
    if (how == 2 || (how == 1 && count == DENY_LINES)) {
        l += ct_strlcpy(line + l, " [", sizeof line - l);
        ct_fmt_u64(num, count);
        l += ct_strlcpy(line + l, num, sizeof line - l);
        l += ct_strlcpy(line + l,
                        how == 2 ? " at this site so far; lines for it are rate-limited]"
                                 : " at this site; further lines only at its 10th, 100th, ...]",
                        sizeof line - l);
    }
    if (l > sizeof line - 2)
        l = sizeof line - 2;
    /* names come from the program's binaries: data, never terminal control (\xNN, as the
     * reports escape them) */
    char safe[sizeof line * 4 + 2];
    size_t k = 0;
    for (size_t i = 0; i < l; i++) {
        unsigned char ch = (unsigned char)line[i];
        if (ch < 0x20 || ch == 0x7f) {
            static const char hex[] = "0123456789abcdef";
            safe[k++] = '\\';
            safe[k++] = 'x';
            safe[k++] = hex[ch >> 4];
            safe[k++] = hex[ch & 15];
        } else
            safe[k++] = (char)ch;
    }
    safe[k++] = '\n';
    ssize_t r = write(2, safe, k);
    (void)r;
}

/* fencing cannot be set up (budget.c): the call is refused */
static int fence_refuse(struct ct_call *c)
{
    c->result = CUDA_ERROR_NOT_PERMITTED;
    return 0;
}

/* a reservation that cannot be made (r < 0): 1 when the call is to be refused */
__attribute__((noinline)) static int fence_broken(struct ct_call *c, int r)
{
    char num[24];
    ct_fmt_u64(num, (uint64_t)(c->dev < 0 ? 0 : c->dev));
    if (r == CT_LEDGER_ENODEV)
        return ct_budget_fence_failed("the budget ledger counts devices 0 to 15, not device ", num);
    return ct_budget_fence_failed("this process lost its place in the budget ledger and cannot "
                                  "join again: ",
                                  ct_ledger_strerror(CT_LEDGER_EFULL));
}

/* before the real call: reserve against the budget. 0: denied, c->result holds the answer */
static int ct_pre(struct ct_call *c)
{
    ct_ledger *ledger = c->reserve ? ct_budget_ensure() : NULL; /* joins an env group lazily */
    if (!ledger)
        return ct_budget_refusing() ? fence_refuse(c) : 1;
    if (c->dev < 0)
        c->dev = current_device();
    int dev = c->dev < 0 ? 0 : c->dev;
    if (!ct_budget_counted(c->kind, dev))
        return 1;
    ct_budget_context(dev); /* the context first: the allocation must fit beside it */
    uint64_t in_use = 0, limit = 0;
    int r = ct_ledger_reserve(ledger, dev, c->reserve, &in_use, &limit);
    if (r == CT_LEDGER_ENOTMEMBER && ct_budget_rejoin())
        r = ct_ledger_reserve(ledger, dev, c->reserve, &in_use, &limit);
    if (r == 1) {
        c->held = c->inflight = 1;
        ct_budget_call_begins(c->reserve);
        return 1;
    }
    if (r < 0) /* not a member any more (slots full), or a device the ledger cannot count */
        return fence_broken(c, r) ? fence_refuse(c) : 1;
    ct_thr.deny_share = r == CT_LEDGER_DENIED_SHARE;
    c->stack = ct_stack_capture(&c->caller);
    c->stacked = 1;
    if (ct_cfg.on_exceed == CT_EXCEED_WARN) {
        ct_ledger_force(ledger, dev, c->reserve);
        c->held = c->inflight = 1;
        ct_budget_call_begins(c->reserve);
        c->flags |= CT_EF_BUDGET_WARN;
        deny_message(c, in_use, limit, "allowed (--on-exceed warn)");
        return 1;
    }
    c->result = CUDA_ERROR_OUT_OF_MEMORY;
    c->size = c->reserve;
    c->aux = limit;
    c->aux2 = in_use;
    ct_live_deny(dev);
    emit(c, CT_OP_DENY);
    if (ct_cfg.on_exceed == CT_EXCEED_ABORT) {
        deny_message(c, in_use, limit, "stopping the process tree (--on-exceed abort)");
        if (ct_cfg.launcher_pid > 0)
            kill(ct_cfg.launcher_pid, SIGUSR2);
        if (ct_cfg.mode == CT_MODE_AGGREGATE)
            ct_agg_final();
        ct_writer_close(128 + SIGABRT);
        abort();
    }
    deny_message(c, in_use, limit, "returned CUDA_ERROR_OUT_OF_MEMORY");
    return 0;
}

/* the ledger and the device agree again about this call (budget.h ct_budget_inflight) */
static inline void call_settled(struct ct_call *c)
{
    if (c->inflight) {
        c->inflight = 0;
        ct_budget_call_ends();
    }
}

/* what this process holds on dev, by its live counters (CT_LIVE_DEVICES rows) */
static uint64_t live_held(int dev)
{
    return __atomic_load_n(&ct_live.dev[dev].live, __ATOMIC_ACQUIRE);
}

/* CUDATRACE_RECORD_CONTEXTS without a budget: the call is settled; after an allocation, the
 * context is measured as a budget would count it (budget.c), into the trace (the allocation
 * enters the live counters right after: its bytes are added) */
__attribute__((noinline)) static void context_watch(struct ct_call *c)
{
    call_settled(c);
    if (c->op != CT_OP_ALLOC || c->result != CUDA_SUCCESS || c->kind == CT_KIND_HOST)
        return;
    if (c->dev < 0)
        c->dev = current_device();
    if (c->dev >= 0 && c->dev < CT_LIVE_DEVICES)
        ct_budget_context_watch(c->dev, live_held, c->size);
}

/* after the real call, with a budget: settle it (kept apart: the common path has none) */
__attribute__((noinline)) static void post_budget(struct ct_call *c)
{
    /* acquire: the ledger is read through, and another thread may have just published it */
    ct_ledger *ledger = __atomic_load_n(&ct_budget_ledger, __ATOMIC_ACQUIRE);
    if (!ledger && !c->held) { /* no budget: a call bracketed for ct_cfg.ctx_watch */
        context_watch(c);
        return;
    }
    if (c->op == CT_OP_ALLOC && c->held) {
        int dev = c->dev < 0 ? 0 : c->dev;
        if (c->result != CUDA_SUCCESS) {
            ct_ledger_release(ledger, dev, c->reserve);
        } else {
            if (c->size > c->reserve)
                ct_ledger_force(ledger, dev, c->size - c->reserve);
            else if (c->size < c->reserve)
                ct_ledger_release(ledger, dev, c->reserve - c->size);
            if (!ct_budget_track(c->addr, c->space, c->size, dev))
                ct_ledger_release(ledger, dev, c->size); /* cannot track it: never leak budget */
            call_settled(c);
            ct_budget_context(dev); /* the call may have made the context */
        }
    } else if (c->op == CT_OP_FREE && ledger && c->result == CUDA_SUCCESS) {
        uint64_t size = 0;
        int dev = 0;
        if (ct_budget_untrack(c->addr, c->space, &size, &dev))
            ct_ledger_release(ledger, dev, size);
        c->size = size;
    } else if (c->op == CT_OP_MAP && ledger && c->result == CUDA_SUCCESS) {
        ct_budget_map(c->addr, c->size, c->aux);
    } else if (c->op == CT_OP_UNMAP && ledger && c->result == CUDA_SUCCESS) {
        ct_budget_unmap(c->addr, c->size);
    }
    call_settled(c);
}

/* after the real call: settle the budget (with one), the live counters, then the event */
static void ct_post(struct ct_call *c)
{
    /* a plain load of the ledger, as the free's below: it only gates post_budget, which loads
     * it again with acquire (a relaxed atomic load costs an instruction on every call here:
     * GCC does not fold it into the compare; tools/bench_callgrind.sh) */
    if (__builtin_expect(c->held || c->inflight || ct_budget_ledger, 0))
        post_budget(c);
    if (c->op == CT_OP_ALLOC) { /* the live counters (live.c): what the program can read */
        if (c->dev < 0)
            c->dev = current_device();
        ct_live_alloc(c->kind, c->space, c->dev, c->addr, c->size, c->result);
    } else if (c->op == CT_OP_MAP && c->result == CUDA_SUCCESS) {
        ct_live_map(c->addr, c->size, c->aux);
    }
    if (ct_cfg.mode == CT_MODE_NONE) { /* --no-trace: the ledger was all there was to do */
        ct_leave();
        return;
    }
    if (c->dev < 0)
        c->dev = current_device();
    if (!c->stacked && (ct_cfg.stack_depth > 0 || !ct_writer_generation()))
        c->stack = ct_stack_capture(&c->caller);
    emit(c, c->op);
    ct_leave();
}

/* cuMemGetInfo: record what the device said and, with a budget, tell the budget instead */
static uint64_t ct_meminfo(struct ct_call *c, size_t *free_out, size_t *total_out)
{
    if (c->result != CUDA_SUCCESS)
        return 0;
    uint64_t rf = free_out ? *free_out : 0, rt = total_out ? *total_out : 0;
    c->aux = rf;
    c->aux2 = rt;
    c->addr = rf;
    c->dev = current_device();
    uint64_t vt = rt, vf = rf;
    if (ct_budget_virtualize(c->dev, &vt, &vf, free_out != NULL)) {
        if (free_out)
            *free_out = vf;
        if (total_out)
            *total_out = vt;
        c->flags |= CT_EF_VIRTUALIZED;
        c->addr = vf;
        return vt;
    }
    return rt;
}

/* ---- the generated wrappers ------------------------------------------------------------ */
#define CT_WRAPPER_BODY(ID, SLOT, FLAGS, OP, KIND, SPACE, PROTO, ARGS, RESERVE, SIZE, ADDR, AUX,   \
                        AUX2, DEV)                                                                 \
    {                                                                                              \
        typedef CUresult(*fn_t) PROTO;                                                             \
        fn_t real = (fn_t)ct_real(SLOT);                                                           \
        if (!real)                                                                                 \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        struct ct_call c;                                                                          \
        if (!ct_enter(&c, CT_API_##ID, OP, KIND, SPACE, FLAGS))                                    \
            return real ARGS;                                                                      \
        CT_CALLER(c.caller);                                                                       \
        c.reserve = (uint64_t)(RESERVE);                                                           \
        c.dev = (DEV);                                                                             \
        if (c.reserve && ct_budget_on() && !ct_pre(&c)) {                                          \
            ct_leave();                                                                            \
            return c.result;                                                                       \
        }                                                                                          \
        if ((OP) == CT_OP_INIT && ct_budget_on() && !ct_budget_cuinit()) {                         \
            ct_leave(); /* fencing asked for and impossible: refused (budget.c) */                 \
            return CUDA_ERROR_NOT_PERMITTED;                                                       \
        }                                                                                          \
        if ((OP) == CT_OP_CTX_END) /* before the handle can come back as another context */        \
            __atomic_add_fetch(&ctx_epoch, 1, __ATOMIC_ACQ_REL);                                   \
        uint32_t pool_was = (OP) == CT_OP_POOL_END ? pool_forget((uintptr_t)(ADDR)) : 0;           \
        if ((OP) == CT_OP_FREE || (OP) == CT_OP_UNMAP)                                             \
            c.ts = ct_now_ns();   /* before memory returns: no later allocation sorts first */     \
        if ((OP) == CT_OP_FREE) { /* the same for the live counters (a failure puts it back) */    \
            int live_dev = ct_live_freeing(SPACE, (uint64_t)(ADDR), &c.live);                      \
            if (c.dev < 0 && live_dev != CT_LIVE_UNKNOWN)                                          \
                c.dev = live_dev; /* the device it was allocated on */                             \
        }                                                                                          \
        if ((OP) == CT_OP_UNMAP)                                                                   \
            ct_live_unmapping((uint64_t)(ADDR), (uint64_t)(SIZE));                                 \
        if ((OP) == CT_OP_FREE && ct_cfg.mode == CT_MODE_AGGREGATE)                                \
            ct_agg_freeing(SPACE, (uint64_t)(ADDR));  /* the same, for --aggregate's own peak */   \
        if ((OP) == CT_OP_FREE && ct_budget_ledger) { /* until the ledger gives the bytes back */  \
            if (__builtin_expect(__atomic_load_n(&ct_budget_ctx_first, __ATOMIC_ACQUIRE), 0))      \
                ct_budget_free_wait();                                                             \
            c.inflight = 1;                                                                        \
            ct_budget_call_begins(0);                                                              \
        }                                                                                          \
        if (((OP) == CT_OP_ALLOC || (OP) == CT_OP_FREE) &&                                         \
            __builtin_expect(ct_cfg.ctx_watch, 0)) {                                               \
            c.inflight = 1; /* a context measured meanwhile is not exact (context_watch) */        \
            ct_budget_call_begins(1);                                                              \
        }                                                                                          \
        c.result = real ARGS;                                                                      \
        if ((OP) == CT_OP_FREE && __builtin_expect(c.result != CUDA_SUCCESS && c.live.state, 0))   \
            ct_live_unfree(SPACE, (uint64_t)(ADDR), &c.live);                                      \
        if ((OP) == CT_OP_UNMAP)                                                                   \
            ct_live_unmapped((uint64_t)(ADDR), (uint64_t)(SIZE), c.result == CUDA_SUCCESS);        \
        c.size = (uint64_t)(SIZE);                                                                 \
        if (c.result == CUDA_SUCCESS)                                                              \
            c.addr = (uint64_t)(ADDR);                                                             \
        c.aux = (uint64_t)(AUX);                                                                   \
        c.aux2 = (uint64_t)(AUX2);                                                                 \
        if ((OP) == CT_OP_POOL || (OP) == CT_OP_CTX_END || (OP) == CT_OP_INIT ||                   \
            (OP) == CT_OP_POOL_END) {                             /* no memory, no event */        \
            if ((OP) == CT_OP_POOL && c.result == CUDA_SUCCESS && /* where its allocations live */ \
                !pool_note((uintptr_t)c.addr, (int)c.aux, (int)c.aux2, (int)c.size))               \
                c.result = pool_unnoted(c.api, (uintptr_t)c.addr);                                 \
            if ((OP) == CT_OP_POOL_END && c.result != CUDA_SUCCESS && pool_was)                    \
                pool_restore((uintptr_t)(ADDR), pool_was);                                         \
            ct_leave();                                                                            \
            return c.result;                                                                       \
        }                                                                                          \
        ct_post(&c);                                                                               \
        return c.result;                                                                           \
    }

#define CT_PTSZ_EXPORT_0(ID)
#define CT_PTSZ_EXPORT_1(ID)                                                                       \
    extern __typeof__(ct_ptsz_##ID) ID##_ptsz                                                      \
        __attribute__((alias("ct_ptsz_" #ID), visibility("default")));

#define CT_DRIVER(ID, BASE, MINVER, PTSZ, OP, KIND, SPACE, PROTO, ARGS, RESERVE, SIZE, ADDR, AUX,  \
                  AUX2, DEV)                                                                       \
    CT_EXPORT CUresult ID PROTO CT_WRAPPER_BODY(ID, CT_SLOT_##ID, 0, OP, KIND, SPACE, PROTO, ARGS, \
                                                RESERVE, SIZE, ADDR, AUX, AUX2, DEV)               \
    CUresult ct_ptsz_##ID PROTO CT_WRAPPER_BODY(ID, CT_SLOT_##ID##_ptsz, CT_EF_PTSZ, OP, KIND,     \
                                                SPACE, PROTO, ARGS, RESERVE, SIZE, ADDR, AUX,      \
                                                AUX2, DEV) CT_PTSZ_EXPORT_##PTSZ(ID)
#define CT_RUNTIME(ID, PROTO, ARGS)                                                                \
    CT_EXPORT int ID PROTO                                                                         \
    {                                                                                              \
        typedef int(*fn_t) PROTO;                                                                  \
        fn_t real = (fn_t)ct_real(CT_SLOT_##ID);                                                   \
        if (!real)                                                                                 \
            return 3; /* cudaErrorInitializationError */                                           \
        uint16_t saved = ct_thr.rt_api;                                                            \
        ct_thr.rt_api = CT_API_##ID;                                                               \
        int r = real ARGS;                                                                         \
        ct_thr.rt_api = saved;                                                                     \
        return r;                                                                                  \
    }
#define CT_NVML(ID, PROTO, ARGS)
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML

/* ---- NVML memory queries -------------------------------------------------------------- */
static int nvml_index(nvmlDevice_t d)
{
    nvmlReturn_t (*get_index)(nvmlDevice_t, unsigned *) =
        (nvmlReturn_t(*)(nvmlDevice_t, unsigned *))ct_nvml_sym("nvmlDeviceGetIndex");
    unsigned idx;
    if (!get_index || get_index(d, &idx) != NVML_SUCCESS)
        return -1;
    return (int)idx;
}

/* rewrite NVML's figures to tell the budget; returns 1 if it did */
static int nvml_virtualize(int dev, unsigned long long *total, unsigned long long *free_,
                           unsigned long long *used)
{
    uint64_t vt = *total, vf = *free_;
    if (!ct_budget_virtualize(dev, &vt, &vf, 1))
        return 0;
    *total = vt;
    *free_ = vf;
    *used = vt - vf;
    return 1;
}

#define CT_NVML_BODY(ID, MEMTYPE)                                                                  \
    CT_EXPORT nvmlReturn_t ID(nvmlDevice_t device, MEMTYPE *memory)                                \
    {                                                                                              \
        typedef nvmlReturn_t (*fn_t)(nvmlDevice_t, MEMTYPE *);                                     \
        fn_t real = (fn_t)ct_real(CT_SLOT_##ID);                                                   \
        if (!real)                                                                                 \
            return 3; /* NVML_ERROR_NOT_SUPPORTED */                                               \
        struct ct_call c;                                                                          \
        if (!ct_enter(&c, CT_API_##ID, CT_OP_MEMINFO, CT_KIND_NONE, CT_SPACE_NONE, 0))             \
            return real(device, memory);                                                           \
        CT_CALLER(c.caller);                                                                       \
        nvmlReturn_t r = real(device, memory);                                                     \
        c.result = r;                                                                              \
        c.dev = nvml_index(device);                                                                \
        if (r == NVML_SUCCESS && memory) {                                                         \
            c.aux = memory->free;                                                                  \
            c.aux2 = memory->total;                                                                \
            if (nvml_virtualize(c.dev, &memory->total, &memory->free, &memory->used))              \
                c.flags |= CT_EF_VIRTUALIZED;                                                      \
            c.size = memory->total;                                                                \
            c.addr = memory->free;                                                                 \
        }                                                                                          \
        ct_post(&c);                                                                               \
        return r;                                                                                  \
    }
CT_NVML_BODY(nvmlDeviceGetMemoryInfo, nvmlMemory_t)
CT_NVML_BODY(nvmlDeviceGetMemoryInfo_v2, nvmlMemory_v2_t)

/* ---- the opening records of a trace file ------------------------------------------------ */
static void write_info(const char *key, const char *value)
{
    struct ct_rec_info r = {(uint16_t)strlen(key), (uint16_t)strlen(value), 0};
    ct_rec_write(CT_REC_INFO, &r, sizeof r, key, strlen(key) + 1, value, strlen(value) + 1);
}

/* the budget's figure for this process's CUDA context on a device: "context.<dev>" = bytes
 * (a later record of the same key replaces an earlier one) */
static void report_context(int dev, uint64_t bytes)
{
    if (dev >= 0 && dev < CT_LEDGER_MAX_DEVICES)
        ctx_bytes[dev] = bytes;
    char key[32] = "context.", num[24];
    ct_fmt_u64(key + 8, (uint64_t)dev);
    ct_fmt_u64(num, bytes);
    write_info(key, num);
}

/* fencing could not be set up (budget.c): "fence" = "refused: why" or "unfenced: why" */
static void report_fence(const char *verdict, const char *why)
{
    char v[1000];
    size_t l = ct_strlcpy(v, verdict, sizeof v);
    l += ct_strlcpy(v + l, ": ", sizeof v - l);
    ct_strlcpy(v + l, why, sizeof v - l);
    write_info("fence", v);
}

/* the launchers' rank variables, CUDA_VISIBLE_DEVICES and the host name's override, as read
 * when the library loaded (settings.def), recorded as "env.NAME" INFO records (docs/ranks.md) */
static const int rank_env[] = {
    CT_SET_RANK,
    CT_SET_LOCAL_RANK,
    CT_SET_WORLD_SIZE,
    CT_SET_LOCAL_WORLD_SIZE,
    CT_SET_GROUP_RANK,
    CT_SET_SLURM_PROCID,
    CT_SET_SLURM_LOCALID,
    CT_SET_SLURM_NTASKS,
    CT_SET_SLURM_NODEID,
    CT_SET_SLURM_JOB_ID,
    CT_SET_SLURM_STEP_ID,
    CT_SET_OMPI_COMM_WORLD_RANK,
    CT_SET_OMPI_COMM_WORLD_LOCAL_RANK,
    CT_SET_OMPI_COMM_WORLD_SIZE,
    CT_SET_PMI_RANK,
    CT_SET_PMI_SIZE,
    CT_SET_CUDA_VISIBLE_DEVICES,
    CT_SET_HOST,
};

static void write_rank_env(void)
{
    char key[48] = "env.";
    for (size_t i = 0; i < sizeof rank_env / sizeof *rank_env; i++) {
        const char *v = ct_setting(rank_env[i]);
        if (v && *v) {
            ct_strlcpy(key + 4, ct_setting_name(rank_env[i]), sizeof key - 4);
            write_info(key, v);
        }
    }
}

/* the budget this process counts against (at the preamble, or when it joins its environment's
 * group later): "ledger", "on_exceed", "budget.<dev>" = the bytes it may use there (its share's
 * when lower than the group's) and "budget_share" = the share's label */
static void write_budget_info(void)
{
    char num[24];
    write_info("ledger", ct_cfg.ledger_path);
    write_info("on_exceed", ct_cfg.on_exceed == CT_EXCEED_WARN    ? "warn"
                            : ct_cfg.on_exceed == CT_EXCEED_ABORT ? "abort"
                                                                  : "fail");
    uint64_t share = ct_budget_share_limit();
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        uint64_t lim = ct_ledger_limit(ct_budget_ledger, d);
        if (share && (!lim || share < lim))
            lim = share;
        if (lim) {
            char key[32] = "budget.";
            ct_fmt_u64(key + 7, (uint64_t)d);
            ct_fmt_u64(num, lim);
            write_info(key, num);
        }
    }
    if (share)
        write_info("budget_share", ct_budget_share_label());
}

static void write_preamble(void)
{
    static char buf[32768]; /* under the writer lock: one user at a time */
    size_t l = 0;
    uint32_t nstr = 0, argc = 0;
    ssize_t r = readlink("/proc/self/exe", buf, 4096);
    l = r > 0 ? (size_t)r : 0;
    buf[l++] = 0;
    struct utsname u;
    if (uname(&u) == 0)
        l += ct_strlcpy(buf + l, u.nodename, sizeof buf - l);
    buf[l++] = 0;
    if (!getcwd(buf + l, 4096))
        buf[l] = 0;
    l += strlen(buf + l) + 1;
    nstr = 3;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf + l, sizeof buf - l - 1);
        close(fd);
        if (n > 0) {
            if (buf[l + n - 1] != 0)
                buf[l + n++] = 0;
            for (ssize_t i = 0; i < n; i++)
                if (buf[l + i] == 0)
                    argc++;
            l += (size_t)n;
        }
    }
    nstr += argc;
    struct ct_rec_process p = {getpid(), getppid(), nstr, argc};
    ct_rec_write(CT_REC_PROCESS, &p, sizeof p, buf, l, NULL, 0);
    for (size_t i = 0; i < ct_nhooks; i++) {
        const struct ct_hook *h = &ct_hooks[i];
        struct ct_rec_api a = {h->api,  h->layer, h->op,
                               h->kind, h->space, (uint16_t)strlen(h->sym)};
        ct_rec_write(CT_REC_API, &a, sizeof a, h->sym, strlen(h->sym) + 1, NULL, 0);
    }
    char num[24];
    ct_fmt_u64(num, (uint64_t)ct_cfg.stack_depth);
    write_info("stack_depth", num);
    write_info("shim_version", CT_SHIM_VERSION);
    write_info("dlsym_version", ct_real_dlsym_version());
    write_rank_env();
    if (ct_budget_ledger)
        write_budget_info();
    CUresult (*ver)(int *) = (CUresult(*)(int *))ct_driver_sym("cuDriverGetVersion");
    int v = 0;
    if (ver && ver(&v) == CUDA_SUCCESS) {
        ct_fmt_u64(num, (uint64_t)v);
        write_info("driver_version", num);
    }
}

/* ---- load, fork, exit ------------------------------------------------------------------- */
static void atfork_prepare(void)
{
    ct_py_atfork_prepare();
    ct_stacks_atfork_prepare();
    ct_agg_atfork_prepare();
    ct_writer_atfork_prepare();
    ct_budget_atfork_prepare();
}

static void atfork_parent(void)
{
    ct_budget_atfork_parent();
    ct_writer_atfork_parent();
    ct_agg_atfork_parent();
    ct_stacks_atfork_parent();
    ct_py_atfork_parent();
}

/* the process the shim's state belongs to: a vfork child shares that memory (and so the trace
 * and the ledger handle) but not the pid, and must touch neither */
static int ct_pid;

static void atfork_child(void)
{
    ct_pid = getpid();
    ct_thr.tid = 0;
    ct_thr.dev_ctx = 0;                       /* a forked child has no context of its parent's */
    memset(deny_sites, 0, sizeof deny_sites); /* a new process: its own counts */
    ct_writer_atfork_child();
    ct_agg_atfork_child();
    ct_live_atfork_child();
    ct_stacks_reset();
    ct_py_reset();
    ct_modules_reset();
    ct_budget_atfork_child();
}

void ct_shim_first_use(void) { pthread_once(&once, init_once); }

static void init_steps(void)
{
    ct_real_dlsym();
    ct_settings_load();
    if (!ct_config_load(ct_fence_load())) /* a sealed record fences without any setting */
        return;
    ct_budget_init();
    if (ct_budget_on())
        ct_cfg.ctx_watch = 0; /* the budget measures contexts itself (ct_budget_context) */
    ct_modules_init();
    if (ct_cfg.stack_depth > 0) {
        void *warm[4];
        backtrace(warm, 4); /* loads the unwinder now, not inside a CUDA call */
        ct_stacks_init();
        ct_py_detect();
        ct_modules_on_grow(ct_py_modules_changed);
    }
    ct_writer_set_preamble(write_preamble);
    ct_budget_set_context_report(report_context);
    ct_budget_set_fence_report(report_fence);
    ct_budget_set_join_report(write_budget_info);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    ct_pid = getpid();
    ct_cfg.active = 1;
    ct_live_start();
    if (ct_cfg.eager && ct_cfg.mode != CT_MODE_NONE)
        ct_writer_open_now();
}

static void init_once(void)
{
    init_steps();
    __atomic_store_n(&init_done, 1, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void ct_constructor(void) { pthread_once(&once, init_once); }

__attribute__((destructor)) static void ct_destructor(void)
{
    if (!ct_cfg.active)
        return;
    if (ct_cfg.mode == CT_MODE_AGGREGATE)
        ct_agg_final(); /* the last snapshot, before END */
    ct_writer_close(exit_status);
    ct_budget_leave();
}

/* _exit (and _Exit) skip on_exit handlers and destructors: dash ends every `sh -c` with it. Close
 * the trace with the status, so the process reads as exited, not as killed, then end the process
 * as _exit does. Not in a vfork child (posix_spawn's failed exec): the trace is its parent's. */
static void __attribute__((noreturn)) exit_group_now(int status)
{
    for (;;)
        syscall(SYS_exit_group, status);
}

static void __attribute__((noreturn)) close_and_exit(int status)
{
    if (ct_cfg.active && ct_pid == getpid()) {
        ct_writer_close(status & 0xff);
        ct_budget_leave();
    }
    exit_group_now(status);
}

CT_EXPORT void _exit(int status) { close_and_exit(status); }

CT_EXPORT void _Exit(int status) { close_and_exit(status); }
