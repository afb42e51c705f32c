/* budget.c - the budget inside the target (budget.h). The ledger itself (native/common/ledger.c)
 * is shared with the Python side; this file holds what only the shim needs: joining it, the
 * table that gives bytes back on free, and the virtualized memory figures. */
#include "budget.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "route.h"
#include "trace_format.h"
#include "util.h"

ct_ledger *ct_budget_ledger;

void ct_budget_join(void)
{
    if (ct_budget_ledger &&
        ct_ledger_join(ct_budget_ledger, getpid(), 0) /* 0: it reads /proc itself */ < 0) {
        ct_log(
            "cannot join the budget ledger (all member slots taken): budget not enforced in pid ",
            NULL, NULL, NULL);
    }
}

void ct_budget_init(void)
{
    if (!ct_cfg.ledger_path[0])
        return;
    char err[256];
    ct_budget_ledger = ct_ledger_open(ct_cfg.ledger_path, 0, err, sizeof err);
    if (!ct_budget_ledger)
        ct_log("budget ledger unusable, budget NOT enforced in this process: ", err, NULL, NULL);
    ct_budget_join();
}

void ct_budget_leave(void)
{
    if (ct_budget_ledger)
        ct_ledger_leave(ct_budget_ledger);
}

static int device_integrated(int dev)
{
    static int8_t known[CT_LEDGER_MAX_DEVICES]; /* 0 unknown, 1 no, 2 yes */
    if (dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return 0;
    if (!known[dev]) {
        CUresult (*attr)(int *, int, CUdevice) =
            (CUresult(*)(int *, int, CUdevice))ct_driver_sym("cuDeviceGetAttribute");
        int v = 0;
        if (attr && attr(&v, CU_DEVICE_ATTRIBUTE_INTEGRATED, dev) == CUDA_SUCCESS)
            known[dev] = v ? 2 : 1;
        else
            return 0;
    }
    return known[dev] == 2;
}

int ct_budget_counted(int kind, int dev)
{
    switch (kind) {
    case CT_KIND_HOST:
        return ct_cfg.count_host > 0 || (ct_cfg.count_host == 0 && device_integrated(dev));
    case CT_KIND_IMPORT:
    case CT_KIND_NONE:
        return 0;
    default:
        return 1;
    }
}

/* live counted allocations of this process: (space, address) -> bytes, device.
 * Only used with a budget, to give bytes back on free. */
#define ATAB_BITS 20
#define ATAB_SIZE (1u << ATAB_BITS)
struct aent {
    uint64_t addr; /* 0 empty, 1 tombstone */
    uint64_t size;
    uint64_t handle; /* CT_SPACE_MAPPING: the VMM handle mapped there */
    int32_t dev;
    int32_t space;
    int32_t maps;     /* VMM handle: live mappings */
    int32_t released; /* VMM handle: cuMemRelease seen, memory stays until the last unmap */
};
/* a pseudo address space for VMM mappings (address -> handle), never written to traces */
#define CT_SPACE_MAPPING 100
static struct aent *atab;
static uint32_t atab_used;
static pthread_mutex_t atab_mu = PTHREAD_MUTEX_INITIALIZER;

static uint32_t ahash(uint64_t a, int space)
{
    uint64_t h = (a ^ ((uint64_t)space << 56)) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> (64 - ATAB_BITS));
}

/* with atab_mu held: the entry of (addr, space), or NULL */
static struct aent *atab_find(uint64_t addr, int space)
{
    if (!atab || addr < 2)
        return NULL;
    uint32_t i = ahash(addr, space);
    while (atab[i].addr != 0) {
        if (atab[i].addr == addr && atab[i].space == space)
            return &atab[i];
        i = (i + 1) & (ATAB_SIZE - 1);
    }
    return NULL;
}

static int atab_insert(uint64_t addr, int space, uint64_t size, int dev, uint64_t handle)
{
    if (addr < 2)
        return 0;
    pthread_mutex_lock(&atab_mu);
    if (!atab) {
        void *m = mmap(NULL, sizeof(struct aent) * ATAB_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        atab = m == MAP_FAILED ? NULL : m;
    }
    int ok = 0;
    if (atab && atab_used < ATAB_SIZE - ATAB_SIZE / 8) {
        uint32_t i = ahash(addr, space);
        while (atab[i].addr > 1)
            i = (i + 1) & (ATAB_SIZE - 1);
        if (atab[i].addr == 0)
            atab_used++;
        atab[i] = (struct aent){addr, size, handle, dev, space, 0, 0};
        ok = 1;
    }
    pthread_mutex_unlock(&atab_mu);
    return ok;
}

/* A free: the bytes to give back now (0 if none, or if a VMM handle is still mapped). */
int ct_budget_untrack(uint64_t addr, int space, uint64_t *size, int *dev)
{
    int ok = 0;
    pthread_mutex_lock(&atab_mu);
    struct aent *e = atab_find(addr, space);
    if (e) {
        *size = e->size;
        *dev = e->dev;
        if (space == CT_SPACE_VMM && e->maps > 0) {
            e->released = 1; /* physical memory lives until its last mapping goes */
        } else {
            e->addr = 1;
            ok = 1;
        }
    }
    pthread_mutex_unlock(&atab_mu);
    return ok;
}

void ct_budget_map(uint64_t ptr, uint64_t size, uint64_t handle)
{
    pthread_mutex_lock(&atab_mu);
    struct aent *h = atab_find(handle, CT_SPACE_VMM);
    if (h)
        h->maps++;
    pthread_mutex_unlock(&atab_mu);
    if (h)
        atab_insert(ptr, CT_SPACE_MAPPING, size, 0, handle);
}

/* cuMemUnmap(ptr, size) may cover several mappings; handles released earlier give their bytes
 * back when their last mapping goes. */
void ct_budget_unmap(uint64_t ptr, uint64_t size)
{
    uint64_t cur = ptr, end = ptr + size;
    for (int guard = 0; cur < end && guard < 4096; guard++) {
        uint64_t give = 0, msize = 0;
        int dev = 0;
        pthread_mutex_lock(&atab_mu);
        struct aent *m = atab_find(cur, CT_SPACE_MAPPING);
        if (m) {
            msize = m->size;
            struct aent *h = atab_find(m->handle, CT_SPACE_VMM);
            m->addr = 1;
            if (h && --h->maps <= 0 && h->released) {
                give = h->size;
                dev = h->dev;
                h->addr = 1;
            }
        }
        pthread_mutex_unlock(&atab_mu);
        if (!m || !msize)
            break;
        if (give)
            ct_ledger_release(ct_budget_ledger, dev, give);
        cur += msize;
    }
}

int ct_budget_track(uint64_t addr, int space, uint64_t size, int dev)
{
    return atab_insert(addr, space, size, dev, 0);
}

int ct_budget_virtualize(int dev, uint64_t *total, uint64_t *free_, int clamp)
{
    if (!ct_budget_ledger || !ct_cfg.virtualize || dev < 0)
        return 0;
    uint64_t limit = ct_ledger_limit(ct_budget_ledger, dev);
    if (!limit)
        return 0;
    uint64_t in_use = ct_ledger_in_use(ct_budget_ledger, dev);
    uint64_t vt = *total && *total < limit ? *total : limit;
    uint64_t vf = in_use < vt ? vt - in_use : 0;
    if (clamp && vf > *free_)
        vf = *free_;
    *total = vt;
    *free_ = vf;
    return 1;
}

void ct_budget_atfork_prepare(void) { pthread_mutex_lock(&atab_mu); }
void ct_budget_atfork_parent(void) { pthread_mutex_unlock(&atab_mu); }

static void ctx_atfork_child(void);

void ct_budget_atfork_child(void)
{
    ctx_atfork_child();
    pthread_mutex_init(&atab_mu, NULL);
    if (atab) {
        munmap(atab, sizeof(struct aent) * ATAB_SIZE); /* the parent's allocations, not ours */
        atab = NULL;
        atab_used = 0;
    }
    ct_budget_join();
}

/* Membership lost: another member judged us dead (the program closed the descriptor that
 * holds our liveness lock, so the lock test said so) and freed our slot with its bytes. Join
 * again and count anew what this process still holds (its table of live allocations; the
 * context is measured again), so nothing it holds goes uncounted. 1 if a member again. */
static pthread_mutex_t rejoin_mu = PTHREAD_MUTEX_INITIALIZER;
static void ctx_forget(void);

int ct_budget_rejoin(void)
{
    ct_ledger *l = ct_budget_ledger;
    if (!l)
        return 0;
    pthread_mutex_lock(&rejoin_mu);
    int ok = ct_ledger_reserve(l, 0, 0, NULL, NULL) == CT_LEDGER_GRANTED; /* another thread? */
    if (!ok && ct_ledger_join(l, getpid(), 0) >= 0) {
        uint64_t per[CT_LEDGER_MAX_DEVICES] = {0};
        pthread_mutex_lock(&atab_mu);
        for (uint32_t i = 0; atab && i < ATAB_SIZE; i++)
            if (atab[i].addr > 1 && atab[i].space != CT_SPACE_MAPPING && atab[i].dev >= 0 &&
                atab[i].dev < CT_LEDGER_MAX_DEVICES)
                per[atab[i].dev] += atab[i].size;
        pthread_mutex_unlock(&atab_mu);
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
            if (per[d])
                ct_ledger_force(l, d, per[d]);
        ctx_forget();
        ct_log("budget membership was lost (the program closed cudatrace's ledger descriptor?); "
               "joined again and counted what this process holds",
               NULL, NULL, NULL);
        ok = 1;
    }
    pthread_mutex_unlock(&rejoin_mu);
    return ok;
}

/* ---- CUDA contexts -------------------------------------------------------------------------
 * A context and the modules loaded into it hold device memory that no hooked call allocates
 * (~0.5 GiB a process on an H200). With a budget the shim counts it: at the first counted
 * allocation on a device (before and after it, as the context may be made by that very call)
 * and then at most once a second at allocations, it reads NVML's figure for this process
 * (nvmlDeviceGetComputeRunningProcesses_v3) and counts what of it is not counted allocations
 * as the member's context (ct_ledger_set_context: held, never denied, shown apart). No lock is
 * taken: one CAS picks the thread that measures. Where NVML lists no figure for this pid
 * (integrated devices, a container that does not share the host's pid namespace), nothing is
 * counted and `cudatrace status` shows no context. CUDATRACE_COUNT_CONTEXTS=0 turns it off. */
#define CTX_PERIOD_NS 1000000000ull
#define CTX_TRIES 4
#define NVML_ERROR_INSUFFICIENT_SIZE 7
static uint64_t ctx_next_ns[CT_LEDGER_MAX_DEVICES]; /* when the next measurement is due */
static uint32_t ctx_misses[CT_LEDGER_MAX_DEVICES];  /* measurements that found no figure */
static uint64_t ctx_counted[CT_LEDGER_MAX_DEVICES]; /* what this process counts now */
static int ctx_nvml_index[CT_LEDGER_MAX_DEVICES];   /* CUDA ordinal -> NVML index, -1 none */
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static nvmlReturn_t (*ctx_get_handle)(unsigned, nvmlDevice_t *);
static nvmlReturn_t (*ctx_procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *);
static void (*ctx_report)(int dev, uint64_t bytes);

void ct_budget_set_context_report(void (*fn)(int dev, uint64_t bytes)) { ctx_report = fn; }

static void ctx_init(void)
{
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        ctx_nvml_index[d] = d;
    const char *v = ct_setting(CT_SET_CUDA_VISIBLE_DEVICES); /* ordinals name NVML indices */
    if (v) {
        int d = 0;
        for (const char *p = v; d < CT_LEDGER_MAX_DEVICES; d++) {
            if (*p < '0' || *p > '9')
                break; /* a UUID or MIG name, or the end: no mapping from here on */
            int idx = 0;
            while (*p >= '0' && *p <= '9')
                idx = idx * 10 + (*p++ - '0');
            ctx_nvml_index[d] = idx;
            if (*p != ',')
                break;
            p++;
        }
        for (int k = d + 1; k < CT_LEDGER_MAX_DEVICES; k++)
            ctx_nvml_index[k] = -1;
        if (!*v)
            ctx_nvml_index[0] = -1;
    }
    if (ct_setting_long(CT_SET_COUNT_CONTEXTS, 1) == 0)
        return;
    ct_dlsym_fn ds = ct_real_dlsym();
    void *h = ds ? dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h)
        return;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))ds(h, "nvmlInit_v2");
    ctx_get_handle =
        (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))ds(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *))ds(
            h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (init && ctx_get_handle && procs && init() == NVML_SUCCESS)
        __atomic_store_n(&ctx_procs, procs, __ATOMIC_RELEASE);
}

/* NVML's figure for this process on dev: 1 found, 0 not listed or no NVML */
static int ctx_nvml_used(int dev, uint64_t *used)
{
    int idx = ctx_nvml_index[dev];
    nvmlDevice_t h;
    if (idx < 0 || ctx_get_handle((unsigned)idx, &h) != NVML_SUCCESS)
        return 0;
    nvmlProcessInfo_v2_t info[128];
    unsigned n = 128;
    if (ctx_procs(h, &n, info) != NVML_SUCCESS)
        return 0;
    unsigned me = (unsigned)getpid();
    for (unsigned i = 0; i < n && i < 128; i++)
        if (info[i].pid == me && info[i].usedGpuMemory != ~0ull) {
            *used = info[i].usedGpuMemory;
            return 1;
        }
    return 0;
}

void ct_budget_context(int dev)
{
    if (!ct_budget_ledger || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return;
    uint64_t now = ct_now_ns(), due = __atomic_load_n(&ctx_next_ns[dev], __ATOMIC_RELAXED);
    if (now < due)
        return;
    if (!__atomic_compare_exchange_n(&ctx_next_ns[dev], &due, now + CTX_PERIOD_NS, 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return; /* another thread measures */
    pthread_once(&ctx_once, ctx_init);
    uint64_t used = 0;
    if (!__atomic_load_n(&ctx_procs, __ATOMIC_ACQUIRE) || !ctx_nvml_used(dev, &used)) {
        if (__atomic_add_fetch(&ctx_misses[dev], 1, __ATOMIC_RELAXED) < CTX_TRIES)
            __atomic_store_n(&ctx_next_ns[dev], 0, __ATOMIC_RELAXED); /* again next time */
        return;
    }
    uint64_t held = ct_ledger_held(ct_budget_ledger, dev);
    uint64_t mine = __atomic_load_n(&ctx_counted[dev], __ATOMIC_RELAXED);
    uint64_t allocs = held > mine ? held - mine : 0;
    uint64_t ctx = used > allocs ? used - allocs : 0;
    ctx = (ctx + 1023) & ~1023ull; /* the ledger keeps it in KiB */
    if (ctx == mine)
        return;
    if (ct_ledger_set_context(ct_budget_ledger, dev, ctx) == CT_LEDGER_OK) {
        __atomic_store_n(&ctx_counted[dev], ctx, __ATOMIC_RELAXED);
        if (ctx_report)
            ctx_report(dev, ctx);
    }
}

static void ctx_forget(void)
{
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        __atomic_store_n(&ctx_counted[d], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ctx_misses[d], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ctx_next_ns[d], 0, __ATOMIC_RELAXED);
    }
}

/* a child has no context of its own yet */
static void ctx_atfork_child(void)
{
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        ctx_next_ns[d] = 0;
        ctx_misses[d] = 0;
        ctx_counted[d] = 0;
    }
}
