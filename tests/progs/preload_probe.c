/* preload_probe.c - what a program sees of a cudatrace device where it runs, in three lines:
 *
 *   preload-file: <the first line of /etc/ld.so.preload, or (none)>
 *   ld-preload: <$LD_PRELOAD, or (unset)>
 *   mapped: <the path of the mapped libcudatrace.so, or no>
 *
 * Plain C of any C library, no CUDA: built for the host, for glibc 2.17 and for musl (static and
 * dynamic, by zig) to show which loaders load the preload library and which pass it by.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void first_line(const char *path, char *out, size_t n)
{
    FILE *f = fopen(path, "r");
    snprintf(out, n, "(none)");
    if (f == NULL)
        return;
    if (fgets(out, (int)n, f) == NULL)
        snprintf(out, n, "(empty)");
    out[strcspn(out, "\n")] = 0;
    fclose(f);
}

static void mapped(char *out, size_t n)
{
    char line[4096];
    FILE *f = fopen("/proc/self/maps", "r");
    snprintf(out, n, "no");
    if (f == NULL) {
        snprintf(out, n, "(no /proc/self/maps)");
        return;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        char *p = strstr(line, "libcudatrace.so");
        char *path = strchr(line, '/');
        if (p != NULL && path != NULL && path < p) {
            line[strcspn(line, "\n")] = 0;
            snprintf(out, n, "%s", path);
            break;
        }
    }
    fclose(f);
}

int main(void)
{
    char buf[4096];
    const char *env = getenv("LD_PRELOAD");
    first_line("/etc/ld.so.preload", buf, sizeof buf);
    printf("preload-file: %s\n", buf);
    printf("ld-preload: %s\n", env ? env : "(unset)");
    mapped(buf, sizeof buf);
    printf("mapped: %s\n", buf);
    return 0;
}
