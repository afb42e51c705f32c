/* procstat.c - what the ledger reads of /proc (procstat.h): a member's liveness and identity
 * (its state and start time, /proc/<pid>/stat), this process's pid namespace, and the path that
 * reopens one of its descriptors. Paths are built without stdio (the shim's rule: libc only,
 * nothing that may allocate or lock inside the traced program). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "procstat.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* the decimal digits of v at o; the end */
static char *put_decimal(char *o, uint32_t v)
{
    char digits[16];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < 15);
    while (n)
        *o++ = digits[--n];
    return o;
}

/* "/proc/<pid>/<leaf>" into buf (>= 64 bytes) */
static void proc_path(char *buf, int32_t pid, const char *leaf)
{
    char *o = buf;
    memcpy(o, "/proc/", 6);
    o = put_decimal(o + 6, (uint32_t)pid);
    *o++ = '/';
    size_t ll = strlen(leaf);
    memcpy(o, leaf, ll);
    o[ll] = 0;
}

/* the state letter (field 3) and the start time (field 22) of a stat line's text after its
 * command's ")": 1, or -1 when the line is short */
static int stat_fields(const char *p, char *state, uint64_t *ticks)
{
    int field = 2;
    char st = 0;
    while (*p) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        field++;
        if (field == 3)
            st = *p;
        if (field == 22) {
            uint64_t val = 0;
            while (*p >= '0' && *p <= '9')
                val = val * 10 + (uint64_t)(*p++ - '0');
            *state = st;
            *ticks = val;
            return 1;
        }
        while (*p && *p != ' ')
            p++;
    }
    return -1;
}

int ct_procstat_read(int32_t pid, char *state, uint64_t *ticks)
{
    char path[64], buf[1024];
    proc_path(path, pid, "stat");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return (errno == ENOENT || errno == ESRCH) ? 0 : -1;
    ssize_t n;
    do {
        n = read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (n <= 0)
        return (n < 0 && e == ESRCH) ? 0 : -1;
    buf[n] = 0;
    char *p = memrchr(buf, ')', (size_t)n); /* comm may hold spaces and parentheses */
    if (!p)
        return -1;
    /* after ")": " S ppid pgrp ..." -- field 3 is the state, field 22 the start time */
    return stat_fields(p + 1, state, ticks);
}

uint64_t ct_procstat_start_ticks(int32_t pid)
{
    if (pid <= 0)
        return 0;
    int saved = errno;
    char st;
    uint64_t t = 0;
    if (ct_procstat_read(pid, &st, &t) != 1)
        t = 0;
    errno = saved;
    return t;
}

uint64_t ct_procstat_self_pidns(void)
{
    struct stat sb;
    if (stat("/proc/self/ns/pid", &sb) != 0)
        return 0;
    return (uint64_t)sb.st_ino;
}

void ct_procstat_fd_path(char *buf, int fd)
{
    memcpy(buf, "/proc/self/fd/", 14);
    *put_decimal(buf + 14, (uint32_t)fd) = 0;
}
