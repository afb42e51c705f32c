/* sim_state.h - device state shared by the simulated CUDA driver (libcuda_sim.c) and the
 * simulated NVML (libnvml_sim.c), and by every process that uses them.
 *
 * With CUDASIM_STATE=<path> the state lives in that file, mmap'd MAP_SHARED, so all processes of
 * a test see one "GPU": used bytes, the high-water mark of used, and per-process usage (what
 * NVML's running-process list reports). Without it each process gets private state.
 *
 * Layout (fixed, native endianness; CUDASIM_STATE_VERSION changes when it changes):
 *   struct cudasim_state { header; struct cudasim_device dev[CUDASIM_MAX_DEVICES]; }
 * Every counter is updated with lock-free atomics (no cross-process lock that a SIGKILLed
 * process could leave held). Creation is serialized with flock(), which the kernel drops when
 * its holder dies.
 *
 * Like a real GPU, memory of a process that ended is given back: a clean exit releases its
 * per-process slot, and the slot of a process that died without that (SIGKILL, _exit, exec) is
 * reclaimed lazily by whoever next scans (meminfo, stats, NVML, an allocation that would fail).
 * A process is dead when /proc/<pid>/stat is gone, is a zombie, or shows another start time.
 * Usage of a process that found no free slot (more than CUDASIM_MAX_PIDS at once) is counted
 * in used but cannot be reclaimed after a crash.
 */
#ifndef CUDASIM_SIM_STATE_H
#define CUDASIM_SIM_STATE_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CUDASIM_STATE_MAGIC 0x3154415453534443ULL /* "CDSSTAT1" little-endian */
#define CUDASIM_STATE_VERSION 1
#define CUDASIM_MAX_DEVICES 8
#define CUDASIM_MAX_PIDS 64
#define CUDASIM_DEFAULT_TOTAL 17179869184ULL /* 16 GiB */

struct cudasim_pid_slot {
    int32_t pid; /* 0: free; -1: being claimed or reclaimed; else owner pid */
    uint32_t reserved;
    uint64_t start_ticks; /* /proc/<pid>/stat field 22 of the owner */
    uint64_t used;        /* bytes the owner holds on this device */
    uint64_t hwm;         /* the owner's high-water mark */
};

struct cudasim_device {
    uint64_t total;     /* bytes */
    uint64_t used;      /* bytes in use, all processes */
    uint64_t hwm;       /* high-water mark of used */
    uint64_t allocs;    /* successful allocations counted toward used */
    uint64_t frees;     /* frees that gave bytes back */
    uint64_t reclaimed; /* bytes given back for processes that ended without freeing */
    uint64_t reserved[2];
    struct cudasim_pid_slot pids[CUDASIM_MAX_PIDS];
};

struct cudasim_state {
    uint64_t magic; /* written last at creation */
    uint32_t version;
    uint32_t size; /* sizeof(struct cudasim_state) */
    uint32_t ndevices;
    uint32_t reserved0;
    uint64_t reserved[6];
    struct cudasim_device dev[CUDASIM_MAX_DEVICES];
};

/* ---- helpers shared by both libraries (static: each library has its own copy) ----------- */

/* An integer with an optional binary suffix (k, m, g, t: KiB, MiB, GiB, TiB); *ok = 0 if s is not
 * one. *end is left after what was read. */
static inline unsigned long long cudasim_parse_bytes(const char *s, const char **end, int *ok)
{
    char *e;
    errno = 0;
    unsigned long long v = strtoull(s, &e, 0);
    *ok = !errno && e != s;
    switch (*e) {
    case 'k':
    case 'K':
        v <<= 10;
        e++;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        e++;
        break;
    case 'g':
    case 'G':
        v <<= 30;
        e++;
        break;
    case 't':
    case 'T':
        v <<= 40;
        e++;
        break;
    default:
        break;
    }
    *end = e;
    return v;
}

static inline unsigned long long cudasim_env_ull(const char *name, unsigned long long dflt)
{
    const char *s = getenv(name), *end;
    int ok;
    if (!s || !*s)
        return dflt;
    unsigned long long v = cudasim_parse_bytes(s, &end, &ok);
    return ok && !*end ? v : dflt;
}

/* CUDASIM_TOTAL_BYTES: one size for every device, or a comma-separated list per device (the
 * last value repeats). Sizes may end in k, m, g or t. */
static inline unsigned long long cudasim_total_for(int dev)
{
    const char *s = getenv("CUDASIM_TOTAL_BYTES"), *end;
    unsigned long long v = CUDASIM_DEFAULT_TOTAL;
    if (!s || !*s)
        return v;
    for (int i = 0; i <= dev; i++) {
        int ok;
        unsigned long long x = cudasim_parse_bytes(s, &end, &ok);
        if (!ok || (*end && *end != ','))
            break;
        v = x;
        if (*end != ',')
            break;
        s = end + 1;
    }
    return v;
}

static inline unsigned cudasim_env_devices(void)
{
    unsigned long long n = cudasim_env_ull("CUDASIM_DEVICES", 1);
    if (n < 1)
        n = 1;
    if (n > CUDASIM_MAX_DEVICES)
        n = CUDASIM_MAX_DEVICES;
    return (unsigned)n;
}

static inline void cudasim_state_fill(struct cudasim_state *st)
{
    st->version = CUDASIM_STATE_VERSION;
    st->size = sizeof(*st);
    st->ndevices = cudasim_env_devices();
    for (unsigned d = 0; d < CUDASIM_MAX_DEVICES; d++)
        st->dev[d].total = d < st->ndevices ? cudasim_total_for((int)d) : 0;
}

/* Map the state named by CUDASIM_STATE (creating it), or make private state. Never NULL:
 * an unusable state file is a broken test setup, so it aborts with a message. */
static inline struct cudasim_state *cudasim_state_open(const char *who)
{
    const char *path = getenv("CUDASIM_STATE");
    struct cudasim_state *st;
    if (!path || !*path) {
        st = mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (st == MAP_FAILED)
            goto fail;
        cudasim_state_fill(st);
        st->magic = CUDASIM_STATE_MAGIC;
        return st;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        goto fail;
    while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
        ;
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        goto fail;
    int fresh = sb.st_size == 0;
    if (fresh && ftruncate(fd, sizeof(*st)) < 0)
        goto fail;
    if (!fresh && (size_t)sb.st_size != sizeof(*st)) {
        fprintf(stderr, "%s: CUDASIM_STATE %s has size %lld, expected %zu (other layout?)\n", who,
                path, (long long)sb.st_size, sizeof(*st));
        abort();
    }
    st = mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED)
        goto fail;
    if (fresh) {
        cudasim_state_fill(st);
        __atomic_store_n(&st->magic, CUDASIM_STATE_MAGIC, __ATOMIC_RELEASE);
    } else if (__atomic_load_n(&st->magic, __ATOMIC_ACQUIRE) != CUDASIM_STATE_MAGIC ||
               st->version != CUDASIM_STATE_VERSION || st->size != sizeof(*st)) {
        fprintf(stderr, "%s: CUDASIM_STATE %s is not a version %d state file\n", who, path,
                CUDASIM_STATE_VERSION);
        abort();
    }
    flock(fd, LOCK_UN);
    close(fd);
    return st;
fail:
    fprintf(stderr, "%s: cannot set up simulated device state%s%s: %s\n", who, path ? " " : "",
            path ? path : "", strerror(errno));
    abort();
}

/* CUDASIM_HOST_PROC=dir: the host's procfs mounted inside a container (-v /proc:dir:ro).
 * Processes are then named by their host pids, as the real driver names them to NVML whatever
 * pid namespace they run in, and judged alive there; every process sharing a state must see
 * the same pids (processes on the host leave it unset). Unset: /proc and getpid(). */
static inline const char *cudasim_proc_root(void)
{
    const char *p = getenv("CUDASIM_HOST_PROC");
    return p && *p ? p : "/proc";
}

/* This process's pid as the state names it (its host pid under CUDASIM_HOST_PROC). */
static inline int cudasim_pid(void)
{
    const char *root = cudasim_proc_root();
    if (strcmp(root, "/proc") == 0)
        return getpid();
    char path[512], buf[32];
    snprintf(path, sizeof(path), "%s/self", root);
    ssize_t n = readlink(path, buf, sizeof(buf) - 1);
    if (n <= 0) {
        fprintf(stderr, "cudasim: CUDASIM_HOST_PROC %s has no self link\n", root);
        abort();
    }
    buf[n] = 0;
    return atoi(buf);
}

/* Start time (clock ticks since boot) and state of a process; 0 if it does not exist. */
static inline uint64_t cudasim_proc_start(int pid, char *state_out)
{
    char path[600], buf[1024];
    snprintf(path, sizeof(path), "%s/%d/stat", cudasim_proc_root(), pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
    if (!p)
        return 0;
    p++;
    /* after ')': field 3 (state) ... field 22 (starttime) */
    char st = 0;
    unsigned long long start = 0;
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        field++;
        if (field == 3)
            st = tok[0];
        if (field == 22) {
            start = strtoull(tok, NULL, 10);
            break;
        }
    }
    if (state_out)
        *state_out = st;
    return start ? start : 1;
}

static inline int cudasim_pid_alive(int pid, uint64_t start_ticks)
{
    char st = 0;
    uint64_t s = cudasim_proc_start(pid, &st);
    if (!s || st == 'Z' || st == 'X')
        return 0;
    return s == start_ticks;
}

static inline void cudasim_atomic_max(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v &&
           !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* Give back the bytes of processes that ended; returns the bytes reclaimed. */
static inline uint64_t cudasim_reclaim_dead(struct cudasim_state *st, int dev)
{
    struct cudasim_device *d = &st->dev[dev];
    uint64_t total = 0;
    for (int i = 0; i < CUDASIM_MAX_PIDS; i++) {
        struct cudasim_pid_slot *s = &d->pids[i];
        int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        if (pid <= 0)
            continue;
        if (cudasim_pid_alive(pid, __atomic_load_n(&s->start_ticks, __ATOMIC_RELAXED)))
            continue;
        if (!__atomic_compare_exchange_n(&s->pid, &pid, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            continue;
        uint64_t u = __atomic_exchange_n(&s->used, 0, __ATOMIC_ACQ_REL);
        if (u) {
            __atomic_fetch_sub(&d->used, u, __ATOMIC_ACQ_REL);
            __atomic_fetch_add(&d->reclaimed, u, __ATOMIC_RELAXED);
        }
        total += u;
        s->hwm = 0;
        s->start_ticks = 0;
        __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
    }
    return total;
}

#endif
