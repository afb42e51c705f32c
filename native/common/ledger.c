/* ledger.c - the budget ledger: lock-free accounting of device memory shared by the processes of
 * a budget group (layout and API: ledger.h). This file: liveness, slots, the hot path, the
 * queries and snapshots; ledger_int.h lists the other files.
 *
 * Compiled into the preload library (hidden) and the tools library (used by Python through cffi),
 * so the shim and `cudatrace status` read the ledger with the same code.
 *
 * The limit guarantee. A reservation of b bytes on device d by member M:
 *     held[M][d] += b                            (seq_cst read-modify-write)
 *     s = sum over ACTIVE slots i < hwm of held[i][d]   (seq_cst loads)
 *     s <= limit ? granted : held[M][d] -= b, denied
 * Two reservers A and B each load the other's counter after their own addition; in the single
 * total order of seq_cst operations one of the additions precedes the other reserver's load, so
 * at least one of them counts both and at most one of two that together pass the limit is
 * granted (the classic store-buffer/Dekker argument; it holds for any number of reservers since
 * it holds for every pair). A slot is ACTIVE before its member's first addition, and hwm covers
 * it before it becomes ACTIVE, so a reserver that loads the other's counter also sees its slot.
 * False denials (both see each other's pending addition and both withdraw) are possible under
 * contention; reserve retries a few times before it denies.
 *
 * Across the parts of a group (one file per user in a shared directory, ledger.h "Parts") the
 * same argument holds with a part's total[d] as its counter: a reserver adds b to its part's
 * total (before its own held, so the total never reads less than the slots hold) and, after a
 * full barrier, reads the other parts' totals with pread. A part that appears after a
 * reserver last looked at the directory changed the directory's ctime; the reserver looks at
 * it (fstat) after its own addition at every reservation, and looks again while the directory
 * changed too recently for its coarse ctime to tell two changes apart (ledger_parts.c).
 *
 * Slots. state = (pid << 32) | (generation << 8) | FREE / CLAIMING / ACTIVE. join moves a slot
 * FREE -> CLAIMING (one CAS that also publishes the pid and a new generation), zeroes its
 * counters, then CLAIMING -> ACTIVE (CAS). leave and reclaim move ACTIVE -> FREE with one CAS on
 * the exact word they judged, so the generation rules out ABA. Counters of FREE slots are not
 * counted and are zeroed by the next claim, so nothing needs a third "reclaiming" state and a
 * process killed anywhere leaves nothing locked: a dead member's slot is ACTIVE with a dead pid
 * (reclaimed), a dead claimer's slot is CLAIMING with a dead pid (reclaimed too).
 *
 * Dead. A member that joined for itself holds an OFD lock on its slot's byte (ledger.h,
 * CT_LEDGER_LIVE_LOCK), which the kernel drops when the process dies, in whatever pid namespace
 * or container: a test of the lock judges it, from anywhere. Otherwise (a join on behalf of
 * another process, a file system without OFD locks) it is judged by pid: kill(pid, 0) fails
 * with ESRCH, /proc/<pid>/stat says zombie, or its start time differs from the one recorded at
 * join (the pid was reused); such a member of another pid namespace (its /proc/self/ns/pid
 * inode differs) cannot be judged and counts as alive (CT_LEDGER_UNKNOWN). What /proc says is
 * read by procstat.c.
 *
 * Atomics are the GCC/Clang __atomic builtins on the plain fixed-width fields of ledger.h (the
 * operations <stdatomic.h> is built on), since the layout is shared with cffi and cannot use
 * _Atomic types.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ledger_int.h"

#include "procstat.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(struct ct_ledger_header) == CT_LEDGER_HEADER_SIZE, "ledger header size");
_Static_assert(sizeof(struct ct_ledger_member) == CT_LEDGER_MEMBER_SIZE, "ledger member size");
_Static_assert(CT_LEDGER_FILE_SIZE ==
                   CT_LEDGER_HEADER_SIZE + CT_LEDGER_MAX_MEMBERS * CT_LEDGER_MEMBER_SIZE,
               "ledger file size");
_Static_assert(CT_LEDGER_GROUP_MAX < sizeof(((struct ct_ledger_header *)0)->group), "group size");
_Static_assert(offsetof(struct ct_ledger_member, held) % 64 == 0, "held alignment");
_Static_assert(CT_LEDGER_LOCK_BASE == CT_LEDGER_FILE_SIZE, "lock bytes past the end of the file");
_Static_assert(CT_LEDGER_LOCK_OWNER == CT_LEDGER_LOCK_BASE + CT_LEDGER_MAX_MEMBERS, "owner byte");
_Static_assert(offsetof(struct ct_ledger_header, ext_total) +
                       sizeof(uint64_t) * CT_LEDGER_MAX_DEVICES ==
                   CT_LEDGER_PART_HEAD,
               "a part's head ends with ext_total");

#define RESERVE_ATTEMPTS 3
#define RECLAIM_PERIOD_NS 1000000000ull
#define DENY_RECLAIM_PERIOD_NS 10000000ull
#define CHECK_PERIOD_NS 1000000000ull /* a member looks at its own file once a second */

/* ---- small helpers (async-signal-safe: no stdio, no malloc) -------------------------------- */

void ctl_set_err(char *err, uint64_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

uint64_t ctl_mono_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ctl_real_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ctl_sat_add(uint64_t a, uint64_t b)
{
    uint64_t s = a + b;
    return s < a ? UINT64_MAX : s;
}

/* Subtract b from *p, clamping at 0. Returns what was taken off (b unless it clamped). */
static uint64_t sub_sat(uint64_t *p, uint64_t b)
{
    uint64_t cur = LD(p), nv;
    do {
        nv = cur > b ? cur - b : 0;
    } while (!CAS(p, &cur, nv));
    return cur - nv;
}

static void store_max(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v &&
           !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

void ctl_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

uint64_t ct_ledger_proc_start_ticks(int32_t pid) { return ct_procstat_start_ticks(pid); }

/* ---- what a member's ledger says while it runs (ct_ledger_set_report) ---------------------- */

static void (*report_fn)(int32_t fatal, const char *msg);

void ct_ledger_set_report(void (*fn)(int32_t fatal, const char *msg))
{
    __atomic_store_n(&report_fn, fn, __ATOMIC_RELEASE);
}

void ctl_report(int32_t fatal, const char *msg)
{
    void (*fn)(int32_t, const char *) = __atomic_load_n(&report_fn, __ATOMIC_ACQUIRE);
    if (fn) {
        int saved = errno;
        fn(fatal, msg);
        errno = saved;
    }
}

void ctl_damaged(struct ct_ledger *l, const char *why)
{
    uint32_t was = 0;
    if (!__atomic_compare_exchange_n(&l->damaged, &was, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return; /* found already (or being written) */
    snprintf(l->why, sizeof l->why, "%s", why);
    __atomic_store_n(&l->damaged, 1, __ATOMIC_RELEASE);
}

/* an accounting call found its file damaged: say it once, answer CT_LEDGER_EDAMAGED */
__attribute__((noinline)) static int32_t damaged_now(struct ct_ledger *l)
{
    uint32_t no = 0;
    while (__atomic_load_n(&l->damaged, __ATOMIC_ACQUIRE) == 2)
        sched_yield(); /* its reason is being written */
    if (__atomic_compare_exchange_n(&l->damage_said, &no, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        ctl_report(1, l->why);
    return CT_LEDGER_EDAMAGED;
}

const char *ct_ledger_damage(const struct ct_ledger *l)
{
    if (!l)
        return "no ledger";
    return __atomic_load_n(&l->damaged, __ATOMIC_ACQUIRE) == 1 || l->reader ? l->why : "";
}

/* ---- liveness locks (ledger.h, CT_LEDGER_LIVE_LOCK) ------------------------------------------ */

/* One byte lock through our own open file description; never waits. 0 done, -1 errno set. */
static int byte_lock(int fd, short type, uint64_t off)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)off;
    fl.l_len = 1;
    int r;
    do {
        r = fcntl(fd, F_OFD_SETLK, &fl);
    } while (r != 0 && errno == EINTR);
    return r;
}

/* Whether another open file description holds a lock on [off, off+len): 1 yes, 0 no, -1 cannot
 * tell. (Our own description's locks never conflict with a test through it.) */
int ctl_range_locked(int fd, uint64_t off, uint64_t len)
{
    if (fd < 0)
        return -1;
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)off;
    fl.l_len = (off_t)len;
    int r;
    do {
        r = fcntl(fd, F_OFD_GETLK, &fl);
    } while (r != 0 && errno == EINTR);
    if (r != 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

/* fd, when it still refers to the ledger file (a program may close descriptors it did not open
 * and reuse the number), else -1. */
int ctl_our_fd(const struct ct_ledger *l)
{
    struct stat sb;
    if (l->fd < 0 || fstat(l->fd, &sb) != 0 || (uint64_t)sb.st_ino != l->ino ||
        (uint64_t)sb.st_dev != l->dev)
        return -1;
    return l->fd;
}

static int open_rw(const char *path)
{
    return open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
}

/* After fork the child shares its parent's open file description, whose locks are the
 * parent's: give the child one of its own (same file even if it was unlinked since), on the
 * same descriptor number. Also when the program closed our descriptor (its lock is gone then,
 * and another member may have judged us dead: the shim joins again, ct_budget_rejoin), and at
 * open, where the descriptor is the one the mapping was made through. */
void ctl_own_fd(struct ct_ledger *l)
{
    int32_t self = getpid();
    int cur = ctl_our_fd(l);
    if (cur >= 0 && l->fd_owner == self)
        return;
    int nfd = -1;
    if (cur >= 0) {
        char p[64];
        ct_procstat_fd_path(p, l->fd);
        nfd = open(p, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    }
    if (nfd < 0 && l->path) {
        nfd = open_rw(l->path);
        struct stat sb;
        if (nfd >= 0 && (fstat(nfd, &sb) != 0 || (uint64_t)sb.st_ino != l->ino ||
                         (uint64_t)sb.st_dev != l->dev)) {
            close(nfd); /* the path names another file now */
            nfd = -1;
        }
    }
    if (nfd < 0) {
        if (cur < 0)
            l->fd = -1; /* not ours any more: never lock or close it */
        return;         /* liveness falls back to pid and start time */
    }
    if (cur >= 0 && nfd != l->fd) {
        if (dup3(nfd, l->fd, O_CLOEXEC) >= 0) {
            close(nfd);
            nfd = l->fd;
        }
    }
    l->fd = nfd;
    l->fd_owner = self;
}

/* CT_LEDGER_ALIVE, _DEAD or _UNKNOWN (counted as alive). fd: a description of the member's file
 * (the caller's scan checked it once) */
int ctl_member_alive(uint64_t my_pidns, int fd, int32_t slot, int32_t pid, uint64_t ticks,
                     uint64_t pidns, uint64_t liveness)
{
    if (pid <= 0)
        return CT_LEDGER_DEAD;
    if (liveness == CT_LEDGER_LIVE_LOCK) {
        int r = ctl_range_locked(fd, CT_LEDGER_LOCK_BASE + (uint64_t)slot, 1);
        if (r == 1)
            return CT_LEDGER_ALIVE;
        if (r == 0)
            return CT_LEDGER_DEAD; /* the kernel dropped its lock: the process is gone */
    }
    if (pidns && my_pidns && pidns != my_pidns)
        return CT_LEDGER_UNKNOWN;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return CT_LEDGER_DEAD;
    char st = 0;
    uint64_t t = 0;
    int r = ct_procstat_read(pid, &st, &t);
    if (r == 1) {
        if (st == 'Z' || st == 'X' || st == 'x')
            return CT_LEDGER_DEAD; /* exited: its memory is gone, only the reaping is left */
        if (ticks && t && t != ticks)
            return CT_LEDGER_DEAD; /* the pid now names another process */
        return CT_LEDGER_ALIVE;
    }
    /* kill says it exists but /proc cannot tell (no /proc, or a /proc of another namespace) */
    return CT_LEDGER_UNKNOWN;
}

static int alive_in(const struct ct_ledger *l, int fd, uint32_t i, uint64_t w)
{
    const struct ct_ledger_member *m = &l->mem[i];
    return ctl_member_alive(l->pidns, fd, (int32_t)i, W_PID(w), LD(&m->start_ticks), LD(&m->pidns),
                            LD(&m->liveness));
}

int ctl_valid(const struct ct_ledger *l) { return l && l->hdr && l->mem; }

uint32_t ctl_hwm(const struct ct_ledger *l)
{
    uint32_t h = LD(&l->hdr->members_hwm);
    return h > CT_LEDGER_MAX_MEMBERS ? CT_LEDGER_MAX_MEMBERS : h;
}

static void raise_hwm(struct ct_ledger *l, uint32_t v)
{
    uint32_t cur = LD(&l->hdr->members_hwm);
    while (cur < v && !CAS(&l->hdr->members_hwm, &cur, v))
        ;
}

/* what member m counts on dev: what it holds and the node agent's figure of its context */
static inline uint64_t counted(const struct ct_ledger_member *m, int32_t dev)
{
    return ctl_sat_add(LD(&m->held[dev]), (uint64_t)LD(&m->ext_context_kib[dev]) << 10);
}

/* The group's total on dev in this file and, in *share_sum (may be NULL), the part of it held
 * by members of share (0: none). The share's sum obeys the same argument as the group's: a
 * member writes its share before its slot turns ACTIVE, so a reserver that sees its held sees
 * its share. A share is counted within one file: its members are one user's (a Slurm job). */
static uint64_t sum_shared(const struct ct_ledger *l, int32_t dev, uint64_t share,
                           uint64_t *share_sum)
{
    uint32_t n = ctl_hwm(l);
    uint64_t s = 0, ss = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct ct_ledger_member *m = &l->mem[i];
        if (W_STATE(LD(&m->state)) == CT_LEDGER_ACTIVE) {
            uint64_t h = counted(m, dev);
            s = ctl_sat_add(s, h);
            if (share && LD(&m->share) == share)
                ss = ctl_sat_add(ss, h);
        }
    }
    if (share_sum)
        *share_sum = ss;
    return s;
}

static uint64_t sum_active(const struct ct_ledger *l, int32_t dev)
{
    return sum_shared(l, dev, 0, NULL);
}

/* the group's total on dev: this file's members and, in a shared directory, the other parts */
static uint64_t sum_group(struct ct_ledger *l, int32_t dev, int precise)
{
    uint64_t s = sum_active(l, dev);
    return l->parts ? ctl_sat_add(s, ctl_parts_sum(l, dev, precise)) : s;
}

/* A slot that turned FREE gives up what it held: its counters are zeroed (the next claim would
 * too), and in a shared directory its part's total loses them (whoever zeroes a held takes what
 * it zeroed off the total, so the total never reads less than the slots hold). */
static void drop_held(struct ct_ledger *l, struct ct_ledger_member *m)
{
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        uint64_t h = XCHG(&m->held[d], 0);
        if (h && l->parts)
            sub_sat(&l->hdr->total[d], h);
    }
}

/* ---- reclaim ------------------------------------------------------------------------------- */

int ctl_reclaim_scan(struct ct_ledger *l)
{
    int saved = errno, freed = 0;
    uint32_t n = ctl_hwm(l);
    int fd = ctl_our_fd(l);
    for (uint32_t i = 0; i < n; i++) {
        if ((int32_t)i == l->slot)
            continue; /* ourselves */
        struct ct_ledger_member *m = &l->mem[i];
        uint64_t w = LD(&m->state);
        int dead = 0;
        if (W_STATE(w) == CT_LEDGER_ACTIVE) {
            dead = alive_in(l, fd, i, w) == CT_LEDGER_DEAD;
        } else if (W_STATE(w) == CT_LEDGER_CLAIMING) {
            /* a claimer that died between its two CASes (pidns/start not recorded yet) */
            uint64_t ns = LD(&m->pidns);
            if (ns && l->pidns && ns != l->pidns)
                dead = LD(&m->liveness) == CT_LEDGER_LIVE_LOCK &&
                       ctl_range_locked(fd, CT_LEDGER_LOCK_BASE + i, 1) == 0;
            else
                dead = W_PID(w) <= 0 || (kill(W_PID(w), 0) != 0 && errno == ESRCH);
        }
        if (dead && CAS(&m->state, &w, W_MAKE(0, W_GEN(w), CT_LEDGER_FREE))) {
            freed++;
            ADD(&l->hdr->reclaimed, 1);
            drop_held(l, m);
        }
    }
    errno = saved;
    return freed;
}

/* Run ctl_reclaim_scan unless one ran (from any process) less than period ns ago, as recorded
 * in *stamp. One CAS picks the one caller that scans. */
static void throttled_reclaim(struct ct_ledger *l, uint64_t *stamp, uint64_t now, uint64_t period)
{
    uint64_t last = LD(stamp);
    if (now >= last && now - last < period)
        return; /* (now < last: another time namespace or a bogus value: run it) */
    if (!CAS(stamp, &last, now))
        return; /* someone else just did */
    ctl_reclaim_scan(l);
}

/* The periodic reclaim, from every operation: at most once a second per ledger. And this
 * process's look at its own file, once a second (per process: a member whose file was damaged
 * under it stops within a second, whoever else uses it): -1 when it was found damaged. */
static int maybe_reclaim(struct ct_ledger *l)
{
    uint64_t now = ctl_mono_ns();
    uint64_t next = __atomic_load_n(&l->next_check_ns, __ATOMIC_RELAXED);
    if (now >= next &&
        __atomic_compare_exchange_n(&l->next_check_ns, &next, now + CHECK_PERIOD_NS, 0,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
        ctl_check_own(l) != 0)
        return -1; /* damaged: touch nothing more of it */
    throttled_reclaim(l, &l->hdr->last_reclaim_ns, now, RECLAIM_PERIOD_NS);
    return 0;
}

/* Before a denial: at most once per DENY_RECLAIM_PERIOD_NS, so that a crowd of reservers held
 * at the limit does not turn into a storm of kill() and /proc reads. */
static void deny_reclaim(struct ct_ledger *l)
{
    throttled_reclaim(l, &l->hdr->last_deny_reclaim_ns, ctl_mono_ns(), DENY_RECLAIM_PERIOD_NS);
}

int32_t ct_ledger_hold(struct ct_ledger *l)
{
    if (!ctl_valid(l))
        return CT_LEDGER_EINVAL;
    int saved = errno;
    ctl_own_fd(l);
    int r = l->fd >= 0 ? byte_lock(l->fd, F_RDLCK, CT_LEDGER_LOCK_OWNER) : -1;
    errno = saved;
    return r == 0 ? CT_LEDGER_OK : CT_LEDGER_ESYS;
}

int32_t ct_ledger_in_use_by_anyone(struct ct_ledger *l)
{
    if (!l || (!l->reader && !ctl_valid(l)))
        return CT_LEDGER_EINVAL;
    int saved = errno;
    int fd = l->reader ? l->fd : ctl_our_fd(l);
    int r = ctl_range_locked(fd, CT_LEDGER_LOCK_BASE, CT_LEDGER_MAX_MEMBERS + 1);
    errno = saved;
    return r < 0 ? CT_LEDGER_ESYS : r;
}

int32_t ct_ledger_reclaim(struct ct_ledger *l)
{
    if (!ctl_valid(l))
        return CT_LEDGER_EINVAL;
    ST(&l->hdr->last_reclaim_ns, ctl_mono_ns());
    return ctl_reclaim_scan(l);
}

/* ---- membership ---------------------------------------------------------------------------- */

int32_t ct_ledger_join(struct ct_ledger *l, int32_t pid, uint64_t start_ticks)
{
    if (!ctl_valid(l) || pid <= 0)
        return CT_LEDGER_EINVAL;
    int saved = errno;
    int32_t self = getpid();
    l->pidns = ct_procstat_self_pidns();
    uint64_t own_ticks = ct_ledger_proc_start_ticks(self);
    if (!start_ticks)
        start_ticks = pid == self ? own_ticks : ct_ledger_proc_start_ticks(pid);
    /* a lock proves liveness only for the process that holds it: joining for itself */
    int locking = pid == self && start_ticks == own_ticks;
    if (locking)
        ctl_own_fd(l);

    /* already a member as this pid (and still in our slot) */
    if (l->slot >= 0 && l->slot < CT_LEDGER_MAX_MEMBERS && l->pid == pid &&
        LD(&l->mem[l->slot].state) == l->word) {
        l->joined_by = self;
        errno = saved;
        return l->slot;
    }
    l->slot = -1; /* a slot inherited over fork is the parent's: never touch it */

    /* a slot of this very process is from an image before exec: its memory is gone */
    if (start_ticks) {
        uint32_t n = ctl_hwm(l);
        for (uint32_t i = 0; i < n; i++) {
            struct ct_ledger_member *m = &l->mem[i];
            uint64_t w = LD(&m->state);
            if (W_STATE(w) == CT_LEDGER_ACTIVE && W_PID(w) == pid &&
                LD(&m->start_ticks) == start_ticks && LD(&m->pidns) == l->pidns)
                if (CAS(&m->state, &w, W_MAKE(0, W_GEN(w), CT_LEDGER_FREE))) {
                    ADD(&l->hdr->reclaimed, 1);
                    drop_held(l, m);
                }
        }
    }

    for (int pass = 0; pass < 3; pass++) {
        for (int32_t i = 0; i < CT_LEDGER_MAX_MEMBERS; i++) {
            struct ct_ledger_member *m = &l->mem[i];
            uint64_t w = LD(&m->state);
            if (W_STATE(w) != CT_LEDGER_FREE)
                continue;
            uint32_t gen = W_GEN(w) + 1;
            uint64_t claim = W_MAKE(pid, gen, CT_LEDGER_CLAIMING);
            if (locking && l->fd >= 0 &&
                ctl_range_locked(l->fd, CT_LEDGER_LOCK_BASE + (uint64_t)i, 1) > 0)
                continue; /* its byte is still held (an earlier image's stray descriptor) */
            if (!CAS(&m->state, &w, claim))
                continue;
            uint64_t live = CT_LEDGER_LIVE_PID;
            if (locking && l->fd >= 0) {
                if (byte_lock(l->fd, F_WRLCK, CT_LEDGER_LOCK_BASE + (uint64_t)i) == 0) {
                    live = CT_LEDGER_LIVE_LOCK;
                } else if (errno == EAGAIN || errno == EACCES) {
                    uint64_t back = W_MAKE(0, W_GEN(claim), CT_LEDGER_FREE);
                    CAS(&m->state, &claim, back); /* someone holds its byte: another slot */
                    continue;
                }
            }
            ST(&m->liveness, live);
            ST(&m->pid, pid);
            ST(&m->start_ticks, start_ticks);
            ST(&m->pidns, l->pidns);
            ST(&m->joined_ns, ctl_real_ns());
            ST(&m->share, l->share);
            ST(&m->share_limit, l->share_limit);
            drop_held(l, m); /* what a member freed in a race with its reclaim added since */
            for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
                ST(&m->peak[d], 0);
                ST(&m->denials[d], 0);
                ST(&m->over[d], 0);
                ST(&m->context_kib[d], 0);
                ST(&m->ext_context_kib[d], 0);
            }
            raise_hwm(l, (uint32_t)i + 1);
            uint64_t active = W_MAKE(pid, gen, CT_LEDGER_ACTIVE);
            if (!CAS(&m->state, &claim, active)) {
                if (live == CT_LEDGER_LIVE_LOCK)
                    byte_lock(l->fd, F_UNLCK, CT_LEDGER_LOCK_BASE + (uint64_t)i);
                continue; /* judged dead meanwhile (another pid namespace?): take another */
            }
            l->slot = i;
            l->pid = pid;
            l->word = active;
            l->joined_by = self;
            errno = saved;
            return i;
        }
        if (pass == 0)
            ctl_reclaim_scan(l);
    }
    errno = saved;
    return CT_LEDGER_EFULL;
}

int32_t ct_ledger_leave(struct ct_ledger *l)
{
    if (!ctl_valid(l))
        return CT_LEDGER_EINVAL;
    int32_t slot = l->slot;
    if (slot < 0 || slot >= CT_LEDGER_MAX_MEMBERS)
        return CT_LEDGER_ENOTMEMBER;
    l->slot = -1;
    int saved = errno;
    int32_t self = getpid();
    errno = saved;
    if (l->joined_by != self)
        return CT_LEDGER_ENOTMEMBER; /* inherited over fork: the slot is the parent's */
    uint64_t w = l->word;
    int ok = CAS(&l->mem[slot].state, &w, W_MAKE(0, W_GEN(w), CT_LEDGER_FREE));
    if (ok)
        drop_held(l, &l->mem[slot]);
    if (l->fd_owner == self && ctl_our_fd(l) >= 0) {
        saved = errno;
        byte_lock(l->fd, F_UNLCK, CT_LEDGER_LOCK_BASE + (uint64_t)slot);
        errno = saved;
    }
    return ok ? CT_LEDGER_OK : CT_LEDGER_ENOTMEMBER; /* not ok: reclaimed already */
}

int32_t ct_ledger_slot(const struct ct_ledger *l)
{
    return ctl_valid(l) ? l->slot : CT_LEDGER_EINVAL;
}

int32_t ct_ledger_set_share(struct ct_ledger *l, const char *name, uint64_t limit)
{
    if (!ctl_valid(l))
        return CT_LEDGER_EINVAL;
    uint64_t key = 0;
    if (name && *name) {
        size_t n = strlen(name);
        if (n > 8 || name[0] == '.' || !ct_ledger_valid_group(name))
            return CT_LEDGER_EINVAL;
        for (size_t i = 0; i < n; i++) /* the name itself, little-endian: readers decode it */
            key |= (uint64_t)(unsigned char)name[i] << (8 * i);
    }
    l->share = key;
    l->share_limit = key ? limit : 0;
    int32_t slot = l->slot;
    if (slot >= 0 && slot < CT_LEDGER_MAX_MEMBERS && LD(&l->mem[slot].state) == l->word) {
        ST(&l->mem[slot].share, l->share);
        ST(&l->mem[slot].share_limit, l->share_limit);
    }
    return CT_LEDGER_OK;
}

uint64_t ct_ledger_share_in_use(struct ct_ledger *l, int32_t dev)
{
    if (!ctl_valid(l) || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES || !l->share)
        return 0;
    uint64_t ss = 0;
    sum_shared(l, dev, l->share, &ss);
    return ss;
}

/* ---- the hot path -------------------------------------------------------------------------- */

/* The member slot for dev, or NULL with *rc set. */
static struct ct_ledger_member *member(struct ct_ledger *l, int32_t dev, int32_t *rc)
{
    if (!ctl_valid(l)) {
        *rc = CT_LEDGER_EINVAL;
        return NULL;
    }
    if (dev < 0 || dev >= CT_LEDGER_MAX_DEVICES) {
        *rc = CT_LEDGER_ENODEV;
        return NULL;
    }
    int32_t slot = l->slot;
    if (slot < 0 || slot >= CT_LEDGER_MAX_MEMBERS) {
        *rc = CT_LEDGER_ENOTMEMBER;
        return NULL;
    }
    if (__atomic_load_n(&l->damaged, __ATOMIC_RELAXED)) {
        *rc = damaged_now(l); /* its file was damaged under it: nothing more is read */
        return NULL;
    }
    struct ct_ledger_member *m = &l->mem[slot];
    if (LD(&m->state) != l->word) {
        *rc = CT_LEDGER_ENOTMEMBER; /* our slot was taken from us (judged dead): join again */
        return NULL;
    }
    return m;
}

/* add bytes to what m holds on dev (and to its part's total first, in a shared directory) */
static inline uint64_t hold(struct ct_ledger *l, struct ct_ledger_member *m, int32_t dev,
                            uint64_t bytes)
{
    if (l->parts)
        ADD(&l->hdr->total[dev], bytes);
    return ctl_sat_add(ADD(&m->held[dev], bytes), bytes);
}

/* take bytes off what m holds on dev (and off its part's total: what was taken off); 1 when
 * it held less than that (clamped at 0) */
static inline int unhold(struct ct_ledger *l, struct ct_ledger_member *m, int32_t dev,
                         uint64_t bytes)
{
    uint64_t took = sub_sat(&m->held[dev], bytes);
    if (l->parts && took)
        sub_sat(&l->hdr->total[dev], took);
    return took < bytes;
}

/* one try at reserving bytes on dev: 1 granted; else 0 with the figures of the denial, -1
 * damaged */
static int reserve_once(struct ct_ledger *l, struct ct_ledger_member *m, int32_t dev,
                        uint64_t bytes, int precise, uint64_t *sum_out, uint64_t *ss_out)
{
    uint64_t share = l->share, ss = 0;
    uint64_t held = hold(l, m, dev, bytes);
    uint64_t sum = sum_shared(l, dev, share, &ss);
    if (l->parts) {
        sum = ctl_sat_add(sum, ctl_parts_sum(l, dev, precise));
        if (__atomic_load_n(&l->damaged, __ATOMIC_RELAXED)) {
            unhold(l, m, dev, bytes); /* the other parts could not all be read */
            return -1;
        }
    }
    uint64_t limit = LD(&l->hdr->limit[dev]), slimit = share ? l->share_limit : 0;
    *sum_out = sum;
    *ss_out = ss;
    if ((!limit || sum <= limit) && !(slimit && ss > slimit)) {
        store_max(&m->peak[dev], held);
        store_max(&l->hdr->peak[dev], sum);
        return 1;
    }
    unhold(l, m, dev, bytes);
    return 0;
}

int32_t ct_ledger_reserve(ct_ledger *l, int32_t dev, uint64_t bytes, uint64_t *in_use,
                          uint64_t *limit_out)
{
    int32_t rc;
    struct ct_ledger_member *m = member(l, dev, &rc);
    if (in_use)
        *in_use = 0;
    if (limit_out)
        *limit_out = 0;
    if (!m)
        return rc;
    if (bytes == 0) {
        if (in_use)
            *in_use = sum_group(l, dev, 0);
        if (limit_out)
            *limit_out = LD(&l->hdr->limit[dev]);
        return CT_LEDGER_GRANTED;
    }
    if (maybe_reclaim(l) != 0)
        return damaged_now(l);
    uint64_t limit = 0, others = 0;
    uint64_t share = l->share, slimit = share ? l->share_limit : 0;
    int by_share = 0;
    for (int attempt = 0; attempt < RESERVE_ATTEMPTS; attempt++) {
        limit = LD(&l->hdr->limit[dev]);
        uint64_t sum = 0, ss = 0;
        if ((limit && bytes > limit) || (slimit && bytes > slimit)) {
            others = sum_shared(l, dev, share, &ss);
            by_share = slimit && bytes > slimit && !(limit && bytes > limit);
            if (by_share)
                others = ss;
            else if (l->parts)
                others = ctl_sat_add(others, ctl_parts_sum(l, dev, 0));
            break; /* can never fit */
        }
        int r = reserve_once(l, m, dev, bytes, attempt > 0, &sum, &ss);
        if (r < 0)
            return damaged_now(l);
        if (r) {
            int shared = share && slimit;
            if (in_use)
                *in_use = shared ? ss : sum;
            if (limit_out)
                *limit_out = shared ? slimit : limit;
            return CT_LEDGER_GRANTED;
        }
        by_share = (!limit || sum <= limit) && slimit && ss > slimit;
        others = by_share ? ss - bytes : sum - bytes;
        if (attempt == RESERVE_ATTEMPTS - 2) {
            deny_reclaim(l); /* a dead member may be what is in the way */
        } else if (attempt < RESERVE_ATTEMPTS - 2) {
            int saved = errno;
            sched_yield(); /* let a contending reserver finish or withdraw */
            errno = saved;
        }
    }
    ADD(&m->denials[dev], 1);
    ADD(&l->hdr->denials[dev], 1);
    if (in_use)
        *in_use = others;
    if (limit_out)
        *limit_out = by_share ? slimit : limit;
    return by_share ? CT_LEDGER_DENIED_SHARE : CT_LEDGER_DENIED;
}

int32_t ct_ledger_force(ct_ledger *l, int32_t dev, uint64_t bytes)
{
    int32_t rc;
    struct ct_ledger_member *m = member(l, dev, &rc);
    if (!m)
        return rc;
    if (maybe_reclaim(l) != 0)
        return damaged_now(l);
    uint64_t held = hold(l, m, dev, bytes);
    uint64_t limit = LD(&l->hdr->limit[dev]);
    uint64_t sum = sum_group(l, dev, 0);
    store_max(&m->peak[dev], held);
    store_max(&l->hdr->peak[dev], sum);
    if (limit && sum > limit && bytes) {
        deny_reclaim(l);
        if (sum_group(l, dev, 1) > limit) {
            ADD(&m->over[dev], 1);
            ADD(&l->hdr->over[dev], 1);
            return CT_LEDGER_DENIED;
        }
    }
    return CT_LEDGER_GRANTED;
}

int32_t ct_ledger_set_context(ct_ledger *l, int32_t dev, uint64_t bytes)
{
    int32_t rc;
    struct ct_ledger_member *m = member(l, dev, &rc);
    if (!m)
        return rc;
    uint64_t kib = (bytes + 1023) >> 10;
    if (kib > UINT32_MAX)
        kib = UINT32_MAX;
    uint64_t old = (uint64_t)LD(&m->context_kib[dev]) << 10, now = kib << 10;
    if (now > old)
        ct_ledger_force(l, dev, now - old); /* the context exists already: count, never deny */
    else if (now < old)
        ct_ledger_release(l, dev, old - now);
    ST(&m->context_kib[dev], (uint32_t)kib);
    return CT_LEDGER_OK;
}

int32_t ct_ledger_release(ct_ledger *l, int32_t dev, uint64_t bytes)
{
    int32_t rc = CT_LEDGER_EINVAL;
    struct ct_ledger_member *m = member(l, dev, &rc);
    if (!m)
        return rc;
    if (bytes == 0)
        return CT_LEDGER_GRANTED;
    return unhold(l, m, dev, bytes) ? CT_LEDGER_DENIED : CT_LEDGER_GRANTED;
}

/* ---- the node agent's figures (ext_context_kib, ext_total) --------------------------------- */

/* Read (mapped: atomically; a reader's handle: pread) the word at off of the file. 0 or -1. */
static int get_word(struct ct_ledger *l, uint64_t off, void *v, size_t n)
{
    if (!l->reader) {
        const char *base = (const char *)l->hdr;
        if (n == 8)
            *(uint64_t *)v = LD((const uint64_t *)(const void *)(base + off));
        else
            *(uint32_t *)v = LD((const uint32_t *)(const void *)(base + off));
        return 0;
    }
    return ctl_pread_full(l->fd, v, n, off) == (long)n ? 0 : -1;
}

/* Write it (mapped: atomically; a reader's handle opened for writing: pwrite, never past the
 * end of a file that is not a ledger's size any more). 0 or -1. */
static int put_word(struct ct_ledger *l, uint64_t off, const void *v, size_t n)
{
    if (!l->reader) {
        char *base = (char *)l->hdr;
        if (n == 8)
            ST((uint64_t *)(void *)(base + off), *(const uint64_t *)v);
        else
            ST((uint32_t *)(void *)(base + off), *(const uint32_t *)v);
        return 0;
    }
    struct stat sb;
    if (fstat(l->fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size != CT_LEDGER_FILE_SIZE)
        return -1;
    ssize_t w;
    do {
        w = pwrite(l->fd, v, n, (off_t)off);
    } while (w < 0 && errno == EINTR);
    return w == (ssize_t)n ? 0 : -1;
}

#define MEMBER_OFF(slot, field)                                                                    \
    ((uint64_t)CT_LEDGER_HEADER_SIZE + (uint64_t)(slot)*CT_LEDGER_MEMBER_SIZE +                    \
     offsetof(struct ct_ledger_member, field))

/* ext_total[dev] of the file made again from its ACTIVE slots' ext_context_kib. 0 or -1. */
static int sum_ext(struct ct_ledger *l, int32_t dev)
{
    uint32_t hwm = 0;
    if (get_word(l, offsetof(struct ct_ledger_header, members_hwm), &hwm, 4) != 0)
        return -1;
    uint64_t total = 0;
    for (uint32_t i = 0; i < hwm && i < CT_LEDGER_MAX_MEMBERS; i++) {
        uint64_t w = 0;
        uint32_t kib = 0;
        if (get_word(l, MEMBER_OFF(i, state), &w, 8) != 0 ||
            get_word(l, MEMBER_OFF(i, ext_context_kib) + 4 * (uint64_t)dev, &kib, 4) != 0)
            return -1;
        if (W_STATE(w) == CT_LEDGER_ACTIVE)
            total += (uint64_t)kib << 10;
    }
    uint64_t off = offsetof(struct ct_ledger_header, ext_total) + 8 * (uint64_t)dev, cur = 0;
    if (get_word(l, off, &cur, 8) != 0)
        return -1;
    return cur == total ? 0 : put_word(l, off, &total, 8);
}

int32_t ct_ledger_set_member_context(ct_ledger *l, int32_t slot, int32_t pid, uint64_t start_ticks,
                                     int32_t dev, uint64_t bytes)
{
    if (!l || (!l->reader && !ctl_valid(l)) || slot < 0 || slot >= CT_LEDGER_MAX_MEMBERS)
        return CT_LEDGER_EINVAL;
    if (dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return CT_LEDGER_ENODEV;
    int saved = errno;
    int32_t rc = CT_LEDGER_ESYS;
    uint64_t word = 0, ticks = 0, after = 0;
    uint64_t kib = (bytes + 1023) >> 10, zero = 0;
    uint32_t k = kib > UINT32_MAX ? UINT32_MAX : (uint32_t)kib;
    uint64_t at = MEMBER_OFF(slot, ext_context_kib) + 4 * (uint64_t)dev;
    if (get_word(l, MEMBER_OFF(slot, state), &word, 8) != 0 ||
        get_word(l, MEMBER_OFF(slot, start_ticks), &ticks, 8) != 0)
        goto out;
    rc = CT_LEDGER_ENOTMEMBER;
    if (W_STATE(word) != CT_LEDGER_ACTIVE || W_PID(word) != pid || ticks != start_ticks)
        goto out;
    rc = CT_LEDGER_ESYS;
    if (put_word(l, at, &k, 4) != 0 || get_word(l, MEMBER_OFF(slot, state), &after, 8) != 0)
        goto out;
    if (after != word) { /* the slot changed hands meanwhile: not its new member's context */
        put_word(l, at, &zero, 4);
        rc = CT_LEDGER_ENOTMEMBER;
    } else {
        rc = CT_LEDGER_OK;
    }
    if (sum_ext(l, dev) != 0)
        rc = CT_LEDGER_ESYS;
out:
    errno = saved;
    return rc;
}

/* ---- queries ------------------------------------------------------------------------------- */

uint64_t ct_ledger_limit(struct ct_ledger *l, int32_t dev)
{
    if (!ctl_valid(l) || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return 0;
    return LD(&l->hdr->limit[dev]);
}

uint64_t ct_ledger_in_use(struct ct_ledger *l, int32_t dev)
{
    if (!ctl_valid(l) || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES ||
        __atomic_load_n(&l->damaged, __ATOMIC_RELAXED))
        return 0;
    maybe_reclaim(l);
    return sum_group(l, dev, 0);
}

uint64_t ct_ledger_held(struct ct_ledger *l, int32_t dev)
{
    int32_t rc;
    struct ct_ledger_member *m = member(l, dev, &rc);
    return m ? LD(&m->held[dev]) : 0;
}

int32_t ct_ledger_set_limit(struct ct_ledger *l, int32_t dev, uint64_t bytes)
{
    if (!ctl_valid(l))
        return CT_LEDGER_EINVAL;
    if (dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return CT_LEDGER_ENODEV;
    ST(&l->hdr->limit[dev], bytes);
    return CT_LEDGER_OK;
}

int32_t ct_ledger_on_exceed(struct ct_ledger *l)
{
    return ctl_valid(l) ? (int32_t)LD(&l->hdr->on_exceed) : CT_LEDGER_EINVAL;
}

int32_t ct_ledger_set_on_exceed(struct ct_ledger *l, int32_t mode)
{
    if (!ctl_valid(l) || (mode != CT_LEDGER_DENY && mode != CT_LEDGER_WARN))
        return CT_LEDGER_EINVAL;
    ST(&l->hdr->on_exceed, (uint32_t)mode);
    return CT_LEDGER_OK;
}

int32_t ct_ledger_flags(struct ct_ledger *l)
{
    return ctl_valid(l) ? (int32_t)LD(&l->hdr->flags) : CT_LEDGER_EINVAL;
}

int32_t ct_ledger_set_flags(ct_ledger *l, int32_t flags)
{
    if (!ctl_valid(l) || flags < 0)
        return CT_LEDGER_EINVAL;
    ST(&l->hdr->flags, (uint32_t)flags);
    return CT_LEDGER_OK;
}

/* ---- snapshots ----------------------------------------------------------------------------- */

/* one member of the view: v from slot i (its state word w), whose counts go into out */
static int fill_member(const struct ct_ledger_member *m, uint32_t i, uint64_t w, uint64_t my_pidns,
                       int fd, int32_t self_slot, struct ct_ledger_view *out)
{
    struct ct_ledger_member_view *v = &out->members[out->nmembers];
    memset(v, 0, sizeof *v);
    v->slot = (int32_t)i;
    v->pid = W_PID(w);
    v->start_ticks = LD(&m->start_ticks);
    v->joined_ns = LD(&m->joined_ns);
    v->share = LD(&m->share);
    v->share_limit = LD(&m->share_limit);
    uint64_t ns = LD(&m->pidns);
    v->other_pidns = ns && my_pidns && ns != my_pidns;
    v->pidns = ns;
    v->alive = (uint32_t)((int32_t)i == self_slot
                              ? CT_LEDGER_ALIVE
                              : ctl_member_alive(my_pidns, fd, (int32_t)i, v->pid, v->start_ticks,
                                                 ns, LD(&m->liveness)));
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        uint64_t ext = (uint64_t)LD(&m->ext_context_kib[d]) << 10;
        v->held[d] = ctl_sat_add(LD(&m->held[d]), ext);
        v->peak[d] = LD(&m->peak[d]);
        v->denials[d] = LD(&m->denials[d]);
        v->over[d] = LD(&m->over[d]);
        v->context[d] = ctl_sat_add((uint64_t)LD(&m->context_kib[d]) << 10, ext);
    }
    return LD(&m->state) == w; /* 0: left or reclaimed while we copied: drop it */
}

void ctl_fill_view(const struct ct_ledger_header *h, const struct ct_ledger_member *mem,
                   uint64_t my_pidns, int fd, int32_t self_slot, struct ct_ledger_view *out)
{
    memset(out, 0, sizeof *out);
    out->version = h->version;
    out->on_exceed = LD(&h->on_exceed);
    out->flags = LD(&h->flags);
    out->uid = h->uid;
    out->created_ns = h->created_ns;
    uint32_t hwm = LD(&h->members_hwm);
    out->members_hwm = hwm > CT_LEDGER_MAX_MEMBERS ? CT_LEDGER_MAX_MEMBERS : hwm;
    out->reclaimed = LD(&h->reclaimed);
    memcpy(out->group, h->group, sizeof out->group);
    out->group[sizeof out->group - 1] = 0;
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        out->limit[d] = LD(&h->limit[d]);
        out->peak[d] = LD(&h->peak[d]);
        out->denials[d] = LD(&h->denials[d]);
        out->over[d] = LD(&h->over[d]);
    }
    for (uint32_t i = 0; i < out->members_hwm; i++) {
        const struct ct_ledger_member *m = &mem[i];
        uint64_t w = LD(&m->state);
        if (W_STATE(w) != CT_LEDGER_ACTIVE || !fill_member(m, i, w, my_pidns, fd, self_slot, out))
            continue;
        const struct ct_ledger_member_view *v = &out->members[out->nmembers++];
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
            if (v->alive == CT_LEDGER_DEAD)
                out->dead_held[d] = ctl_sat_add(out->dead_held[d], v->held[d]);
            else
                out->in_use[d] = ctl_sat_add(out->in_use[d], v->held[d]);
        }
    }
}

/* a reader's snapshot: a copy of the file, checked, then parsed; the agent's handle (opened
 * for writing) also puts ext_total straight (its members may have gone since it was written) */
static int32_t snapshot_copy(struct ct_ledger *l, struct ct_ledger_view *out)
{
    char *buf = malloc(CT_LEDGER_FILE_SIZE);
    if (!buf) {
        snprintf(l->why, sizeof l->why, "out of memory");
        return CT_LEDGER_ESYS;
    }
    int32_t rc = CT_LEDGER_EDAMAGED;
    struct stat sb;
    char why[300];
    int again = 0;
    long got = ctl_pread_full(l->fd, buf, CT_LEDGER_FILE_SIZE, 0);
    if (fstat(l->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(l->why, sizeof l->why, "budget ledger %s is not a regular file any more", l->path);
    } else if (got != CT_LEDGER_FILE_SIZE || sb.st_size != CT_LEDGER_FILE_SIZE) {
        snprintf(l->why, sizeof l->why,
                 "budget ledger %s has %lld bytes, not %d (cut short or grown under its "
                 "members); not read",
                 l->path, (long long)sb.st_size, CT_LEDGER_FILE_SIZE);
    } else if (ctl_check_header((const struct ct_ledger_header *)(const void *)buf, NULL, why,
                                sizeof why, &again) != 0) {
        snprintf(l->why, sizeof l->why, "budget ledger %s %s; not read", l->path, why);
    } else {
        const struct ct_ledger_header *h = (const struct ct_ledger_header *)(const void *)buf;
        ctl_fill_view(h,
                      (const struct ct_ledger_member *)(const void *)(buf + CT_LEDGER_HEADER_SIZE),
                      l->pidns, l->fd, -1, out);
        out->owner = (uint32_t)sb.st_uid;
        l->why[0] = 0;
        rc = CT_LEDGER_OK;
        for (int32_t d = 0;
             d < CT_LEDGER_MAX_DEVICES && (fcntl(l->fd, F_GETFL) & O_ACCMODE) == O_RDWR; d++)
            sum_ext(l, d);
    }
    free(buf);
    return rc;
}

int32_t ct_ledger_snapshot(struct ct_ledger *l, struct ct_ledger_view *out)
{
    if (!l || !out || (!l->reader && !ctl_valid(l)))
        return CT_LEDGER_EINVAL;
    int saved = errno;
    int32_t rc = CT_LEDGER_OK;
    if (l->reader) {
        rc = snapshot_copy(l, out);
    } else {
        ctl_fill_view(l->hdr, l->mem, l->pidns, ctl_our_fd(l), l->slot, out);
        struct stat sb;
        out->owner = ctl_our_fd(l) >= 0 && fstat(l->fd, &sb) == 0 ? (uint32_t)sb.st_uid : out->uid;
    }
    errno = saved;
    return rc;
}
