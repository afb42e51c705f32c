/* bypass.c - allocate device memory around the preload library, as a hostile tenant would.
 *
 * usage: bypass [--join SIZE] [--after-ms M] [--ignore-term] --via dlvsym|table SIZE
 *   --join SIZE    first one allocation of SIZE through cuMemAlloc_v2 as linked (the library
 *                  sees it: a process given a budget joins its group with it)
 *   --via dlvsym   libc's own dlsym, reached through dlvsym (which the library does not wrap),
 *                  finds the driver's cuMemAlloc_v2 in libcuda.so.1
 *   --via table    the driver's cuMemAlloc_v2 from libcuda's own dynamic symbol table, read
 *                  in memory through dl_iterate_phdr (a table of entry points of its own)
 *   --after-ms M   wait M milliseconds between the two (a member that has been one a while)
 *   --ignore-term  SIGTERM does nothing (a process that must be killed)
 * Prints "alloc cuMemAlloc_v2 SIZE PTR RESULT" for each allocation, then "breach NS" (the
 * CLOCK_REALTIME nanoseconds just after the allocation around the library returned) and
 * "ready", and sleeps until a signal ends it.
 */
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "cudasim_api.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef void *(*dlsym_fn)(void *, const char *);

static alloc_fn via_dlvsym(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *libdl = dlopen("libdl.so.2", RTLD_NOW | RTLD_NOLOAD);
    dlsym_fn real = NULL;
    for (size_t i = 0; !real && i < sizeof(versions) / sizeof(*versions); i++) {
        real = libc ? (dlsym_fn)dlvsym(libc, "dlsym", versions[i]) : NULL;
        if (!real && libdl)
            real = (dlsym_fn)dlvsym(libdl, "dlsym", versions[i]);
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return real && cuda ? (alloc_fn)real(cuda, "cuMemAlloc_v2") : NULL;
}

struct found {
    const char *name;
    void *addr;
};

static int find_in_table(struct dl_phdr_info *info, size_t size, void *data)
{
    struct found *f = data;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libcuda.so"))
        return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    const ElfW(Sym) *sym = NULL;
    const char *str = NULL;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB)
            sym = (const ElfW(Sym) *)dyn->d_un.d_ptr;
        else if (dyn->d_tag == DT_STRTAB)
            str = (const char *)dyn->d_un.d_ptr;
    }
    if (!sym || !str || (const char *)sym >= str)
        return 0;
    /* the linker lays the string table right after the symbol table */
    size_t n = (size_t)(str - (const char *)sym) / sizeof(*sym);
    for (size_t i = 0; i < n; i++)
        if (sym[i].st_value && !strcmp(str + sym[i].st_name, f->name)) {
            f->addr = (void *)(info->dlpi_addr + sym[i].st_value);
            return 1;
        }
    return 0;
}

static alloc_fn via_table(void)
{
    struct found f = {"cuMemAlloc_v2", NULL};
    dl_iterate_phdr(find_in_table, &f);
    return (alloc_fn)f.addr;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned long long join = 0;
    long after_ms = 0;
    const char *via = NULL;
    int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        if (!strcmp(argv[i], "--join") && i + 1 < argc)
            join = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--after-ms") && i + 1 < argc)
            after_ms = atol(argv[++i]);
        else if (!strcmp(argv[i], "--via") && i + 1 < argc)
            via = argv[++i];
        else if (!strcmp(argv[i], "--ignore-term"))
            signal(SIGTERM, SIG_IGN);
        else
            break;
    }
    if (argc - i != 1 || !via || (strcmp(via, "dlvsym") && strcmp(via, "table"))) {
        fprintf(
            stderr,
            "usage: bypass [--join SIZE] [--after-ms M] [--ignore-term] --via dlvsym|table SIZE\n");
        return 2;
    }
    unsigned long long size = parse_size(argv[i]);
    CUresult r = cuInit(0);
    if (r) {
        printf("# cuInit %d\n", r);
        return 1;
    }
    CUdeviceptr p = 0;
    if (join) {
        r = cuMemAlloc_v2(&p, join);
        op_line("alloc", "cuMemAlloc_v2", join, p, r);
    }
    if (after_ms > 0) {
        struct timespec ts = {after_ms / 1000, (after_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    alloc_fn raw = !strcmp(via, "dlvsym") ? via_dlvsym() : via_table();
    if (!raw) {
        printf("# no cuMemAlloc_v2 through %s\n", via);
        return 1;
    }
    p = 0;
    r = raw(&p, size);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    op_line("alloc", "cuMemAlloc_v2", size, p, r);
    printf("breach %lld\n", (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    printf("ready\n");
    for (;;)
        pause();
}
