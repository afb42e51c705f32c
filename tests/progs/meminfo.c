/* meminfo.c - what a program that sizes itself reads: cuMemGetInfo_v2 through the linked symbol
 * and through cuGetProcAddress, and NVML's nvmlDeviceGetMemoryInfo[_v2] through dlopen, with NULL
 * out-pointers too.
 *
 * usage: meminfo [--alloc SIZE] [--no-nvml]
 *   --alloc SIZE  cuMemAlloc_v2 SIZE first (freed at the end), so free differs from total
 *   --no-nvml     skip the NVML section
 *
 * Output, in this order (format: cudasim_api.h):
 *   [alloc cuMemAlloc_v2 SIZE PTR R]
 *   # route link
 *   meminfo cuMemGetInfo_v2 T F R          both pointers
 *   meminfo cuMemGetInfo_v2 T - R          free NULL
 *   meminfo cuMemGetInfo_v2 - F R          total NULL
 *   meminfo cuMemGetInfo_v2 - - R          both NULL
 *   # route gpa
 *   resolve cuMemGetInfo 13000 0 R STATUS SYMBOL LIBRARY
 *   (the same four meminfo lines, through the resolved pointer)
 *   # route nvml                           ("# nvml unavailable" if dlopen fails: not an error)
 *   meminfo nvmlDeviceGetMemoryInfo T F R
 *   # nvml used U
 *   meminfo nvmlDeviceGetMemoryInfo - - R          NULL memory: expect 2 (INVALID_ARGUMENT)
 *   meminfo nvmlDeviceGetMemoryInfo_v2 T F R
 *   # nvml_v2 used U reserved V
 *   meminfo nvmlDeviceGetMemoryInfo_v2 - - R       version 0: expect 13 (FUNCTION_NOT_FOUND, what
 *                                                  NVML 580 answers; 25 ARGUMENT_VERSION_MISMATCH
 *                                                  is accepted too)
 *   meminfo nvmlDeviceGetMemoryInfo_v2 - - R       NULL memory: expect 2
 *   # nvml processes N
 *   # nvml process PID USED                        (N lines, nvmlDeviceGetComputeRunningProcesses_v3)
 *   [free cuMemFree_v2 SIZE PTR R]
 * Exit 0 when every call returned what is expected (NVML_ERROR_NOT_SUPPORTED from the memory
 * queries is accepted too: integrated devices answer it), else 1.
 */
#include <dlfcn.h>

#include "cudasim_api.h"

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void expect_line(const char *api, const size_t *t, const size_t *f, int r, int want)
{
    meminfo_line(api, t, f, r);
    if (r != 0)
        g_failures--; /* meminfo_line counted it */
    if (r != want && r != 3 /* NVML_ERROR_NOT_SUPPORTED */)
        g_failures++;
}

NOINLINE void meminfo_link(void)
{
    size_t f = 0, t = 0;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    meminfo_line("cuMemGetInfo_v2", &t, &f, r);
    r = cuMemGetInfo_v2(NULL, &t);
    meminfo_line("cuMemGetInfo_v2", &t, NULL, r);
    r = cuMemGetInfo_v2(&f, NULL);
    meminfo_line("cuMemGetInfo_v2", NULL, &f, r);
    r = cuMemGetInfo_v2(NULL, NULL);
    meminfo_line("cuMemGetInfo_v2", NULL, NULL, r);
}

NOINLINE void meminfo_gpa(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    gpa_v2_t gpa = h ? (gpa_v2_t)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!gpa) {
        printf("# gpa unavailable\n");
        g_failures++;
        return;
    }
    void *p = NULL;
    CUdriverProcAddressQueryResult st = -1;
    CUresult r = gpa("cuMemGetInfo", &p, 13000, 0, &st);
    Dl_info di;
    const char *sym = "-", *lib = "-";
    if (p && dladdr(p, &di)) {
        sym = di.dli_sname ? di.dli_sname : "-";
        if (di.dli_fname) {
            const char *s = strrchr(di.dli_fname, '/');
            lib = s ? s + 1 : di.dli_fname;
        }
    }
    printf("resolve cuMemGetInfo 13000 0 %d %d %s %s\n", r, st, sym, lib);
    if (r || !p) {
        g_failures++;
        return;
    }
    CUresult (*mgi)(size_t *, size_t *) = (CUresult(*)(size_t *, size_t *))p;
    size_t f = 0, t = 0;
    r = mgi(&f, &t);
    meminfo_line("cuMemGetInfo_v2", &t, &f, r);
    r = mgi(NULL, &t);
    meminfo_line("cuMemGetInfo_v2", &t, NULL, r);
    r = mgi(&f, NULL);
    meminfo_line("cuMemGetInfo_v2", NULL, &f, r);
    r = mgi(NULL, NULL);
    meminfo_line("cuMemGetInfo_v2", NULL, NULL, r);
}

NOINLINE void meminfo_nvml(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) {
        printf("# nvml unavailable\n");
        return;
    }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlInit_v2");
    nvmlReturn_t (*shutdown)(void) = (nvmlReturn_t(*)(void))dlsym(h, "nvmlShutdown");
    nvmlReturn_t (*byindex)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*mem1)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *))dlsym(
            h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!init || !shutdown || !byindex || !mem1 || !mem2 || !procs) {
        printf("# nvml incomplete\n");
        g_failures++;
        return;
    }
    nvmlDevice_t dev = NULL;
    note("nvmlInit_v2", init());
    note("nvmlDeviceGetHandleByIndex_v2", byindex(0, &dev));

    nvmlMemory_t m1;
    memset(&m1, 0, sizeof(m1));
    nvmlReturn_t r = mem1(dev, &m1);
    size_t t = m1.total, f = m1.free;
    expect_line("nvmlDeviceGetMemoryInfo", r ? NULL : &t, r ? NULL : &f, r, 0);
    printf("# nvml used %llu\n", m1.used);
    r = mem1(dev, NULL);
    expect_line("nvmlDeviceGetMemoryInfo", NULL, NULL, r, 2);

    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof(m2));
    m2.version = CUDASIM_NVML_MEMORY_V2;
    r = mem2(dev, &m2);
    t = m2.total;
    f = m2.free;
    expect_line("nvmlDeviceGetMemoryInfo_v2", r ? NULL : &t, r ? NULL : &f, r, 0);
    printf("# nvml_v2 used %llu reserved %llu\n", m2.used, m2.reserved);
    memset(&m2, 0, sizeof(m2));
    r = mem2(dev, &m2);
    expect_line("nvmlDeviceGetMemoryInfo_v2", NULL, NULL, r, r == 25 ? 25 : 13);
    r = mem2(dev, NULL);
    expect_line("nvmlDeviceGetMemoryInfo_v2", NULL, NULL, r, 2);

    nvmlProcessInfo_t info[64];
    unsigned n = 64;
    r = procs(dev, &n, info);
    note("nvmlDeviceGetComputeRunningProcesses_v3", r);
    if (!r) {
        printf("# nvml processes %u\n", n);
        for (unsigned k = 0; k < n; k++)
            printf("# nvml process %u %llu\n", info[k].pid, info[k].usedGpuMemory);
    }
    note("nvmlShutdown", shutdown());
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned long long alloc = 0;
    int nvml = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--alloc") && i + 1 < argc) {
            alloc = parse_size(argv[++i]);
        } else if (!strcmp(argv[i], "--no-nvml")) {
            nvml = 0;
        } else {
            fprintf(stderr, "usage: meminfo [--alloc SIZE] [--no-nvml]\n");
            return 2;
        }
    }
    CUresult r = cuInit(0);
    if (r) {
        printf("# cuInit %d\n", r);
        return 1;
    }
    CUdeviceptr p = 0;
    if (alloc) {
        r = cuMemAlloc_v2(&p, alloc);
        op_line("alloc", "cuMemAlloc_v2", alloc, p, r);
    }
    printf("# route link\n");
    meminfo_link();
    printf("# route gpa\n");
    meminfo_gpa();
    if (nvml) {
        printf("# route nvml\n");
        meminfo_nvml();
    }
    if (alloc && p)
        op_line("free", "cuMemFree_v2", alloc, p, cuMemFree_v2(p));
    return g_failures ? 1 : 0;
}
