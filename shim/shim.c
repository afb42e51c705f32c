/* shim.c - the interposer: entry points, wrappers and the budget on the allocation path.
 *
 * Routes into the driver, all reaching the same wrappers (generated from hooks.def):
 *   1. exported driver symbols (programs linked with -lcuda, through their PLT);
 *   2. dlsym(handle, "cuMemAlloc_v2"...): we return the wrapper, keeping the real pointer;
 *   3. cuGetProcAddress[_v2] (how the static and shared CUDA runtimes reach the driver): after
 *      the real call succeeds we hand back the wrapper of exactly the ABI variant asked for
 *      (base name + cudaVersion + per-thread flag), one real pointer per variant.
 * Runtime (cuda*) hooks only tag the driver events that happen inside them, so each allocation
 * is counted once, at the driver layer. A thread-local depth guard makes nested driver calls
 * pass straight through. With CUDATRACE_DIR unset the shim is pure pass-through.
 */
#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

typedef struct { size_t width, height, depth; } CT_EXTENT3D;   /* cudaExtent */

struct ct_config ct_cfg;

/* ---- small helpers ---------------------------------------------------------------------- */
uint64_t ct_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CT_TLS uint32_t tls_tid;
static CT_TLS int tls_depth;          /* >0: inside a wrapper, nested calls pass through */
static CT_TLS uint16_t tls_rt_api;    /* runtime API in progress on this thread */

uint32_t ct_gettid(void)
{
    if (!tls_tid)
        tls_tid = (uint32_t)syscall(SYS_gettid);
    return tls_tid;
}

size_t ct_strlcpy(char *dst, const char *src, size_t n)
{
    size_t l = 0;
    if (!n)
        return 0;
    while (src && src[l] && l + 1 < n) {
        dst[l] = src[l];
        l++;
    }
    dst[l] = 0;
    return l;
}

void ct_fmt_u64(char *out, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = 0;
}

void ct_fmt_hex(char *out, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    out[0] = '0';
    out[1] = 'x';
    for (int i = 0; i < n; i++)
        out[2 + i] = tmp[n - 1 - i];
    out[2 + n] = 0;
}

void ct_fmt_bytes(char *out, uint64_t v)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    uint64_t scale = 1;
    while (u < 4 && v >= scale * 1024) {
        scale *= 1024;
        u++;
    }
    uint64_t whole = v / scale, frac = (v % scale) * 100 / scale;
    ct_fmt_u64(out, whole);
    size_t l = strlen(out);
    if (u > 0) {
        out[l++] = '.';
        out[l++] = (char)('0' + frac / 10);
        out[l++] = (char)('0' + frac % 10);
    }
    out[l++] = ' ';
    ct_strlcpy(out + l, units[u], 8);
}

void ct_log(const char *a, const char *b, const char *c, const char *d)
{
    char line[1024];
    size_t l = ct_strlcpy(line, "cudatrace: ", sizeof line);
    const char *parts[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (parts[i] && l < sizeof line - 2)
            l += ct_strlcpy(line + l, parts[i], sizeof line - 1 - l);
    line[l++] = '\n';
    ssize_t r = write(2, line, l);
    (void)r;
}

static inline uint64_t ct_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static uint64_t ct_array2d_bytes(const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!d)
        return 0;
    return (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->NumChannels ? d->NumChannels : 1) *
           ct_array_format_bytes(d->Format);
}

static uint64_t ct_array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
    if (!d)
        return 0;
    uint64_t w = d->Width, h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1, total = 0;
    uint64_t elem = (uint64_t)(d->NumChannels ? d->NumChannels : 1) * ct_array_format_bytes(d->Format);
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        total += w * h * z * elem;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        z = z > 1 ? z / 2 : 1;
    }
    return total;
}

/* ---- the real dlsym, obtained per glibc version and architecture --------------------- */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;

static dlsym_fn get_real_dlsym(void)
{
    dlsym_fn f = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
    if (f)
        return f;
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    for (int i = 0; versions[i] && !f; i++)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

/* ---- tables derived from hooks.def ------------------------------------------------------ */
#define CT_OUT(p) ((p) ? (uint64_t)*(p) : 0)
#define CT_OUTP(p) ((p) ? (uint64_t)(uintptr_t)*(p) : 0)

enum {
#define CT_DRIVER(ID, ...) CT_SLOT_##ID, CT_SLOT_##ID##_ptsz,
#define CT_RUNTIME(ID, ...) CT_SLOT_##ID,
#define CT_NVML(ID, ...) CT_SLOT_##ID,
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
    CT_SLOT_cuGetProcAddress,
    CT_SLOT_cuGetProcAddress_v2,
    CT_NSLOTS
};

enum {
    CT_API_NONE = 0,
#define CT_DRIVER(ID, ...) CT_API_##ID,
#define CT_RUNTIME(ID, ...) CT_API_##ID,
#define CT_NVML(ID, ...) CT_API_##ID,
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
    CT_API_COUNT
};

static const char *const slot_names[CT_NSLOTS] = {
#define CT_DRIVER(ID, ...) #ID, #ID "_ptsz",
#define CT_RUNTIME(ID, ...) #ID,
#define CT_NVML(ID, ...) #ID,
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
};

static void *real_ptr[CT_NSLOTS];
static void *cuda_handle;       /* libcuda as the program opened it */
static void *nvml_handle;

static void *resolve_slot(int slot)
{
    dlsym_fn ds = get_real_dlsym();
    if (!ds)
        return NULL;
    const char *name = slot_names[slot];
    void *p = ds(RTLD_NEXT, name);
    if (!p && cuda_handle && name[0] == 'c')
        p = ds(cuda_handle, name);
    if (!p && nvml_handle && name[0] == 'n')
        p = ds(nvml_handle, name);
    if (!p && name[0] == 'c' && name[1] == 'u' && name[2] != 'd') {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (h)
            p = ds(h, name);
    }
    if (p)
        __atomic_store_n(&real_ptr[slot], p, __ATOMIC_RELEASE);
    return p;
}

static inline void *ct_real(int slot)
{
    void *p = __atomic_load_n(&real_ptr[slot], __ATOMIC_ACQUIRE);
    return p ? p : resolve_slot(slot);
}

/* a driver entry point the shim itself calls (not hooked): through the program's libcuda */
static void *driver_sym(const char *name)
{
    dlsym_fn ds = get_real_dlsym();
    void *p = NULL;
    if (!ds)
        return NULL;
    if (cuda_handle)
        p = ds(cuda_handle, name);
    if (!p) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (h)
            p = ds(h, name);
    }
    return p;
}

static int current_device(void)
{
    static CUresult (*get_dev)(CUdevice *);
    if (!get_dev)
        get_dev = (CUresult(*)(CUdevice *))driver_sym("cuCtxGetDevice");
    CUdevice d = -1;
    if (!get_dev || get_dev(&d) != CUDA_SUCCESS)
        return -1;
    return d;
}

/* ---- budget: the ledger shared by a process tree or a named group ---------------------- */
static ct_ledger *ledger;

static int device_integrated(int dev)
{
    static int8_t known[CT_LEDGER_MAX_DEVICES];   /* 0 unknown, 1 no, 2 yes */
    if (dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return 0;
    if (!known[dev]) {
        CUresult (*attr)(int *, int, CUdevice) =
            (CUresult(*)(int *, int, CUdevice))driver_sym("cuDeviceGetAttribute");
        int v = 0;
        if (attr && attr(&v, CU_DEVICE_ATTRIBUTE_INTEGRATED, dev) == CUDA_SUCCESS)
            known[dev] = v ? 2 : 1;
        else
            return 0;
    }
    return known[dev] == 2;
}

static int counted(int kind, int dev)
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
    uint64_t addr;       /* 0 empty, 1 tombstone */
    uint64_t size;
    uint64_t handle;     /* CT_SPACE_MAPPING: the VMM handle mapped there */
    int32_t dev;
    int32_t space;
    int32_t maps;        /* VMM handle: live mappings */
    int32_t released;    /* VMM handle: cuMemRelease seen, memory stays until the last unmap */
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
static int atab_free(uint64_t addr, int space, uint64_t *size, int *dev)
{
    int ok = 0;
    pthread_mutex_lock(&atab_mu);
    struct aent *e = atab_find(addr, space);
    if (e) {
        *size = e->size;
        *dev = e->dev;
        if (space == CT_SPACE_VMM && e->maps > 0) {
            e->released = 1;          /* physical memory lives until its last mapping goes */
        } else {
            e->addr = 1;
            ok = 1;
        }
    }
    pthread_mutex_unlock(&atab_mu);
    return ok;
}

static void atab_map(uint64_t ptr, uint64_t size, uint64_t handle)
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
static void atab_unmap(uint64_t ptr, uint64_t size)
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
            ct_ledger_release(ledger, dev, give);
        cur += msize;
    }
}

/* ---- one hooked call ------------------------------------------------------------------ */
struct ct_call {
    uint64_t reserve, size, addr, aux, aux2;
    int dev;
    CUresult result;
    uint32_t stack;
    uint16_t api;
    uint8_t op, kind, space, flags;
    uint8_t reserved, stacked;
    uintptr_t cfa;            /* the wrapper's CFA, for the stack cache */
};

static void emit(struct ct_call *c, uint8_t op)
{
    ct_slot s;
    if (!ct_rec_begin(&s, sizeof(struct ct_rec_hdr) + sizeof(struct ct_event)))
        return;
    struct ct_event *e = (struct ct_event *)(s.p + sizeof(struct ct_rec_hdr));
    e->ts_ns = ct_now_ns();
    e->size = c->size;
    e->addr = c->addr;
    e->aux = c->aux;
    e->aux2 = c->aux2;
    e->tid = ct_gettid();
    e->device = c->dev;
    e->result = c->result;
    e->stack = c->stack;
    e->api = c->api;
    e->rt_api = tls_rt_api;
    e->op = op;
    e->kind = c->kind;
    e->space = c->space;
    e->flags = (uint8_t)(c->flags | (tls_rt_api ? CT_EF_RUNTIME_KNOWN : 0));
    e->reserved = 0;
    ct_rec_commit(&s, CT_REC_EVENT);
    __atomic_add_fetch(&ct_events_written, 1, __ATOMIC_RELAXED);
}

static void init_once(void);
static pthread_once_t once = PTHREAD_ONCE_INIT;

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
    pthread_once(&once, init_once);
    if (!ct_cfg.active || tls_depth)
        return 0;
    if (__builtin_expect(!__atomic_load_n(&exit_hooked, __ATOMIC_RELAXED), 0) &&
        !__atomic_exchange_n(&exit_hooked, 1, __ATOMIC_ACQ_REL))
        on_exit(on_exit_handler, NULL);
    tls_depth++;
    c->reserve = c->size = c->addr = c->aux = c->aux2 = 0;
    c->dev = -1;
    c->result = CUDA_SUCCESS;
    c->stack = 0;
    c->api = api;
    c->op = op;
    c->kind = kind;
    c->space = space;
    c->flags = flags;
    c->reserved = c->stacked = 0;
    c->cfa = 0;
    return 1;
}

static inline void ct_leave(void) { tls_depth--; }

static const char *api_name(uint16_t api);

static void deny_message(struct ct_call *c, uint64_t in_use, uint64_t limit, const char *verdict)
{
    char line[1400], num[48], site[600];
    uintptr_t ip = ct_stack_first_user_frame();
    if (ip)
        ct_describe_address(ip, site, sizeof site);
    else
        ct_strlcpy(site, "unknown call site (stacks off: --stack-depth 0)", sizeof site);
    size_t l = ct_strlcpy(line, "cudatrace: budget exceeded: ", sizeof line);
    l += ct_strlcpy(line + l, api_name(c->api), sizeof line - l);
    if (tls_rt_api) {
        l += ct_strlcpy(line + l, " (", sizeof line - l);
        l += ct_strlcpy(line + l, api_name(tls_rt_api), sizeof line - l);
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
    l += ct_strlcpy(line + l, ", in use ", sizeof line - l);
    ct_fmt_bytes(num, in_use);
    l += ct_strlcpy(line + l, num, sizeof line - l);
    l += ct_strlcpy(line + l, "; at ", sizeof line - l);
    l += ct_strlcpy(line + l, site, sizeof line - l);
    l += ct_strlcpy(line + l, "; ", sizeof line - l);
    l += ct_strlcpy(line + l, verdict, sizeof line - l);
    if (l > sizeof line - 2)
        l = sizeof line - 2;
    line[l++] = '\n';
    ssize_t r = write(2, line, l);
    (void)r;
}

/* before the real call: reserve against the budget. 0: denied, c->result holds the answer */
static int ct_pre(struct ct_call *c)
{
    if (!ledger || !c->reserve)
        return 1;
    if (c->dev < 0)
        c->dev = current_device();
    int dev = c->dev < 0 ? 0 : c->dev;
    if (!counted(c->kind, dev))
        return 1;
    uint64_t in_use = 0, limit = 0;
    int r = ct_ledger_reserve(ledger, dev, c->reserve, &in_use, &limit);
    if (r == 1) {
        c->reserved = 1;
        return 1;
    }
    if (r < 0)
        return 1;         /* not a member (slots full) or a bad device: cannot enforce, pass */
    c->stack = ct_stack_capture(c->cfa);
    c->stacked = 1;
    if (ct_cfg.on_exceed == CT_EXCEED_WARN) {
        ct_ledger_force(ledger, dev, c->reserve);
        c->reserved = 1;
        c->flags |= CT_EF_BUDGET_WARN;
        deny_message(c, in_use, limit, "allowed (--on-exceed warn)");
        return 1;
    }
    c->result = CUDA_ERROR_OUT_OF_MEMORY;
    c->size = c->reserve;
    c->aux = limit;
    c->aux2 = in_use;
    emit(c, CT_OP_DENY);
    if (ct_cfg.on_exceed == CT_EXCEED_ABORT) {
        deny_message(c, in_use, limit, "stopping the process tree (--on-exceed abort)");
        if (ct_cfg.launcher_pid > 0)
            kill(ct_cfg.launcher_pid, SIGUSR2);
        ct_writer_close(128 + SIGABRT);
        abort();
    }
    deny_message(c, in_use, limit, "returned CUDA_ERROR_OUT_OF_MEMORY");
    return 0;
}

static void ct_post(struct ct_call *c)
{
    if (c->op == CT_OP_ALLOC && c->reserved) {
        int dev = c->dev < 0 ? 0 : c->dev;
        if (c->result != CUDA_SUCCESS) {
            ct_ledger_release(ledger, dev, c->reserve);
        } else {
            if (c->size > c->reserve)
                ct_ledger_force(ledger, dev, c->size - c->reserve);
            else if (c->size < c->reserve)
                ct_ledger_release(ledger, dev, c->reserve - c->size);
            if (!atab_insert(c->addr, c->space, c->size, dev, 0))
                ct_ledger_release(ledger, dev, c->size);   /* cannot track it: never leak budget */
        }
    } else if (c->op == CT_OP_FREE && ledger && c->result == CUDA_SUCCESS) {
        uint64_t size = 0;
        int dev = 0;
        if (atab_free(c->addr, c->space, &size, &dev))
            ct_ledger_release(ledger, dev, size);
        c->size = size;
    } else if (c->op == CT_OP_MAP && ledger && c->result == CUDA_SUCCESS) {
        atab_map(c->addr, c->size, c->aux);
    } else if (c->op == CT_OP_UNMAP && ledger && c->result == CUDA_SUCCESS) {
        atab_unmap(c->addr, c->size);
    }
    if (c->dev < 0)
        c->dev = current_device();
    if (!c->stacked)
        c->stack = ct_stack_capture(c->cfa);
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
    if (ledger && ct_cfg.virtualize && c->dev >= 0) {
        uint64_t limit = ct_ledger_limit(ledger, c->dev);
        if (limit) {
            uint64_t in_use = ct_ledger_in_use(ledger, c->dev);
            uint64_t vt = rt && rt < limit ? rt : limit;
            uint64_t vf = in_use < vt ? vt - in_use : 0;
            if (free_out && vf > rf)
                vf = rf;
            if (free_out)
                *free_out = vf;
            if (total_out)
                *total_out = vt;
            c->flags |= CT_EF_VIRTUALIZED;
            c->addr = vf;
            return vt;
        }
    }
    return rt;
}

/* ---- the generated wrappers ------------------------------------------------------------ */
#define CT_WRAPPER_BODY(ID, SLOT, FLAGS, OP, KIND, SPACE, PROTO, ARGS, RESERVE, SIZE, ADDR, AUX,  \
                        AUX2, DEV)                                                             \
    {                                                                                          \
        typedef CUresult(*fn_t) PROTO;                                                         \
        fn_t real = (fn_t)ct_real(SLOT);                                                       \
        if (!real)                                                                             \
            return CUDA_ERROR_NOT_INITIALIZED;                                                 \
        struct ct_call c;                                                                      \
        if (!ct_enter(&c, CT_API_##ID, OP, KIND, SPACE, FLAGS))                                \
            return real ARGS;                                                                  \
        c.cfa = CT_CFA();                                                                      \
        c.reserve = (uint64_t)(RESERVE);                                                       \
        c.dev = (DEV);                                                                         \
        if (c.reserve && !ct_pre(&c)) {                                                        \
            ct_leave();                                                                        \
            return c.result;                                                                   \
        }                                                                                      \
        c.result = real ARGS;                                                                  \
        c.size = (uint64_t)(SIZE);                                                             \
        if (c.result == CUDA_SUCCESS)                                                          \
            c.addr = (uint64_t)(ADDR);                                                         \
        c.aux = (uint64_t)(AUX);                                                               \
        c.aux2 = (uint64_t)(AUX2);                                                             \
        ct_post(&c);                                                                           \
        return c.result;                                                                       \
    }

#define CT_PTSZ_EXPORT_0(ID)
#define CT_PTSZ_EXPORT_1(ID) \
    extern __typeof__(ct_ptsz_##ID) ID##_ptsz __attribute__((alias("ct_ptsz_" #ID), visibility("default")));

#define CT_DRIVER(ID, BASE, MINVER, PTSZ, OP, KIND, SPACE, PROTO, ARGS, RESERVE, SIZE, ADDR, AUX,    \
                  AUX2, DEV)                                                                     \
    CT_EXPORT CUresult ID PROTO CT_WRAPPER_BODY(ID, CT_SLOT_##ID, 0, OP, KIND, SPACE, PROTO, ARGS,  \
                                                RESERVE, SIZE, ADDR, AUX, AUX2, DEV)              \
    __attribute__((unused)) static CUresult ct_ptsz_##ID PROTO                                    \
        CT_WRAPPER_BODY(ID, CT_SLOT_##ID##_ptsz, CT_EF_PTSZ, OP, KIND, SPACE, PROTO, ARGS,        \
                        RESERVE, SIZE, ADDR, AUX, AUX2, DEV)                                       \
    CT_PTSZ_EXPORT_##PTSZ(ID)
#define CT_RUNTIME(ID, PROTO, ARGS)                                                              \
    CT_EXPORT int ID PROTO                                                                       \
    {                                                                                            \
        typedef int(*fn_t) PROTO;                                                                \
        fn_t real = (fn_t)ct_real(CT_SLOT_##ID);                                                 \
        if (!real)                                                                               \
            return 3; /* cudaErrorInitializationError */                                        \
        uint16_t saved = tls_rt_api;                                                             \
        tls_rt_api = CT_API_##ID;                                                                \
        int r = real ARGS;                                                                       \
        tls_rt_api = saved;                                                                      \
        return r;                                                                                \
    }
#define CT_NVML(ID, PROTO, ARGS)
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML

/* ---- NVML memory queries -------------------------------------------------------------- */
static int nvml_index(nvmlDevice_t d)
{
    nvmlReturn_t (*get_index)(nvmlDevice_t, unsigned *) = NULL;
    dlsym_fn ds = get_real_dlsym();
    if (ds && nvml_handle)
        get_index = (nvmlReturn_t(*)(nvmlDevice_t, unsigned *))ds(nvml_handle, "nvmlDeviceGetIndex");
    if (!get_index && ds)
        get_index = (nvmlReturn_t(*)(nvmlDevice_t, unsigned *))ds(RTLD_NEXT, "nvmlDeviceGetIndex");
    unsigned idx;
    if (!get_index || get_index(d, &idx) != NVML_SUCCESS)
        return -1;
    return (int)idx;
}

/* rewrite NVML's figures to tell the budget; returns 1 if it did */
static int nvml_virtualize(int dev, unsigned long long *total, unsigned long long *free_,
                           unsigned long long *used)
{
    if (!ledger || !ct_cfg.virtualize || dev < 0)
        return 0;
    uint64_t limit = ct_ledger_limit(ledger, dev);
    if (!limit)
        return 0;
    uint64_t in_use = ct_ledger_in_use(ledger, dev);
    uint64_t vt = *total && *total < limit ? *total : limit;
    uint64_t vf = in_use < vt ? vt - in_use : 0;
    if (vf > *free_)
        vf = *free_;
    *total = vt;
    *free_ = vf;
    *used = vt - vf;
    return 1;
}

#define CT_NVML_BODY(ID, MEMTYPE)                                                                \
    CT_EXPORT nvmlReturn_t ID(nvmlDevice_t device, MEMTYPE *memory)                              \
    {                                                                                            \
        typedef nvmlReturn_t (*fn_t)(nvmlDevice_t, MEMTYPE *);                                   \
        fn_t real = (fn_t)ct_real(CT_SLOT_##ID);                                                 \
        if (!real)                                                                               \
            return 3; /* NVML_ERROR_NOT_SUPPORTED */                                             \
        struct ct_call c;                                                                        \
        if (!ct_enter(&c, CT_API_##ID, CT_OP_MEMINFO, CT_KIND_NONE, CT_SPACE_NONE, 0))           \
            return real(device, memory);                                                         \
        c.cfa = CT_CFA();                                                                        \
        nvmlReturn_t r = real(device, memory);                                                   \
        c.result = r;                                                                            \
        c.dev = nvml_index(device);                                                              \
        if (r == NVML_SUCCESS && memory) {                                                       \
            c.aux = memory->free;                                                                \
            c.aux2 = memory->total;                                                              \
            if (nvml_virtualize(c.dev, &memory->total, &memory->free, &memory->used))            \
                c.flags |= CT_EF_VIRTUALIZED;                                                    \
            c.size = memory->total;                                                              \
            c.addr = memory->free;                                                               \
        }                                                                                        \
        ct_post(&c);                                                                             \
        return r;                                                                                \
    }
CT_NVML_BODY(nvmlDeviceGetMemoryInfo, nvmlMemory_t)
CT_NVML_BODY(nvmlDeviceGetMemoryInfo_v2, nvmlMemory_v2_t)

/* ---- what each name maps to: the dlsym and cuGetProcAddress tables --------------------- */
struct hook {
    const char *sym;        /* exact exported name of this variant */
    const char *base;       /* cuGetProcAddress name; NULL for runtime/NVML */
    int minver;
    int ptsz;
    uint8_t layer, op, kind, space;
    uint16_t api;
    int slot;
    void *wrap;
    void *wrap_ptsz;
};

static const struct hook hooks[] = {
#define CT_DRIVER(ID, BASE, MINVER, PTSZ, OP, KIND, SPACE, ...)                                  \
    {#ID, BASE, MINVER, PTSZ, CT_LAYER_DRIVER, OP, KIND, SPACE, CT_API_##ID, CT_SLOT_##ID,         \
     (void *)ID, (void *)ct_ptsz_##ID},
#define CT_RUNTIME(ID, ...)                                                                      \
    {#ID, NULL, 0, 0, CT_LAYER_RUNTIME, CT_OP_NONE, 0, 0, CT_API_##ID, CT_SLOT_##ID, (void *)ID, NULL},
#define CT_NVML(ID, ...)                                                                         \
    {#ID, NULL, 0, 0, CT_LAYER_NVML, CT_OP_MEMINFO, 0, 0, CT_API_##ID, CT_SLOT_##ID, (void *)ID, NULL},
#include "hooks.def"
#undef CT_DRIVER
#undef CT_RUNTIME
#undef CT_NVML
};
#define NHOOKS (sizeof hooks / sizeof hooks[0])

static const char *api_name(uint16_t api)
{
    for (size_t i = 0; i < NHOOKS; i++)
        if (hooks[i].api == api)
            return hooks[i].sym;
    return "?";
}

static void keep_real(int slot, void *p)
{
    void *expected = NULL;
    __atomic_compare_exchange_n(&real_ptr[slot], &expected, p, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

CT_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags);
CT_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status);

static int is_own_wrapper(void *p)
{
    if (p == (void *)cuGetProcAddress || p == (void *)cuGetProcAddress_v2)
        return 1;
    for (size_t i = 0; i < NHOOKS; i++)
        if (p == hooks[i].wrap || (hooks[i].wrap_ptsz && p == hooks[i].wrap_ptsz))
            return 1;
    return 0;
}

/* dlsym(handle, name) found p: the wrapper to hand out instead, or p */
static void *wrap_symbol(void *handle, const char *name, void *p)
{
    if (is_own_wrapper(p))
        return p;
    if (strcmp(name, "cuGetProcAddress") == 0 || strcmp(name, "cuGetProcAddress_v2") == 0) {
        /* the handle the program reaches the driver through: the shim's own queries use it */
        __atomic_store_n(&cuda_handle, handle, __ATOMIC_RELEASE);
        int v2 = name[16] != 0;
        keep_real(v2 ? CT_SLOT_cuGetProcAddress_v2 : CT_SLOT_cuGetProcAddress, p);
        return v2 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    }
    size_t n = strlen(name);
    for (size_t i = 0; i < NHOOKS; i++) {
        const struct hook *h = &hooks[i];
        size_t l = strlen(h->sym);
        if (strncmp(name, h->sym, l) != 0)
            continue;
        int exact = n == l, twin = h->ptsz && n == l + 5 && strcmp(name + l, "_ptsz") == 0;
        if (!exact && !twin)
            continue;
        if (h->layer == CT_LAYER_DRIVER)
            __atomic_store_n(&cuda_handle, handle, __ATOMIC_RELEASE);
        else if (h->layer == CT_LAYER_NVML)
            __atomic_store_n(&nvml_handle, handle, __ATOMIC_RELEASE);
        keep_real(exact ? h->slot : h->slot + 1, p);
        return exact ? h->wrap : h->wrap_ptsz;
    }
    return p;
}

/* cuGetProcAddress gave p for (symbol, version, flags): the wrapper of exactly that variant */
static void *wrap_proc(const char *symbol, void *p, int ver, cuuint64_t flags)
{
    if (is_own_wrapper(p))
        return p;
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
        if (ver >= 12000) {
            keep_real(CT_SLOT_cuGetProcAddress_v2, p);
            return (void *)cuGetProcAddress_v2;
        }
        keep_real(CT_SLOT_cuGetProcAddress, p);
        return (void *)cuGetProcAddress;
    }
    const struct hook *best = NULL;
    for (size_t i = 0; i < NHOOKS; i++) {
        const struct hook *h = &hooks[i];
        if (h->base && strcmp(h->base, symbol) == 0 && h->minver <= ver &&
            (!best || h->minver > best->minver))
            best = h;
    }
    if (!best)
        return p;                 /* not hooked, or an older ABI: the driver's own, unwrapped */
    if (best->ptsz && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) {
        keep_real(best->slot + 1, p);
        return best->wrap_ptsz;
    }
    keep_real(best->slot, p);
    return best->wrap;
}

CT_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status)
{
    typedef CUresult (*fn_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
    fn_t real = (fn_t)ct_real(CT_SLOT_cuGetProcAddress_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn) {
        pthread_once(&once, init_once);
        *pfn = wrap_proc(symbol, *pfn, ver, flags);
    }
    return r;
}

CT_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
    typedef CUresult (*fn_t)(const char *, void **, int, cuuint64_t);
    fn_t real = (fn_t)ct_real(CT_SLOT_cuGetProcAddress);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, ver, flags);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn) {
        pthread_once(&once, init_once);
        *pfn = wrap_proc(symbol, *pfn, ver, flags);
    }
    return r;
}

/* dlsym: RTLD_NEXT must keep meaning "after the caller", so that path is a plain tail call
 * (the real dlsym then sees the caller's return address, not ours). Optimized whatever CFLAGS
 * say, so the compiler emits that tail call even in a -O0 build. */
#if defined(__GNUC__) && !defined(__clang__)
#define CT_TAILCALLS __attribute__((optimize("O2", "optimize-sibling-calls")))
#else
#define CT_TAILCALLS
#endif
CT_EXPORT CT_TAILCALLS void *dlsym(void *handle, const char *name)
{
    dlsym_fn ds = get_real_dlsym();
    if (!ds)
        return NULL;
    if (handle == RTLD_NEXT || (name[0] != 'c' && name[0] != 'n'))
        return ds(handle, name);
    void *p = ds(handle, name);
    if (!p)
        return p;
    return wrap_symbol(handle, name, p);
}

/* ---- the opening records of a trace file ------------------------------------------------ */
static void write_info(const char *key, const char *value)
{
    struct ct_rec_info r = {(uint16_t)strlen(key), (uint16_t)strlen(value), 0};
    ct_rec_write(CT_REC_INFO, &r, sizeof r, key, strlen(key) + 1, value, strlen(value) + 1);
}

void ct_write_preamble(void)
{
    static char buf[32768];          /* under the writer lock: one user at a time */
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
    for (size_t i = 0; i < NHOOKS; i++) {
        const struct hook *h = &hooks[i];
        struct ct_rec_api a = {h->api, h->layer, h->op, h->kind, h->space, (uint16_t)strlen(h->sym)};
        ct_rec_write(CT_REC_API, &a, sizeof a, h->sym, strlen(h->sym) + 1, NULL, 0);
    }
    char num[24];
    ct_fmt_u64(num, (uint64_t)ct_cfg.stack_depth);
    write_info("stack_depth", num);
    write_info("shim_version", CT_SHIM_VERSION);
    if (ledger) {
        write_info("ledger", ct_cfg.ledger_path);
        write_info("on_exceed", ct_cfg.on_exceed == CT_EXCEED_WARN    ? "warn"
                                : ct_cfg.on_exceed == CT_EXCEED_ABORT ? "abort"
                                                                      : "fail");
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
            uint64_t lim = ct_ledger_limit(ledger, d);
            if (lim) {
                char key[32] = "budget.";
                ct_fmt_u64(key + 7, (uint64_t)d);
                ct_fmt_u64(num, lim);
                write_info(key, num);
            }
        }
    }
    CUresult (*ver)(int *) = (CUresult(*)(int *))driver_sym("cuDriverGetVersion");
    int v = 0;
    if (ver && ver(&v) == CUDA_SUCCESS) {
        ct_fmt_u64(num, (uint64_t)v);
        write_info("driver_version", num);
    }
}

/* ---- load, fork, exit ------------------------------------------------------------------- */
static void join_ledger(void)
{
    if (ledger && ct_ledger_join(ledger, getpid(), 0)   /* 0: it reads /proc itself */ < 0) {
        ct_log("cannot join the budget ledger (all member slots taken): budget not enforced in pid ",
               NULL, NULL, NULL);
    }
}

static void atfork_prepare(void)
{
    ct_py_atfork_prepare();
    ct_stacks_atfork_prepare();
    ct_writer_atfork_prepare();
    pthread_mutex_lock(&atab_mu);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&atab_mu);
    ct_writer_atfork_parent();
    ct_stacks_atfork_parent();
    ct_py_atfork_parent();
}

static void atfork_child(void)
{
    tls_tid = 0;
    pthread_mutex_init(&atab_mu, NULL);
    if (atab) {
        munmap(atab, sizeof(struct aent) * ATAB_SIZE);   /* the parent's allocations, not ours */
        atab = NULL;
        atab_used = 0;
    }
    ct_writer_atfork_child();
    ct_stacks_reset();
    ct_py_reset();
    ct_modules_reset();
    join_ledger();
}

static long env_long(const char *name, long dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    long v = strtol(s, &end, 10);
    return *end ? dflt : v;
}

static void init_once(void)
{
    get_real_dlsym();
    const char *dir = getenv("CUDATRACE_DIR");
    if (!dir || !*dir || strlen(dir) >= sizeof ct_cfg.dir)
        return;
    ct_strlcpy(ct_cfg.dir, dir, sizeof ct_cfg.dir);
    long depth = env_long("CUDATRACE_STACK_DEPTH", 64);
    ct_cfg.stack_depth = depth < 0 ? 0 : depth > CT_MAX_DEPTH ? CT_MAX_DEPTH : (int)depth;
    ct_cfg.launcher_pid = (int)env_long("CUDATRACE_LAUNCHER_PID", 0);
    /* the command the launcher started writes its file at once, so a run always shows whether
     * the shim entered it; other processes only once they use CUDA */
    ct_cfg.eager = ct_cfg.launcher_pid > 0 && ct_cfg.launcher_pid == (int)getppid();
    ct_cfg.count_host = (int)env_long("CUDATRACE_COUNT_HOST", 0);
    ct_cfg.virtualize = (int)env_long("CUDATRACE_VIRTUALIZE", 1);
    const char *oe = getenv("CUDATRACE_ON_EXCEED");
    ct_cfg.on_exceed = !oe ? CT_EXCEED_FAIL
                       : strcmp(oe, "warn") == 0  ? CT_EXCEED_WARN
                       : strcmp(oe, "abort") == 0 ? CT_EXCEED_ABORT
                                                  : CT_EXCEED_FAIL;
    const char *lp = getenv("CUDATRACE_LEDGER");
    if (lp && *lp && strlen(lp) < sizeof ct_cfg.ledger_path) {
        char err[256];
        ct_strlcpy(ct_cfg.ledger_path, lp, sizeof ct_cfg.ledger_path);
        ledger = ct_ledger_open(lp, 0, err, sizeof err);
        if (!ledger)
            ct_log("budget ledger unusable, budget NOT enforced in this process: ", err, NULL, NULL);
        join_ledger();
    }
    ct_modules_init();
    if (ct_cfg.stack_depth > 0) {
        void *warm[4];
        backtrace(warm, 4);       /* loads the unwinder now, not inside a CUDA call */
        ct_stacks_init();
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    ct_cfg.active = 1;
    if (ct_cfg.eager)
        ct_writer_open_now();
}

__attribute__((constructor)) static void ct_constructor(void) { pthread_once(&once, init_once); }

__attribute__((destructor)) static void ct_destructor(void)
{
    if (!ct_cfg.active)
        return;
    ct_writer_close(exit_status);
    if (ledger)
        ct_ledger_leave(ledger);
}
