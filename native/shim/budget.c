/* budget.c - the budget inside the target (budget.h). The ledger itself (native/common/ledger.c)
 * is shared with the Python side; this file holds what only the shim needs: joining it, the
 * table that gives bytes back on free, and the virtualized memory figures. */
#include "budget.h"

#include <pthread.h>
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

void ct_budget_atfork_child(void)
{
    pthread_mutex_init(&atab_mu, NULL);
    if (atab) {
        munmap(atab, sizeof(struct aent) * ATAB_SIZE); /* the parent's allocations, not ours */
        atab = NULL;
        atab_used = 0;
    }
    ct_budget_join();
}
