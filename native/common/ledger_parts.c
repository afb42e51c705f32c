/* ledger_parts.c - a group in a shared ledger directory: the other users' parts (ledger.h,
 * "Parts").
 *
 * Each user of a group in a shared directory keeps its own part, <group>@<uid>.ledger, which
 * only its own uid writes and only its own uid's members map. A member finds the other parts in
 * the directory and reads their header with pread at each reservation: their total (what their
 * slots hold) and ext_total (the node agent's figures of their members' contexts). Nothing of
 * another uid is ever mapped: a part truncated, grown, garbled or replaced under a reader is a
 * short read or a header that does not check, counted as its last good figure and said once.
 *
 * Finding them. Every reservation looks at the directory (fstat) after its own addition: a part
 * made since the last look changed the directory's ctime, and the directory is read again
 * (getdents). The ctime is coarse (a clock tick), so a look that finds the directory changed
 * less than SETTLE_NS ago does not trust it: the next reservation reads the directory again,
 * until a look finds it settled. So of a reserver and a newcomer that both reserve, either the
 * reserver's look comes after the newcomer's part was linked and it reads it, or its addition
 * came before the newcomer read the reserver's part (the argument of ledger.c).
 *
 * Entries are published once into a fixed array and never freed while the handle lives, so a
 * reserving thread reads them without a lock; one thread at a time looks at the directory (a
 * flag holding its process's pid, which a forked child takes over), the others wait for it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ledger_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SETTLE_NS 100000000ll /* a directory changed more recently than this is read again */
#define SLOTS_AT_ONCE 16      /* slots read by one pread (precise sums, conflicts) */

struct dirent64_raw { /* what getdents64 writes (glibc before 2.30 has no wrapper) */
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static int part_fd(const struct ctl_part *pt) { return __atomic_load_n(&pt->fd, __ATOMIC_ACQUIRE); }

/* whether name is <group>@<uid>.ledger (uid decimal, at most 10 digits, < 2^32) */
static int part_name(const struct ctl_parts *p, const char *name, uint32_t *uid)
{
    if (strncmp(name, p->prefix, p->prefix_len) != 0)
        return 0;
    const char *d = name + p->prefix_len;
    uint64_t v = 0;
    int digits = 0;
    for (; *d >= '0' && *d <= '9' && digits < 11; d++, digits++)
        v = v * 10 + (uint64_t)(*d - '0');
    if (!digits || digits > 10 || v > UINT32_MAX || strcmp(d, ".ledger") != 0)
        return 0;
    *uid = (uint32_t)v;
    return 1;
}

/* read a part's head (the header up to ext_total) into h; 0 when it checks, else -1 with why */
static int read_head(const struct ct_ledger *l, const struct ctl_part *pt,
                     struct ct_ledger_header *h, char *why, size_t n)
{
    int again = 0;
    long got = ctl_pread_full(part_fd(pt), h, CT_LEDGER_PART_HEAD, 0);
    if (got < 0) {
        snprintf(why, n, "cannot be read (%s)", strerror(errno));
        return -1;
    }
    if (got != CT_LEDGER_PART_HEAD) {
        snprintf(why, n, "is cut short (%ld bytes)", got);
        return -1;
    }
    if (ctl_check_header(h, l->hdr->group, why, n, &again) != 0)
        return -1;
    uint64_t made = LD(&pt->created_ns);
    if (made && LD(&h->created_ns) != made) { /* another file on its descriptor now */
        snprintf(why, n,
                 "is read through a descriptor that names another file now (closed "
                 "under the preload library and reused)");
        return -1;
    }
    return 0;
}

static void remember(struct ctl_part *pt, const struct ct_ledger_header *h)
{
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        ST(&pt->last[d], ctl_sat_add(LD(&h->total[d]), LD(&h->ext_total[d])));
}

/* the part named name (owned by uid) into the list: its index, -1 not a part we count, -2 no
 * room. With the scanner's flag held. */
static int add_part(struct ct_ledger *l, int dirfd, const char *name, uint32_t uid)
{
    struct ctl_parts *p = l->parts;
    struct stat sb, fsb;
    if (fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_uid != uid ||
        ((uint64_t)sb.st_dev == p->self_dev && (uint64_t)sb.st_ino == p->self_ino))
        return -1; /* not a part (a link, a FIFO, a file named for another uid) or our own */
    uint32_t n = LD(&p->n);
    int reuse = -1;
    for (uint32_t i = 0; i < n; i++) {
        struct ctl_part *pt = &p->part[i];
        if (pt->dev == (uint64_t)sb.st_dev && pt->ino == (uint64_t)sb.st_ino) {
            if (fstat(part_fd(pt), &fsb) == 0 && fsb.st_ino == sb.st_ino && fsb.st_dev == sb.st_dev)
                return (int)i;
            reuse = (int)i; /* its descriptor was closed under us: opened again */
            break;
        }
        if (reuse < 0 && LD(&pt->gone))
            reuse = (int)i;
    }
    if (reuse < 0 && n >= CT_LEDGER_MAX_PARTS)
        return -2;
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, &fsb) != 0 || fsb.st_ino != sb.st_ino || fsb.st_dev != sb.st_dev) {
        close(fd);
        return -1;
    }
    /* a gone entry's descriptor stays open (a reader may be reading it now): leaked, bounded
     * by how often users replace their parts; a new entry otherwise */
    int i = reuse >= 0 ? reuse : (int)n;
    struct ctl_part *pt = &p->part[i];
    if (reuse >= 0 && pt->dev == (uint64_t)sb.st_dev && pt->ino == (uint64_t)sb.st_ino) {
        /* a part we count, on a new descriptor: it stays counted while the old one is swapped
         * (a reader then reads either, and an unreadable one counts as its last figure) */
        __atomic_store_n(&pt->fd, fd, __ATOMIC_RELEASE);
        ST(&pt->said, 0);
        return i;
    }
    ST(&pt->gone, 1);
    __atomic_store_n(&pt->fd, fd, __ATOMIC_RELEASE);
    pt->uid = uid;
    pt->dev = (uint64_t)sb.st_dev;
    pt->ino = (uint64_t)sb.st_ino;
    ST(&pt->said, 0);
    ST(&pt->created_ns, 0);
    struct ct_ledger_header h;
    char why[200];
    if (read_head(l, pt, &h, why, sizeof why) == 0) {
        remember(pt, &h);
        ST(&pt->created_ns, LD(&h.created_ns));
    } else {
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
            ST(&pt->last[d], 0);
    }
    ST(&pt->gone, 0); /* counted from now on (the scan marks those it did not see) */
    if (reuse < 0)
        ST(&p->n, n + 1);
    return i;
}

static int64_t coarse_now_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME_COARSE, &ts) != 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Read the directory: every part in it into the list, those no longer there marked gone.
 * With the scanner's flag held. 0, or -1 (errno). */
static int scan(struct ct_ledger *l)
{
    struct ctl_parts *p = l->parts;
    int dirfd = __atomic_load_n(&p->dirfd, __ATOMIC_ACQUIRE);
    struct stat dsb;
    uint8_t seen[CT_LEDGER_MAX_PARTS] = {0};
    char buf[4096] __attribute__((aligned(8)));
    int too_many = 0;
    if (fstat(dirfd, &dsb) != 0 || !S_ISDIR(dsb.st_mode))
        return -1;
    /* read through a description of its own: dirfd's offset is shared with a forked child */
    int rd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rd < 0)
        return -1;
    for (;;) {
        long got = syscall(SYS_getdents64, rd, buf, sizeof buf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            close(rd);
            errno = e;
            return -1;
        }
        if (got == 0)
            break;
        for (long off = 0; off < got;) {
            struct dirent64_raw *d = (struct dirent64_raw *)(void *)(buf + off);
            uint32_t uid;
            off += d->d_reclen;
            if (!part_name(p, d->d_name, &uid))
                continue;
            int i = add_part(l, dirfd, d->d_name, uid);
            if (i >= 0)
                seen[i] = 1;
            too_many |= i == -2;
        }
    }
    close(rd);
    uint32_t n = LD(&p->n);
    for (uint32_t i = 0; i < n; i++)
        ST(&p->part[i].gone, (uint32_t)!seen[i]);
    int64_t ct = (int64_t)dsb.st_ctim.tv_sec * 1000000000ll + dsb.st_ctim.tv_nsec;
    ST(&p->ctime_s, (int64_t)dsb.st_ctim.tv_sec);
    ST(&p->ctime_ns, (int64_t)dsb.st_ctim.tv_nsec);
    ST(&p->settled, (uint32_t)(coarse_now_ns() - ct >= SETTLE_NS));
    if (too_many) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "group %s has more than %d other users' parts in its shared ledger directory: "
                 "they cannot all be counted",
                 l->hdr->group, CT_LEDGER_MAX_PARTS);
        ctl_damaged(l, msg);
    }
    return 0;
}

/* The directory again when it was closed under us (a program that closes the descriptors it
 * did not open): the same directory reopened by its path, on a new descriptor. 0 or -1. */
static int reopen_dir(struct ct_ledger *l, const struct stat *was)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(l->path, '/');
    size_t n = slash ? (size_t)(slash - l->path) : 0;
    if (!slash || n + 1 >= sizeof dir)
        return -1;
    memcpy(dir, l->path, n ? n : 1);
    dir[n ? n : 1] = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_dev != was->st_dev || sb.st_ino != was->st_ino) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    __atomic_store_n(&l->parts->dirfd, fd, __ATOMIC_RELEASE);
    return 0;
}

/* take the flag of the thread that looks at the directory: 1 taken, 0 busy (by a thread of
 * this process; a flag left by the process we were forked from is taken over) */
static int scanner_take(struct ctl_parts *p)
{
    int32_t me = getpid(), cur = 0;
    if (CAS(&p->scanner, &cur, me))
        return 1;
    return cur != me && CAS(&p->scanner, &cur, me);
}

/* Look at the directory; read it again when it changed, or changed too recently to tell. A
 * thread that must read it again returns only after a reading that began after it looked:
 * its own, or another thread's that it waited for (one thread reads at a time). */
static void refresh(struct ct_ledger *l)
{
    struct ctl_parts *p = l->parts;
    uint64_t need = 0;
    for (unsigned waits = 0;; waits++) {
        struct stat dsb;
        int dirfd = __atomic_load_n(&p->dirfd, __ATOMIC_ACQUIRE);
        if (fstat(dirfd, &dsb) != 0 || (uint64_t)dsb.st_dev != p->dir_dev ||
            (uint64_t)dsb.st_ino != p->dir_ino) {
            struct stat was;
            was.st_dev = (dev_t)p->dir_dev;
            was.st_ino = (ino_t)p->dir_ino;
            if (waits < 4 && reopen_dir(l, &was) == 0)
                continue;
            ctl_damaged(l, "the shared ledger directory's descriptor was closed under the preload "
                           "library (the program closes descriptors it did not open?) and the "
                           "directory is not at its path any more: the other users' parts of the "
                           "group cannot be seen");
            return;
        }
        if (!need) {
            if (LD(&p->settled) && LD(&p->ctime_s) == (int64_t)dsb.st_ctim.tv_sec &&
                LD(&p->ctime_ns) == (int64_t)dsb.st_ctim.tv_nsec)
                return;
            need = LD(&p->started) + 1; /* a reading that begins from now on */
        }
        if (LD(&p->done) >= need)
            return; /* another thread's reading, begun after we looked, is done */
        if (!scanner_take(p)) {
            sched_yield();
            continue;
        }
        uint64_t mine = ADD(&p->started, 1) + 1;
        int r = scan(l);
        ST(&p->done, mine);
        ST(&p->scanner, 0);
        if (r != 0) {
            char msg[300];
            snprintf(msg, sizeof msg,
                     "the shared ledger directory of group %s cannot be read (%s): the other "
                     "users' parts cannot be counted",
                     l->hdr->group, strerror(errno));
            ctl_damaged(l, msg);
        }
        return;
    }
}

/* say once that a part cannot be read */
static void say_part(const struct ct_ledger *l, struct ctl_part *pt, const char *why, int32_t dev)
{
    uint32_t no = 0;
    if (!__atomic_compare_exchange_n(&pt->said, &no, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    char msg[600];
    snprintf(msg, sizeof msg,
             "note: uid %u's part of budget group %s %s; it counts as its last figure (%llu "
             "bytes on device %d) until it reads again",
             pt->uid, l->hdr->group, why, (unsigned long long)LD(&pt->last[dev]), (int)dev);
    ctl_report(0, msg);
}

/* What the members of a part hold on dev, judged one by one (dead ones left out), from its
 * slots read with pread; hwm from its head. */
static uint64_t precise_sum(const struct ct_ledger *l, const struct ctl_part *pt, uint32_t hwm,
                            int32_t dev, char *pids, size_t n, int *live)
{
    struct ct_ledger_member slots[SLOTS_AT_ONCE];
    uint64_t total = 0;
    size_t o = pids && n ? strlen(pids) : 0;
    int fd = part_fd(pt);
    if (hwm > CT_LEDGER_MAX_MEMBERS)
        hwm = CT_LEDGER_MAX_MEMBERS;
    for (uint32_t base = 0; base < hwm; base += SLOTS_AT_ONCE) {
        uint32_t k = hwm - base < SLOTS_AT_ONCE ? hwm - base : SLOTS_AT_ONCE;
        uint64_t off = CT_LEDGER_HEADER_SIZE + (uint64_t)base * CT_LEDGER_MEMBER_SIZE;
        if (ctl_pread_full(fd, slots, (size_t)k * CT_LEDGER_MEMBER_SIZE, off) !=
            (long)((size_t)k * CT_LEDGER_MEMBER_SIZE))
            break; /* cut short meanwhile: what was read counts */
        for (uint32_t j = 0; j < k; j++) {
            const struct ct_ledger_member *m = &slots[j];
            uint64_t w = m->state;
            if (W_STATE(w) != CT_LEDGER_ACTIVE ||
                ctl_member_alive(l->pidns, fd, (int32_t)(base + j), W_PID(w), m->start_ticks,
                                 m->pidns, m->liveness) == CT_LEDGER_DEAD)
                continue;
            if (dev >= 0)
                total = ctl_sat_add(
                    total, ctl_sat_add(m->held[dev], (uint64_t)m->ext_context_kib[dev] << 10));
            if (live)
                (*live)++;
            if (pids && o < n)
                o += (size_t)snprintf(pids + o, n - o, "%s%d (uid %u)", o ? ", " : "", W_PID(w),
                                      pt->uid);
        }
    }
    return total;
}

uint64_t ctl_parts_sum(struct ct_ledger *l, int32_t dev, int precise)
{
    struct ctl_parts *p = l->parts;
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* our addition before any look at the others */
    int saved = errno;
    refresh(l);
    uint64_t total = 0;
    uint32_t n = LD(&p->n);
    for (uint32_t i = 0; i < n; i++) {
        struct ctl_part *pt = &p->part[i];
        if (LD(&pt->gone))
            continue;
        struct ct_ledger_header h;
        char why[200];
        uint64_t v;
        if (read_head(l, pt, &h, why, sizeof why) != 0) {
            struct stat sb;
            if (fstat(part_fd(pt), &sb) != 0 || (uint64_t)sb.st_ino != pt->ino ||
                (uint64_t)sb.st_dev != pt->dev)
                ST(&p->settled,
                   0); /* its descriptor was closed under us: reopened at the next look */
            say_part(l, pt, why, dev);
            v = LD(&pt->last[dev]);
        } else {
            remember(pt, &h);
            v = ctl_sat_add(LD(&h.total[dev]), LD(&h.ext_total[dev]));
            if (precise && v) /* dead members no one of its uid reclaims do not count */
                v = precise_sum(l, pt, LD(&h.members_hwm), dev, NULL, 0, NULL);
        }
        total = ctl_sat_add(total, v);
    }
    errno = saved;
    return total;
}

int ctl_parts_conflicts(struct ct_ledger *l, const uint64_t *want, char *pids, size_t n,
                        uint64_t *other)
{
    struct ctl_parts *p = l->parts;
    int saved = errno, live = 0, first = 1;
    if (pids && n)
        pids[0] = 0;
    refresh(l);
    uint32_t k = LD(&p->n);
    for (uint32_t i = 0; i < k; i++) {
        struct ctl_part *pt = &p->part[i];
        struct ct_ledger_header h;
        char why[200];
        if (LD(&pt->gone) || read_head(l, pt, &h, why, sizeof why) != 0)
            continue; /* unreadable: that user's loss, not a budget to keep to */
        int same = 1;
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
            same &= want && LD(&h.limit[d]) == want[d];
        int before = live;
        if (!same)
            precise_sum(l, pt, LD(&h.members_hwm), -1, pids, n, &live);
        if (live > before && first && other) {
            for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
                other[d] = LD(&h.limit[d]);
            first = 0;
        }
    }
    errno = saved;
    return live;
}

int ctl_parts_count(struct ct_ledger *l)
{
    struct ctl_parts *p = l->parts;
    int saved = errno, c = 0;
    refresh(l);
    uint32_t n = LD(&p->n);
    for (uint32_t i = 0; i < n; i++)
        c += !LD(&p->part[i].gone);
    errno = saved;
    return c;
}

int ctl_parts_open(struct ct_ledger *l, int dirfd, char *err, uint64_t errlen)
{
    struct ctl_parts *p = calloc(1, sizeof *p);
    size_t g = strlen(l->hdr->group); /* (taken over: closed with the handle, or now) */
    if (!p || g + 2 > sizeof p->prefix) {
        free(p);
        close(dirfd);
        ctl_set_err(err, errlen, "out of memory");
        return -1;
    }
    p->dirfd = dirfd;
    memcpy(p->prefix, l->hdr->group, g);
    p->prefix[g] = '@';
    p->prefix_len = g + 1;
    p->self_dev = l->dev;
    p->self_ino = l->ino;
    struct stat dsb;
    if (fstat(dirfd, &dsb) == 0) {
        p->dir_dev = (uint64_t)dsb.st_dev;
        p->dir_ino = (uint64_t)dsb.st_ino;
    }
    for (int i = 0; i < CT_LEDGER_MAX_PARTS; i++)
        p->part[i].fd = -1;
    l->parts = p;
    if (scan(l) != 0) {
        ctl_set_err(err, errlen,
                    "cannot read the shared ledger directory of %s to find the other users' "
                    "parts of group %s: %s",
                    l->path, l->hdr->group, strerror(errno));
        return -1; /* the caller closes the handle, and with it this */
    }
    if (__atomic_load_n(&l->damaged, __ATOMIC_ACQUIRE)) {
        ctl_set_err(err, errlen, "%s", l->why);
        return -1;
    }
    return 0;
}

void ctl_parts_close(struct ct_ledger *l)
{
    struct ctl_parts *p = l->parts;
    if (!p)
        return;
    for (uint32_t i = 0; i < p->n; i++) {
        struct stat sb;
        int fd = p->part[i].fd;
        if (fd >= 0 && fstat(fd, &sb) == 0 && (uint64_t)sb.st_ino == p->part[i].ino &&
            (uint64_t)sb.st_dev == p->part[i].dev)
            close(fd); /* still ours (a program may have closed it and reused the number) */
    }
    struct stat dsb;
    if (p->dirfd >= 0 && fstat(p->dirfd, &dsb) == 0 && (uint64_t)dsb.st_dev == p->dir_dev &&
        (uint64_t)dsb.st_ino == p->dir_ino)
        close(p->dirfd);
    free(p);
    l->parts = NULL;
}
