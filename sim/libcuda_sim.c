/* libcuda_sim.c - a simulated CUDA driver (libcuda.so.1) for testing cudatrace without a GPU.
 *
 * Exports the driver surface the shim hooks (every CT_DRIVER of native/include/hooks.def, with the _ptsz
 * twins), the context/device basics a program needs, the old 32-bit ABI variants, and
 * cuGetProcAddress[_v2] with the real driver's variant selection. Device memory is accounted in
 * a state that all processes of a test share (sim_state.h), so budgets, meminfo and NVML behave
 * as they would on one real GPU. Device pointers are fake, never dereferenced; pinned host memory
 * is real.
 *
 * Built with -Wl,-Bsymbolic: the function pointers cuGetProcAddress hands out are always this
 * library's own, even when a preloaded library exports the same names (as a real driver does).
 *
 * Environment (read once, at first use):
 *   CUDASIM_STATE=path        shared state file (created on first use); unset: per-process state
 *   CUDASIM_DEVICES=n         devices (1..8, default 1)           } used when the state is
 *   CUDASIM_TOTAL_BYTES=n[,m] bytes per device (default 16 GiB)   } created
 *   CUDASIM_DRIVER_VERSION=v  cuDriverGetVersion; cuGetProcAddress refuses newer (default 13000)
 *   CUDASIM_INTEGRATED=0|1    CU_DEVICE_ATTRIBUTE_INTEGRATED; 1: pinned host memory counts as used
 *   CUDASIM_FAIL_NTH=n        the n-th allocation call of the process fails with OUT_OF_MEMORY
 *   CUDASIM_CALLS=path        at exit, append "pid symbol count" for every symbol called
 *   CUDASIM_STRICT_CONTEXT=1  no implicit context: after cuInit a thread has no current context
 *                             until it sets one (the real driver's CUDA_ERROR_INVALID_CONTEXT);
 *                             default: device 0's context is current on every thread
 *   CUDASIM_CTX_BYTES=n       bytes a context costs (default 0): charged to the process on a
 *                             device when it first creates/uses a context there, seen by
 *                             meminfo and NVML but by no hooked call (as a real context)
 *   CUDASIM_CALL_DELAY_US=n   an allocation waits n us before the device takes its memory, a
 *                             free n us after it gives it back (a real driver's long calls: the
 *                             moments where a caller's books and the device's disagree)
 *   CUDASIM_MEMINFO=path      integrated devices: a file in /proc/meminfo's format (MemTotal,
 *                             MemFree, MemAvailable) standing for the host's RAM when no device
 *                             memory is used; cuMemGetInfo then answers as a Jetson does:
 *                             free = MemFree - used by everyone (not MemAvailable: reclaimable
 *                             page cache is not free to the GPU), total = MemTotal
 *   CUDASIM_HOST_PROC=dir     the host's /proc mounted in a container: processes are named
 *                             by host pids, as NVML names them (sim_state.h)
 *   CUDASIM_BACKED=1          device memory the process holds is real memory: a region of its
 *                             own address space is touched as it allocates and dropped as it
 *                             frees, so /proc shows it in RSS, PSS and MemAvailable (as on a
 *                             unified-memory device). Keep such tests small.
 */
#include "sim_driver.h"

/* ---- per-symbol call counters ------------------------------------------------------------- */

static const char *const sym_names[SYM_COUNT] = {
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, ...) #ID, SIM_NAME_PTSZ_##PTSZ(ID)
#include "hooks.def"
#undef CT_DRIVER
#define X(ID, BASE, MINVER, PTSZ) #ID, SIM_NAME_PTSZ_##PTSZ(ID)
    SIM_EXTRA(X)
#undef X
};

uint64_t g_calls[SYM_COUNT];

/* ---- cuGetProcAddress table: one row per ABI variant -------------------------------------- */
const struct gpa_row gpa_rows[] = {
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, ...)                                                     \
    {BASE, MINVER, #ID, (void *)ID, SIM_ROW_PTSZ_##PTSZ(ID)},
#include "hooks.def"
#undef CT_DRIVER
#define X(ID, BASE, MINVER, PTSZ) {BASE, MINVER, #ID, (void *)ID, SIM_ROW_PTSZ_##PTSZ(ID)},
    SIM_EXTRA(X)
#undef X
};
const size_t gpa_nrows = sizeof gpa_rows / sizeof gpa_rows[0];

/* ---- process setup ------------------------------------------------------------------------ */
pthread_once_t g_once = PTHREAD_ONCE_INIT;
struct cudasim_state *g_st;
int g_ndev;
int g_driver_version = 13000;
int g_integrated;
static uint64_t g_fail_nth;
static uint64_t g_alloc_calls;
static uint64_t g_ctx_bytes;
static uint64_t g_call_delay_us;
static int g_strict_ctx;
static int g_backed;
int g_initialized; /* cuInit called */

static void sim_atfork_prepare(void);
static void sim_atfork_parent(void);
static void sim_atfork_child(void);

/* Slots with our pid and start time belong to earlier images of this process (exec replaced
 * them without an exit): a real driver frees an image's memory when it goes. */
static void release_earlier_images(void)
{
    int pid = cudasim_pid();
    uint64_t start = cudasim_proc_start(pid, NULL);
    for (int dev = 0; dev < g_ndev; dev++) {
        struct cudasim_device *d = &g_st->dev[dev];
        for (int i = 0; i < CUDASIM_MAX_PIDS; i++) {
            struct cudasim_pid_slot *s = &d->pids[i];
            int32_t p = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
            if (p != pid || s->start_ticks != start ||
                !__atomic_compare_exchange_n(&s->pid, &p, -1, 0, __ATOMIC_ACQ_REL,
                                             __ATOMIC_RELAXED))
                continue;
            uint64_t u = __atomic_exchange_n(&s->used, 0, __ATOMIC_ACQ_REL);
            if (u) {
                __atomic_fetch_sub(&d->used, u, __ATOMIC_ACQ_REL);
                __atomic_fetch_add(&d->reclaimed, u, __ATOMIC_RELAXED);
            }
            s->hwm = 0;
            s->start_ticks = 0;
            __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
        }
    }
}

void sim_setup(void)
{
    g_driver_version = (int)cudasim_env_ull("CUDASIM_DRIVER_VERSION", 13000);
    g_integrated = cudasim_env_ull("CUDASIM_INTEGRATED", 0) != 0;
    g_fail_nth = cudasim_env_ull("CUDASIM_FAIL_NTH", 0);
    g_ctx_bytes = cudasim_env_ull("CUDASIM_CTX_BYTES", 0);
    g_call_delay_us = cudasim_env_ull("CUDASIM_CALL_DELAY_US", 0);
    g_strict_ctx = cudasim_env_ull("CUDASIM_STRICT_CONTEXT", 0) != 0;
    g_backed = cudasim_env_ull("CUDASIM_BACKED", 0) != 0;
    g_st = cudasim_state_open("libcuda_sim");
    g_ndev = (int)g_st->ndevices;
    release_earlier_images();
    pthread_atfork(sim_atfork_prepare, sim_atfork_parent, sim_atfork_child);
}

/* ---- contexts ----------------------------------------------------------------------------- */
struct CUctx_st g_ctx[CUDASIM_MAX_DEVICES] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
int g_primary_refs[CUDASIM_MAX_DEVICES];
__thread CUcontext t_ctx;
__thread int t_ctx_set;

/* Contexts made by cuCtxCreate are objects of their own, and the one a destroy frees is the
 * next one made, for any device: a real driver may give a freed context's address to a new
 * context. */
#define CREATED_CTX 16
static struct CUctx_st g_created[CREATED_CTX];
static int g_created_used[CREATED_CTX];
static pthread_mutex_t g_created_mu = PTHREAD_MUTEX_INITIALIZER;

CUcontext ctx_new(int dev)
{
    CUcontext c = NULL;
    pthread_mutex_lock(&g_created_mu);
    for (int i = 0; i < CREATED_CTX && !c; i++)
        if (!g_created_used[i]) {
            g_created[i].dev = dev;
            __atomic_store_n(&g_created_used[i], 1, __ATOMIC_RELEASE);
            c = &g_created[i];
        }
    pthread_mutex_unlock(&g_created_mu);
    return c;
}

int ctx_free(CUcontext c)
{
    if (c < &g_created[0] || c >= &g_created[CREATED_CTX])
        return 0;
    pthread_mutex_lock(&g_created_mu);
    int was = g_created_used[c - g_created];
    __atomic_store_n(&g_created_used[c - g_created], 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_created_mu);
    return was;
}

int ctx_index(CUcontext c)
{
    for (int i = 0; i < g_ndev; i++)
        if (c == &g_ctx[i])
            return i;
    if (c >= &g_created[0] && c < &g_created[CREATED_CTX] &&
        __atomic_load_n(&g_created_used[c - g_created], __ATOMIC_ACQUIRE))
        return c->dev;
    return -1;
}

CUcontext current_ctx(void)
{
    if (t_ctx_set)
        return t_ctx;
    return !g_strict_ctx && __atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE) ? &g_ctx[0] : NULL;
}

/* Device of the calling thread's current context. */
CUresult current_dev(int *dev)
{
    if (!__atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext c = current_ctx();
    int i = c ? ctx_index(c) : -1;
    if (i < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = ctx_touch(i);
    if (r)
        return r;
    *dev = i;
    return CUDA_SUCCESS;
}

int valid_dev(int dev) { return dev >= 0 && dev < g_ndev; }

/* ---- live objects of this process --------------------------------------------------------- */

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
struct ent *g_tab[NBUCKETS];
long g_live;
struct range *g_resv; /* address reservations */
struct range *g_maps; /* VMM mappings */

static unsigned bucket(int space, uint64_t key)
{
    uint64_t h = (key ^ ((uint64_t)space << 56)) * 0x9E3779B97F4A7C15ULL;
    return (unsigned)(h >> 52) & (NBUCKETS - 1);
}

/* callers hold g_mu */
struct ent *tab_find(int space, uint64_t key)
{
    for (struct ent *e = g_tab[bucket(space, key)]; e; e = e->next)
        if (e->space == space && e->key == key)
            return e;
    return NULL;
}

static void tab_insert(struct ent *e)
{
    unsigned b = bucket(e->space, e->key);
    e->next = g_tab[b];
    g_tab[b] = e;
    g_live++;
}

void tab_unlink(struct ent *e)
{
    struct ent **pp = &g_tab[bucket(e->space, e->key)];
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = e->next;
        g_live--;
    }
}

/* ---- fake addresses and handles ----------------------------------------------------------- */
static uint64_t g_next_va = 0x100000000000ULL;
static uint64_t g_next_va32 = 0x10000000ULL;
static uint64_t g_next_handle = 0x200000000000ULL;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t va_alloc(uint64_t size, uint64_t align)
{
    if (align < GRANULARITY)
        align = GRANULARITY;
    uint64_t span = round_up(size ? size : 1, GRANULARITY) + GRANULARITY; /* + guard gap */
    uint64_t cur = __atomic_load_n(&g_next_va, __ATOMIC_RELAXED), start;
    do {
        start = round_up(cur, align);
    } while (!__atomic_compare_exchange_n(&g_next_va, &cur, start + span, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return start;
}

static uint64_t va32_alloc(uint64_t size)
{
    uint64_t span = round_up(size ? size : 1, GRANULARITY) + GRANULARITY;
    uint64_t cur = __atomic_load_n(&g_next_va32, __ATOMIC_RELAXED);
    do {
        if (cur + span > 0xFFFFFFFFULL)
            return 0;
    } while (!__atomic_compare_exchange_n(&g_next_va32, &cur, cur + span, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return cur;
}

uint64_t new_handle(void) { return __atomic_fetch_add(&g_next_handle, 0x100, __ATOMIC_RELAXED); }

/* ---- device accounting -------------------------------------------------------------------- */
static pthread_mutex_t g_slot_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_slot_pid;                  /* pid g_slot[] belongs to */
static int g_state_pid;                 /* its pid as the state names it (cudasim_pid) */
static int g_slot[CUDASIM_MAX_DEVICES]; /* slot index + 1; 0: none yet; -1: none free */
static uint64_t g_unslotted[CUDASIM_MAX_DEVICES];
static int g_exited; /* the exit-time release ran: later frees have nothing to give back */
static uint64_t g_my_start;

/* This process's slot on dev, claimed on first use; NULL when all slots are taken. */
static struct cudasim_pid_slot *my_slot(int dev)
{
    struct cudasim_device *d = &g_st->dev[dev];
    int pid = getpid();
    pthread_mutex_lock(&g_slot_mu);
    if (g_slot_pid != pid) {
        memset(g_slot, 0, sizeof(g_slot));
        g_slot_pid = pid;
        g_state_pid = cudasim_pid();
        g_my_start = cudasim_proc_start(g_state_pid, NULL);
    }
    int idx = g_slot[dev];
    if (idx == 0) {
        for (int pass = 0; pass < 2 && idx == 0; pass++) {
            for (int i = 0; i < CUDASIM_MAX_PIDS; i++) {
                struct cudasim_pid_slot *s = &d->pids[i];
                int32_t zero = 0;
                if (__atomic_compare_exchange_n(&s->pid, &zero, -1, 0, __ATOMIC_ACQ_REL,
                                                __ATOMIC_RELAXED)) {
                    s->start_ticks = g_my_start;
                    s->used = 0;
                    s->hwm = 0;
                    __atomic_store_n(&s->pid, g_state_pid, __ATOMIC_RELEASE);
                    idx = i + 1;
                    break;
                }
            }
            if (idx == 0 && pass == 0)
                cudasim_reclaim_dead(g_st, dev);
        }
        g_slot[dev] = idx ? idx : -1;
    }
    pthread_mutex_unlock(&g_slot_mu);
    return idx > 0 ? &d->pids[idx - 1] : NULL;
}

/* CUDASIM_BACKED: the process's device memory as real, touched pages of one region */
static pthread_mutex_t g_back_mu = PTHREAD_MUTEX_INITIALIZER;
static char *g_back;
static uint64_t g_back_size, g_back_used;

static void back_grow(uint64_t bytes)
{
    if (!g_backed || !bytes)
        return;
    pthread_mutex_lock(&g_back_mu);
    if (!g_back) {
        g_back_size = 64ULL << 30; /* address space only */
        void *p = mmap(NULL, g_back_size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        g_back = p == MAP_FAILED ? NULL : p;
    }
    if (g_back && g_back_used + bytes <= g_back_size) {
        memset(g_back + g_back_used, 0x5a, bytes);
        g_back_used += bytes;
    }
    pthread_mutex_unlock(&g_back_mu);
}

static void back_shrink(uint64_t bytes)
{
    if (!g_backed || !bytes)
        return;
    pthread_mutex_lock(&g_back_mu);
    if (g_back) {
        uint64_t take = bytes < g_back_used ? bytes : g_back_used;
        uint64_t lo = (g_back_used - take) & ~4095ULL; /* whole pages only */
        g_back_used -= take;
        if (lo < g_back_used + take)
            madvise(g_back + lo, ((g_back_used + take - lo) + 4095) & ~4095ULL, MADV_DONTNEED);
        if (g_back_used > lo)
            memset(g_back + lo, 0x5a, g_back_used - lo); /* keep the rest of that page */
    }
    pthread_mutex_unlock(&g_back_mu);
}

/* Count bytes toward dev's used; CUDA_ERROR_OUT_OF_MEMORY (nothing changed) if they do not fit. */
static CUresult charge(int dev, uint64_t bytes, int *slotted)
{
    struct cudasim_device *d = &g_st->dev[dev];
    uint64_t now;
    for (int attempt = 0;; attempt++) {
        uint64_t used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
        int ok = 0;
        for (;;) {
            if (bytes > d->total || used > d->total - bytes)
                break;
            if (__atomic_compare_exchange_n(&d->used, &used, used + bytes, 1, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                ok = 1;
                break;
            }
        }
        if (ok) {
            now = used + bytes;
            break;
        }
        if (attempt == 0 && cudasim_reclaim_dead(g_st, dev))
            continue;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    cudasim_atomic_max(&d->hwm, now);
    __atomic_fetch_add(&d->allocs, 1, __ATOMIC_RELAXED);
    back_grow(bytes);
    struct cudasim_pid_slot *s = my_slot(dev);
    if (s) {
        uint64_t mine = __atomic_add_fetch(&s->used, bytes, __ATOMIC_ACQ_REL);
        cudasim_atomic_max(&s->hwm, mine);
        *slotted = 1;
    } else {
        __atomic_fetch_add(&g_unslotted[dev], bytes, __ATOMIC_RELAXED);
        *slotted = 0;
    }
    return CUDA_SUCCESS;
}

void uncharge(int dev, uint64_t bytes, int slotted)
{
    if (!bytes || __atomic_load_n(&g_exited, __ATOMIC_ACQUIRE))
        return;
    struct cudasim_device *d = &g_st->dev[dev];
    struct cudasim_pid_slot *s = slotted ? my_slot(dev) : NULL;
    if (s) {
        /* the slot may have been emptied by an exec-time or exit-time release */
        uint64_t cur = __atomic_load_n(&s->used, __ATOMIC_ACQUIRE), take;
        do {
            take = cur < bytes ? cur : bytes;
        } while (!__atomic_compare_exchange_n(&s->used, &cur, cur - take, 1, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE));
        if (take)
            __atomic_fetch_sub(&d->used, take, __ATOMIC_ACQ_REL);
        back_shrink(take);
    } else {
        uint64_t cur = __atomic_load_n(&g_unslotted[dev], __ATOMIC_ACQUIRE), take;
        do {
            take = cur < bytes ? cur : bytes;
        } while (!__atomic_compare_exchange_n(&g_unslotted[dev], &cur, cur - take, 1,
                                              __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
        if (take)
            __atomic_fetch_sub(&d->used, take, __ATOMIC_ACQ_REL);
        back_shrink(take);
    }
    __atomic_fetch_add(&d->frees, 1, __ATOMIC_RELAXED);
}

/* CUDASIM_CTX_BYTES: the first context use on a device costs memory no hook sees. */
static int g_ctx_charged[CUDASIM_MAX_DEVICES];

CUresult ctx_touch(int dev)
{
    if (!g_ctx_bytes || __atomic_load_n(&g_ctx_charged[dev], __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_slot_mu);
    int done = g_ctx_charged[dev];
    g_ctx_charged[dev] = 1;
    pthread_mutex_unlock(&g_slot_mu);
    if (done)
        return CUDA_SUCCESS;
    int slotted;
    CUresult r = charge(dev, g_ctx_bytes, &slotted);
    if (r)
        __atomic_store_n(&g_ctx_charged[dev], 0, __ATOMIC_RELEASE);
    return r;
}

/* CUDASIM_FAIL_NTH: every allocation call passes here first. */
int inject_failure(void)
{
    uint64_t n = __atomic_add_fetch(&g_alloc_calls, 1, __ATOMIC_RELAXED);
    return g_fail_nth && n == g_fail_nth;
}

/* Charge and record one allocation. key 0: make a fake device pointer (va32: in 32 bits). */
CUresult do_alloc(int space, int kind, int dev, uint64_t size, uint64_t charge_bytes, uint64_t key,
                  int va32, uint64_t aux, uint64_t *out_key)
{
    int slotted = 0;
    if (g_call_delay_us)
        usleep((useconds_t)g_call_delay_us);
    if (charge_bytes) {
        CUresult r = charge(dev, charge_bytes, &slotted);
        if (r)
            return r;
    }
    if (!key) {
        key = va32 ? va32_alloc(size) : va_alloc(size, 0);
        if (!key) {
            uncharge(dev, charge_bytes, slotted);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    struct ent *e = calloc(1, sizeof(*e));
    if (!e) {
        uncharge(dev, charge_bytes, slotted);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->key = key;
    e->space = space;
    e->kind = kind;
    e->dev = dev;
    e->size = size;
    e->charged = charge_bytes;
    e->slotted = slotted;
    e->aux = aux;
    pthread_mutex_lock(&g_mu);
    tab_insert(e);
    pthread_mutex_unlock(&g_mu);
    *out_key = key;
    return CUDA_SUCCESS;
}

/* Remove a live object of `space` whose kind passes `accept`, giving its bytes back. */
CUresult do_free(int space, uint64_t key, int (*accept)(const struct ent *), struct ent *out)
{
    pthread_mutex_lock(&g_mu);
    struct ent *e = tab_find(space, key);
    if (!e || (accept && !accept(e))) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    tab_unlink(e);
    pthread_mutex_unlock(&g_mu);
    uncharge(e->dev, e->charged, e->slotted);
    if (g_call_delay_us)
        usleep((useconds_t)g_call_delay_us);
    if (out)
        *out = *e;
    free(e);
    return CUDA_SUCCESS;
}

/* cuMemFree/cuMemFreeAsync: not imports, and not graph allocations (measured: the real driver
 * refuses those before the graph ran; here graphs never run) */
int accept_freeable(const struct ent *e) { return e->kind != K_IMPORT && e->kind != K_GRAPH; }
int accept_import(const struct ent *e) { return e->kind == K_IMPORT; }
int accept_graph(const struct ent *e) { return e->kind == K_GRAPH; }

/* Streams the driver knows: NULL, CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2), created ones. */
int valid_stream(CUstream s)
{
    uintptr_t v = (uintptr_t)s;
    if (v <= 2)
        return 1;
    pthread_mutex_lock(&g_mu);
    int ok = tab_find(SP_STREAM, v) != NULL;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* Register an object with no memory (stream, pool, graph); returns its handle. */
CUresult new_object(int space, int dev, uint64_t *out)
{
    struct ent *e = calloc(1, sizeof(*e));
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->key = new_handle();
    e->space = space;
    e->kind = K_OBJ;
    e->dev = dev;
    pthread_mutex_lock(&g_mu);
    tab_insert(e);
    pthread_mutex_unlock(&g_mu);
    *out = e->key;
    return CUDA_SUCCESS;
}

int object_dev(int space, uint64_t key)
{
    pthread_mutex_lock(&g_mu);
    struct ent *e = tab_find(space, key);
    int dev = e ? e->dev : -1;
    pthread_mutex_unlock(&g_mu);
    return dev;
}

/* ---- fork and exit ------------------------------------------------------------------------ */
static void sim_atfork_prepare(void)
{
    pthread_mutex_lock(&g_slot_mu);
    pthread_mutex_lock(&g_mu);
    pthread_mutex_lock(&g_back_mu);
}

static void sim_atfork_parent(void)
{
    pthread_mutex_unlock(&g_back_mu);
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_slot_mu);
}

/* A forked child is a new process to the driver: it owns none of its parent's memory, has its
 * own slot, its own call counters and its own CUDASIM_FAIL_NTH count. */
static void sim_atfork_child(void)
{
    for (unsigned b = 0; b < NBUCKETS; b++) {
        struct ent *e = g_tab[b];
        while (e) {
            struct ent *n = e->next;
            free(e);
            e = n;
        }
        g_tab[b] = NULL;
    }
    for (struct range *r = g_resv, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    for (struct range *r = g_maps, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    g_resv = g_maps = NULL;
    g_live = 0;
    memset(g_slot, 0, sizeof(g_slot));
    memset(g_unslotted, 0, sizeof(g_unslotted));
    g_slot_pid = 0;
    memset(g_calls, 0, sizeof(g_calls));
    memset(g_ctx_charged, 0, sizeof(g_ctx_charged));
    g_alloc_calls = 0;
    g_exited = 0;
    if (g_back && g_back_used)
        madvise(g_back, (g_back_used + 4095) & ~4095ULL, MADV_DONTNEED); /* the parent's */
    g_back_used = 0;
    pthread_mutex_init(&g_back_mu, NULL);
    pthread_mutex_init(&g_mu, NULL);
    pthread_mutex_init(&g_slot_mu, NULL);
}

__attribute__((destructor)) static void sim_fini(void)
{
    /* pthread_once has no query; the state pointer tells whether setup ran */
    if (!__atomic_load_n(&g_st, __ATOMIC_ACQUIRE))
        return;
    /* a process that exits gives its device memory back, as with a real driver */
    int pid = getpid();
    pthread_mutex_lock(&g_slot_mu);
    __atomic_store_n(&g_exited, 1, __ATOMIC_RELEASE);
    if (g_slot_pid == pid) {
        for (int dev = 0; dev < g_ndev; dev++) {
            struct cudasim_device *d = &g_st->dev[dev];
            if (g_slot[dev] > 0) {
                struct cudasim_pid_slot *s = &d->pids[g_slot[dev] - 1];
                int32_t p = g_state_pid;
                if (__atomic_compare_exchange_n(&s->pid, &p, -1, 0, __ATOMIC_ACQ_REL,
                                                __ATOMIC_RELAXED)) {
                    uint64_t u = __atomic_exchange_n(&s->used, 0, __ATOMIC_ACQ_REL);
                    if (u)
                        __atomic_fetch_sub(&d->used, u, __ATOMIC_ACQ_REL);
                    s->hwm = 0;
                    s->start_ticks = 0;
                    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
                }
            }
            uint64_t u = __atomic_exchange_n(&g_unslotted[dev], 0, __ATOMIC_ACQ_REL);
            if (u)
                __atomic_fetch_sub(&d->used, u, __ATOMIC_ACQ_REL);
            g_slot[dev] = 0;
            g_ctx_charged[dev] = 0;
        }
    }
    pthread_mutex_unlock(&g_slot_mu);

    const char *path = getenv("CUDASIM_CALLS");
    if (!path || !*path)
        return;
    size_t cap = 64 * SYM_COUNT + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return;
    for (int i = 0; i < SYM_COUNT; i++) {
        uint64_t n = __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
        if (n)
            len += (size_t)snprintf(buf + len, cap - len, "%d %s %llu\n", pid, sym_names[i],
                                    (unsigned long long)n);
    }
    if (len) {
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ssize_t w = write(fd, buf, len);
            (void)w;
            close(fd);
        }
    }
    free(buf);
}
