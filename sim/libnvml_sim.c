/* libnvml_sim.c - a simulated NVML (libnvidia-ml.so.1) over the simulated driver's device state.
 *
 * Reads the same state as libcuda_sim.c (sim_state.h): with CUDASIM_STATE the shared file; without
 * it, the state of libcuda_sim loaded in this process (if any), else private empty state.
 *
 * Environment: CUDASIM_STATE, CUDASIM_DEVICES, CUDASIM_TOTAL_BYTES (as libcuda_sim),
 *   CUDASIM_INTEGRATED=1   memory queries answer NVML_ERROR_NOT_SUPPORTED (as on Jetson/Tegra)
 *   CUDASIM_DRIVER_VERSION nvmlSystemGetCudaDriverVersion (default 13000)
 *   CUDASIM_CALLS=path     at exit, append "pid symbol count" lines, as libcuda_sim does
 *   CUDASIM_NVML_PROCS_MS=n the first list of processes a process asks for takes n ms (a real
 *                          NVML's first answers take long without persistence mode, or on a
 *                          loaded machine)
 *   CUDASIM_NVML_PROCS=how  what the lists of processes say of each process's memory, as NVML
 *                          does where it cannot see it: "bytes" (the default: its figure), "na"
 *                          (NVML_VALUE_NOT_AVAILABLE: an integrated GPU such as a Jetson Thor),
 *                          "mig" (not available, with GPU and compute instance ids: a MIG
 *                          instance seen from its GPU's handle), "unsupported" (the query answers
 *                          NVML_ERROR_NOT_SUPPORTED: a driver or a vGPU without it)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"
#include "sim_state.h"

#define SIM_EXPORT __attribute__((visibility("default")))

#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999
#define NVML_VALUE_NOT_AVAILABLE (~0ULL) /* a figure NVML cannot give */

#define NVML_STRUCT_VERSION(sz, ver) ((unsigned int)((sz) | ((ver) << 24U)))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* = nvmlProcessInfo_v2_t, what _v2 and _v3 take */

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* The NVML functions the shim hooks (hooks.def CT_NVML): declared from there, so the compiler
 * checks the signatures below against the shim's. */
#define CT_DRIVER(...)
#define CT_RUNTIME(...)
#define CT_NVML(ID, PROTO, ARGS) SIM_EXPORT nvmlReturn_t ID PROTO;
#include "hooks.def"
#undef CT_NVML

SIM_EXPORT nvmlReturn_t nvmlInit_v2(void);
SIM_EXPORT nvmlReturn_t nvmlInit(void);
SIM_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
SIM_EXPORT nvmlReturn_t nvmlShutdown(void);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                             unsigned int *infoCount,
                                                             nvmlProcessInfo_v1_t *infos);
SIM_EXPORT const char *nvmlErrorString(nvmlReturn_t result);
SIM_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion);
SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion);

/* clang-format off */
#define NVML_SYMS(X)                                                                          \
    X(nvmlInit_v2) X(nvmlInit) X(nvmlInitWithFlags) X(nvmlShutdown) X(nvmlDeviceGetCount_v2)   \
    X(nvmlDeviceGetCount) X(nvmlDeviceGetHandleByIndex_v2) X(nvmlDeviceGetHandleByIndex)      \
    X(nvmlDeviceGetIndex) X(nvmlDeviceGetName) X(nvmlDeviceGetMemoryInfo)                     \
    X(nvmlDeviceGetMemoryInfo_v2) X(nvmlDeviceGetComputeRunningProcesses_v3)                  \
    X(nvmlDeviceGetComputeRunningProcesses_v2) X(nvmlDeviceGetComputeRunningProcesses)        \
    X(nvmlErrorString) X(nvmlSystemGetDriverVersion) X(nvmlSystemGetCudaDriverVersion)        \
    X(nvmlSystemGetCudaDriverVersion_v2) X(nvmlDeviceGetUUID)
/* clang-format on */

enum {
#define X(n) SYM_##n,
    NVML_SYMS(X)
#undef X
    SYM_COUNT
};
static const char *const sym_names[SYM_COUNT] = {
#define X(n) #n,
    NVML_SYMS(X)
#undef X
};
static uint64_t g_calls[SYM_COUNT];
#define COUNT(n) __atomic_fetch_add(&g_calls[SYM_##n], 1, __ATOMIC_RELAXED)

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct cudasim_state *g_st;
static int g_integrated;
static int g_driver_version;
enum {
    PROCS_BYTES,
    PROCS_NA,
    PROCS_MIG,
    PROCS_UNSUPPORTED
};
static int g_procs_view; /* CUDASIM_NVML_PROCS */
static int g_refs;       /* nvmlInit count minus nvmlShutdown count */

struct nvmlDevice_st {
    int index;
};
static struct nvmlDevice_st g_devs[CUDASIM_MAX_DEVICES] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};

static void nvml_atfork_child(void) { memset(g_calls, 0, sizeof(g_calls)); }

static int procs_view(const char *how)
{
    if (!how || !*how || !strcmp(how, "bytes"))
        return PROCS_BYTES;
    if (!strcmp(how, "na"))
        return PROCS_NA;
    if (!strcmp(how, "mig"))
        return PROCS_MIG;
    if (!strcmp(how, "unsupported"))
        return PROCS_UNSUPPORTED;
    fprintf(stderr, "libnvml_sim: CUDASIM_NVML_PROCS=%s: give bytes, na, mig or unsupported\n",
            how);
    return PROCS_BYTES;
}

static void nvml_setup(void)
{
    pthread_atfork(NULL, NULL, nvml_atfork_child);
    g_integrated = cudasim_env_ull("CUDASIM_INTEGRATED", 0) != 0;
    g_driver_version = (int)cudasim_env_ull("CUDASIM_DRIVER_VERSION", 13000);
    g_procs_view = procs_view(getenv("CUDASIM_NVML_PROCS"));
    const char *path = getenv("CUDASIM_STATE");
    if (!path || !*path) {
        /* the simulated driver's private state, when it is loaded in this process */
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); /* loaded RTLD_LOCAL too */
        void *sym = h ? dlsym(h, "cudasim_state_get") : NULL;
        if (!sym)
            sym = dlsym(RTLD_DEFAULT, "cudasim_state_get");
        struct cudasim_state *(*get)(void) = (struct cudasim_state * (*)(void)) sym;
        if (get)
            g_st = get();
    }
    if (!g_st)
        g_st = cudasim_state_open("libnvml_sim");
}

static int initialized(void) { return __atomic_load_n(&g_refs, __ATOMIC_ACQUIRE) > 0; }

static int dev_index(nvmlDevice_t device)
{
    for (unsigned i = 0; g_st && i < g_st->ndevices; i++)
        if (device == &g_devs[i])
            return (int)i;
    return -1;
}

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (!initialized())                                                                        \
            return NVML_ERROR_UNINITIALIZED;                                                       \
    } while (0)

nvmlReturn_t nvmlInit_v2(void)
{
    COUNT(nvmlInit_v2);
    pthread_once(&g_once, nvml_setup);
    __atomic_fetch_add(&g_refs, 1, __ATOMIC_ACQ_REL);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void)
{
    COUNT(nvmlInit);
    pthread_once(&g_once, nvml_setup);
    __atomic_fetch_add(&g_refs, 1, __ATOMIC_ACQ_REL);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    COUNT(nvmlInitWithFlags);
    pthread_once(&g_once, nvml_setup);
    __atomic_fetch_add(&g_refs, 1, __ATOMIC_ACQ_REL);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
    COUNT(nvmlShutdown);
    int cur = __atomic_load_n(&g_refs, __ATOMIC_ACQUIRE);
    do {
        if (cur <= 0)
            return NVML_ERROR_UNINITIALIZED;
    } while (!__atomic_compare_exchange_n(&g_refs, &cur, cur - 1, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    return NVML_SUCCESS;
}

static nvmlReturn_t get_count(unsigned int *deviceCount)
{
    NEED_INIT();
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = g_st->ndevices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    COUNT(nvmlDeviceGetCount_v2);
    return get_count(deviceCount);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    COUNT(nvmlDeviceGetCount);
    return get_count(deviceCount);
}

static nvmlReturn_t get_handle(unsigned int index, nvmlDevice_t *device)
{
    NEED_INIT();
    if (!device || index >= g_st->ndevices)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devs[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    COUNT(nvmlDeviceGetHandleByIndex_v2);
    return get_handle(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    COUNT(nvmlDeviceGetHandleByIndex);
    return get_handle(index, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    COUNT(nvmlDeviceGetIndex);
    NEED_INIT();
    int i = dev_index(device);
    if (i < 0 || !index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    COUNT(nvmlDeviceGetName);
    NEED_INIT();
    int i = dev_index(device);
    if (i < 0 || !name)
        return NVML_ERROR_INVALID_ARGUMENT;
    char buf[96];
    int n = snprintf(buf, sizeof(buf), "cudasim %s device %d",
                     g_integrated ? "integrated" : "discrete", i);
    if ((unsigned)n + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(name, buf, (size_t)n + 1);
    return NVML_SUCCESS;
}

/* a UUID of NVML's form, one per simulated device: GPU-5ca1ab1e-0000-4000-8000-00000000000N */
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    COUNT(nvmlDeviceGetUUID);
    NEED_INIT();
    int i = dev_index(device);
    if (i < 0 || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    char buf[96];
    int n = snprintf(buf, sizeof(buf), "GPU-5ca1ab1e-0000-4000-8000-%012d", i);
    if ((unsigned)n + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, buf, (size_t)n + 1);
    return NVML_SUCCESS;
}

/* total/free/used of one device, dead processes' memory given back first */
static nvmlReturn_t mem_of(nvmlDevice_t device, uint64_t *total, uint64_t *freeb, uint64_t *used)
{
    NEED_INIT();
    int i = dev_index(device);
    if (i < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_integrated)
        return NVML_ERROR_NOT_SUPPORTED;
    cudasim_reclaim_dead(g_st, i);
    struct cudasim_device *d = &g_st->dev[i];
    uint64_t u = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
    *total = d->total;
    *used = u;
    *freeb = u < d->total ? d->total - u : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    COUNT(nvmlDeviceGetMemoryInfo);
    NEED_INIT();
    if (!memory || dev_index(device) < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t t, f, u;
    nvmlReturn_t r = mem_of(device, &t, &f, &u);
    if (r)
        return r;
    memory->total = t;
    memory->free = f;
    memory->used = u;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    COUNT(nvmlDeviceGetMemoryInfo_v2);
    NEED_INIT();
    if (!memory || dev_index(device) < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* measured (NVML 580.159): a wrong version answers FUNCTION_NOT_FOUND, not the documented
     * ARGUMENT_VERSION_MISMATCH */
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    uint64_t t, f, u;
    nvmlReturn_t r = mem_of(device, &t, &f, &u);
    if (r)
        return r;
    memory->total = t;
    memory->reserved = 0;
    memory->free = f;
    memory->used = u;
    return NVML_SUCCESS;
}

/* Processes holding memory on the device: live pid slots of the state. */
static nvmlReturn_t procs(nvmlDevice_t device, unsigned int *infoCount, void *infos, size_t stride,
                          int with_instance)
{
    NEED_INIT();
    int i = dev_index(device);
    if (i < 0 || !infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_procs_view == PROCS_UNSUPPORTED)
        return NVML_ERROR_NOT_SUPPORTED;
    static int listed;
    unsigned long long ms = cudasim_env_ull("CUDASIM_NVML_PROCS_MS", 0);
    if (ms && !__atomic_exchange_n(&listed, 1, __ATOMIC_ACQ_REL)) {
        struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    cudasim_reclaim_dead(g_st, i);
    struct cudasim_device *d = &g_st->dev[i];
    unsigned pids[CUDASIM_MAX_PIDS];
    unsigned long long used[CUDASIM_MAX_PIDS];
    unsigned n = 0;
    for (int k = 0; k < CUDASIM_MAX_PIDS; k++) {
        int32_t p = __atomic_load_n(&d->pids[k].pid, __ATOMIC_ACQUIRE);
        if (p <= 0)
            continue;
        pids[n] = (unsigned)p;
        used[n] = __atomic_load_n(&d->pids[k].used, __ATOMIC_ACQUIRE);
        if (g_procs_view != PROCS_BYTES)
            used[n] = NVML_VALUE_NOT_AVAILABLE;
        n++;
    }
    if (*infoCount < n || (n && !infos)) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < n; k++) {
        char *rec = (char *)infos + k * stride;
        if (with_instance) {
            nvmlProcessInfo_t *pi = (nvmlProcessInfo_t *)rec;
            pi->pid = pids[k];
            pi->usedGpuMemory = used[k];
            pi->gpuInstanceId =
                g_procs_view == PROCS_MIG ? 0u : 0xFFFFFFFFu; /* 0xFFFFFFFF: no MIG */
            pi->computeInstanceId = g_procs_view == PROCS_MIG ? 0u : 0xFFFFFFFFu;
        } else {
            nvmlProcessInfo_v1_t *pi = (nvmlProcessInfo_v1_t *)rec;
            pi->pid = pids[k];
            pi->usedGpuMemory = used[k];
        }
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    COUNT(nvmlDeviceGetComputeRunningProcesses_v3);
    return procs(device, infoCount, infos, sizeof(nvmlProcessInfo_t), 1);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    COUNT(nvmlDeviceGetComputeRunningProcesses_v2);
    return procs(device, infoCount, infos, sizeof(nvmlProcessInfo_t), 1);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    COUNT(nvmlDeviceGetComputeRunningProcesses);
    return procs(device, infoCount, infos, sizeof(nvmlProcessInfo_v1_t), 0);
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    COUNT(nvmlErrorString);
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
        return "Function Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    default:
        return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    COUNT(nvmlSystemGetDriverVersion);
    NEED_INIT();
    static const char v[] = "580.159.01";
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < sizeof(v))
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, v, sizeof(v));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    COUNT(nvmlSystemGetCudaDriverVersion);
    NEED_INIT();
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = g_driver_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    COUNT(nvmlSystemGetCudaDriverVersion_v2);
    NEED_INIT();
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = g_driver_version;
    return NVML_SUCCESS;
}

__attribute__((destructor)) static void nvml_fini(void)
{
    const char *path = getenv("CUDASIM_CALLS");
    if (!path || !*path)
        return;
    char buf[64 * SYM_COUNT + 1];
    size_t len = 0;
    int pid = getpid();
    for (int i = 0; i < SYM_COUNT; i++) {
        uint64_t n = __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
        if (n)
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%d %s %llu\n", pid, sym_names[i],
                                    (unsigned long long)n);
    }
    if (!len)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t w = write(fd, buf, len);
        (void)w;
        close(fd);
    }
}
