/* ledger.c - the budget ledger: lock-free accounting of device memory shared by the processes of
 * a budget group (layout and API: ledger.h).
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
 * Slots. state = (pid << 32) | (generation << 8) | FREE / CLAIMING / ACTIVE. join moves a slot
 * FREE -> CLAIMING (one CAS that also publishes the pid and a new generation), zeroes its
 * counters, then CLAIMING -> ACTIVE (CAS). leave and reclaim move ACTIVE -> FREE with one CAS on
 * the exact word they judged, so the generation rules out ABA. Counters of FREE slots are not
 * counted and are zeroed by the next claim, so nothing needs a third "reclaiming" state and a
 * process killed anywhere leaves nothing locked: a dead member's slot is ACTIVE with a dead pid
 * (reclaimed), a dead claimer's slot is CLAIMING with a dead pid (reclaimed too).
 *
 * Dead: kill(pid, 0) fails with ESRCH, /proc/<pid>/stat says zombie, or its start time differs
 * from the one recorded at join (the pid was reused). Members of another pid namespace (their
 * /proc/self/ns/pid inode differs) are never judged: they are counted as alive. What /proc
 * says is read by procstat.c.
 *
 * Atomics are the GCC/Clang __atomic builtins on the plain fixed-width fields of ledger.h (the
 * operations <stdatomic.h> is built on), since the layout is shared with cffi and cannot use
 * _Atomic types.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ledger.h"

#include "procstat.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

#define LD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define CAS(p, e, d)                                                                               \
    __atomic_compare_exchange_n((p), (e), (d), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)

#define W_STATE(w) ((uint32_t)((w)&0xffu))
#define W_GEN(w) ((uint32_t)(((w) >> 8) & 0xffffffu))
#define W_PID(w) ((int32_t)(uint32_t)((w) >> 32))
#define W_MAKE(pid, gen, st)                                                                       \
    (((uint64_t)(uint32_t)(pid) << 32) | ((uint64_t)((gen)&0xffffffu) << 8) | (uint64_t)(st))

#define RESERVE_ATTEMPTS 3
#define RECLAIM_PERIOD_NS 1000000000ull
#define DENY_RECLAIM_PERIOD_NS 10000000ull
#define OPEN_WAIT_MS 1000

struct ct_ledger {
    struct ct_ledger_header *hdr;
    struct ct_ledger_member *mem;
    int32_t slot;      /* -1: not a member */
    int32_t pid;       /* the member's pid */
    int32_t joined_by; /* getpid() of the process that joined (fork check in leave) */
    uint64_t word;     /* our slot's ACTIVE state word */
    uint64_t pidns;    /* our pid namespace, 0 unknown */
    int fd;            /* our open file description of the ledger (liveness locks), -1 none */
    int32_t fd_owner;  /* getpid() of the process that opened fd (a child reopens its own) */
    uint64_t ino, dev; /* of the file, to tell that fd is still ours */
    char *path;
    uint64_t share; /* ct_ledger_set_share: written into every slot this handle joins */
    uint64_t share_limit;
};

/* ---- small helpers (async-signal-safe: no stdio, no malloc) -------------------------------- */

__attribute__((format(printf, 3, 4))) static void set_err(char *err, uint64_t errlen,
                                                          const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t real_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    uint64_t s = a + b;
    return s < a ? UINT64_MAX : s;
}

/* Subtract b from *p, clamping at 0. Returns 1 when it clamped. */
static int sub_sat(uint64_t *p, uint64_t b)
{
    uint64_t cur = LD(p), nv;
    do {
        nv = cur > b ? cur - b : 0;
    } while (!CAS(p, &cur, nv));
    return cur < b;
}

static void store_max(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (cur < v &&
           !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

uint64_t ct_ledger_proc_start_ticks(int32_t pid) { return ct_procstat_start_ticks(pid); }

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
static int range_locked(int fd, uint64_t off, uint64_t len)
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
static int our_fd(const struct ct_ledger *l)
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
static void own_fd(struct ct_ledger *l)
{
    int32_t self = getpid();
    int cur = our_fd(l);
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

/* CT_LEDGER_ALIVE, _DEAD or _UNKNOWN (counted as alive). */
/* fd: our_fd(l), checked once by the caller's scan */
static int member_alive(const struct ct_ledger *l, int fd, int32_t slot, int32_t pid,
                        uint64_t ticks, uint64_t pidns, uint64_t liveness)
{
    if (pid <= 0)
        return CT_LEDGER_DEAD;
    if (liveness == CT_LEDGER_LIVE_LOCK) {
        int r = range_locked(fd, CT_LEDGER_LOCK_BASE + (uint64_t)slot, 1);
        if (r == 1)
            return CT_LEDGER_ALIVE;
        if (r == 0)
            return CT_LEDGER_DEAD; /* the kernel dropped its lock: the process is gone */
    }
    if (pidns && l->pidns && pidns != l->pidns)
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

static int valid(const struct ct_ledger *l) { return l && l->hdr && l->mem; }

static uint32_t hwm(const struct ct_ledger *l)
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

/* The group's total on dev and, in *share_sum (may be NULL), the part of it held by members
 * of share (0: none). The share's sum obeys the same argument as the group's: a member writes
 * its share before its slot turns ACTIVE, so a reserver that sees its held sees its share. */
static uint64_t sum_shared(const struct ct_ledger *l, int32_t dev, uint64_t share,
                           uint64_t *share_sum)
{
    uint32_t n = hwm(l);
    uint64_t s = 0, ss = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct ct_ledger_member *m = &l->mem[i];
        if (W_STATE(LD(&m->state)) == CT_LEDGER_ACTIVE) {
            uint64_t h = LD(&m->held[dev]);
            s = sat_add(s, h);
            if (share && LD(&m->share) == share)
                ss = sat_add(ss, h);
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

/* ---- reclaim ------------------------------------------------------------------------------- */

static int reclaim_scan(struct ct_ledger *l)
{
    int saved = errno, freed = 0;
    uint32_t n = hwm(l);
    int fd = our_fd(l);
    for (uint32_t i = 0; i < n; i++) {
        if ((int32_t)i == l->slot)
            continue; /* ourselves */
        struct ct_ledger_member *m = &l->mem[i];
        uint64_t w = LD(&m->state);
        int dead = 0;
        if (W_STATE(w) == CT_LEDGER_ACTIVE) {
            dead = member_alive(l, fd, (int32_t)i, W_PID(w), LD(&m->start_ticks), LD(&m->pidns),
                                LD(&m->liveness)) == CT_LEDGER_DEAD;
        } else if (W_STATE(w) == CT_LEDGER_CLAIMING) {
            /* a claimer that died between its two CASes (pidns/start not recorded yet) */
            uint64_t ns = LD(&m->pidns);
            if (ns && l->pidns && ns != l->pidns)
                dead = LD(&m->liveness) == CT_LEDGER_LIVE_LOCK &&
                       range_locked(fd, CT_LEDGER_LOCK_BASE + i, 1) == 0;
            else
                dead = W_PID(w) <= 0 || (kill(W_PID(w), 0) != 0 && errno == ESRCH);
        }
        if (dead && CAS(&m->state, &w, W_MAKE(0, W_GEN(w), CT_LEDGER_FREE))) {
            freed++;
            ADD(&l->hdr->reclaimed, 1);
        }
    }
    errno = saved;
    return freed;
}

/* Run reclaim_scan unless one ran (from any process) less than period ns ago, as recorded in
 * *stamp. One CAS picks the one caller that scans. */
static void throttled_reclaim(struct ct_ledger *l, uint64_t *stamp, uint64_t period)
{
    uint64_t now = mono_ns();
    uint64_t last = LD(stamp);
    if (now >= last && now - last < period)
        return; /* (now < last: another time namespace or a bogus value: run it) */
    if (!CAS(stamp, &last, now))
        return; /* someone else just did */
    reclaim_scan(l);
}

/* The periodic reclaim, from every operation: at most once a second per ledger. */
static void maybe_reclaim(struct ct_ledger *l)
{
    throttled_reclaim(l, &l->hdr->last_reclaim_ns, RECLAIM_PERIOD_NS);
}

/* Before a denial: at most once per DENY_RECLAIM_PERIOD_NS, so that a crowd of reservers held
 * at the limit does not turn into a storm of kill() and /proc reads. */
static void deny_reclaim(struct ct_ledger *l)
{
    throttled_reclaim(l, &l->hdr->last_deny_reclaim_ns, DENY_RECLAIM_PERIOD_NS);
}

int32_t ct_ledger_hold(struct ct_ledger *l)
{
    if (!valid(l))
        return CT_LEDGER_EINVAL;
    int saved = errno;
    own_fd(l);
    int r = l->fd >= 0 ? byte_lock(l->fd, F_RDLCK, CT_LEDGER_LOCK_OWNER) : -1;
    errno = saved;
    return r == 0 ? CT_LEDGER_OK : CT_LEDGER_ESYS;
}

int32_t ct_ledger_in_use_by_anyone(struct ct_ledger *l)
{
    if (!valid(l))
        return CT_LEDGER_EINVAL;
    int saved = errno;
    int r = range_locked(our_fd(l), CT_LEDGER_LOCK_BASE, CT_LEDGER_MAX_MEMBERS + 1);
    errno = saved;
    return r < 0 ? CT_LEDGER_ESYS : r;
}

int32_t ct_ledger_reclaim(struct ct_ledger *l)
{
    if (!valid(l))
        return CT_LEDGER_EINVAL;
    ST(&l->hdr->last_reclaim_ns, mono_ns());
    return reclaim_scan(l);
}

/* ---- membership ---------------------------------------------------------------------------- */

int32_t ct_ledger_join(struct ct_ledger *l, int32_t pid, uint64_t start_ticks)
{
    if (!valid(l) || pid <= 0)
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
        own_fd(l);

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
        uint32_t n = hwm(l);
        for (uint32_t i = 0; i < n; i++) {
            struct ct_ledger_member *m = &l->mem[i];
            uint64_t w = LD(&m->state);
            if (W_STATE(w) == CT_LEDGER_ACTIVE && W_PID(w) == pid &&
                LD(&m->start_ticks) == start_ticks && LD(&m->pidns) == l->pidns)
                if (CAS(&m->state, &w, W_MAKE(0, W_GEN(w), CT_LEDGER_FREE)))
                    ADD(&l->hdr->reclaimed, 1);
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
                range_locked(l->fd, CT_LEDGER_LOCK_BASE + (uint64_t)i, 1) > 0)
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
            ST(&m->joined_ns, real_ns());
            ST(&m->share, l->share);
            ST(&m->share_limit, l->share_limit);
            for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
                ST(&m->held[d], 0);
                ST(&m->peak[d], 0);
                ST(&m->denials[d], 0);
                ST(&m->over[d], 0);
                ST(&m->context_kib[d], 0);
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
            reclaim_scan(l);
    }
    errno = saved;
    return CT_LEDGER_EFULL;
}

int32_t ct_ledger_leave(struct ct_ledger *l)
{
    if (!valid(l))
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
    if (l->fd_owner == self && our_fd(l) >= 0) {
        saved = errno;
        byte_lock(l->fd, F_UNLCK, CT_LEDGER_LOCK_BASE + (uint64_t)slot);
        errno = saved;
    }
    return ok ? CT_LEDGER_OK : CT_LEDGER_ENOTMEMBER; /* not ok: reclaimed already */
}

int32_t ct_ledger_slot(const struct ct_ledger *l) { return valid(l) ? l->slot : CT_LEDGER_EINVAL; }

int32_t ct_ledger_set_share(struct ct_ledger *l, const char *name, uint64_t limit)
{
    if (!valid(l))
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
    if (!valid(l) || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES || !l->share)
        return 0;
    uint64_t ss = 0;
    sum_shared(l, dev, l->share, &ss);
    return ss;
}

/* ---- the hot path -------------------------------------------------------------------------- */

/* The member slot for dev, or NULL with *rc set. */
static struct ct_ledger_member *member(struct ct_ledger *l, int32_t dev, int32_t *rc)
{
    if (!valid(l)) {
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
    struct ct_ledger_member *m = &l->mem[slot];
    if (LD(&m->state) != l->word) {
        *rc = CT_LEDGER_ENOTMEMBER; /* our slot was taken from us (judged dead): join again */
        return NULL;
    }
    return m;
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
            *in_use = sum_active(l, dev);
        if (limit_out)
            *limit_out = LD(&l->hdr->limit[dev]);
        return CT_LEDGER_GRANTED;
    }
    maybe_reclaim(l);
    uint64_t limit = 0, others = 0;
    uint64_t share = l->share, slimit = share ? l->share_limit : 0;
    int by_share = 0;
    for (int attempt = 0; attempt < RESERVE_ATTEMPTS; attempt++) {
        limit = LD(&l->hdr->limit[dev]);
        if ((limit && bytes > limit) || (slimit && bytes > slimit)) {
            uint64_t ss = 0;
            others = sum_shared(l, dev, share, &ss);
            by_share = slimit && bytes > slimit && !(limit && bytes > limit);
            if (by_share)
                others = ss;
            break; /* can never fit */
        }
        uint64_t held = sat_add(ADD(&m->held[dev], bytes), bytes);
        uint64_t ss = 0;
        uint64_t sum = sum_shared(l, dev, share, &ss);
        int group_ok = !limit || sum <= limit;
        by_share = group_ok && slimit && ss > slimit;
        if (group_ok && !by_share) {
            store_max(&m->peak[dev], held);
            store_max(&l->hdr->peak[dev], sum);
            if (in_use)
                *in_use = share && slimit ? ss : sum;
            if (limit_out)
                *limit_out = share && slimit ? slimit : limit;
            return CT_LEDGER_GRANTED;
        }
        sub_sat(&m->held[dev], bytes);
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
    maybe_reclaim(l);
    uint64_t held = sat_add(ADD(&m->held[dev], bytes), bytes);
    uint64_t limit = LD(&l->hdr->limit[dev]);
    uint64_t sum = sum_active(l, dev);
    store_max(&m->peak[dev], held);
    store_max(&l->hdr->peak[dev], sum);
    if (limit && sum > limit && bytes) {
        deny_reclaim(l);
        if (sum_active(l, dev) > limit) {
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

int32_t ct_ledger_set_member_context(ct_ledger *l, int32_t slot, int32_t pid, uint64_t start_ticks,
                                     int32_t dev, uint64_t bytes)
{
    if (!valid(l) || slot < 0 || slot >= CT_LEDGER_MAX_MEMBERS)
        return CT_LEDGER_EINVAL;
    struct ct_ledger_member *m = &l->mem[slot];
    uint64_t word = LD(&m->state);
    if ((word & 0xff) != CT_LEDGER_ACTIVE || (int32_t)(word >> 32) != pid ||
        LD(&m->start_ticks) != start_ticks)
        return CT_LEDGER_ENOTMEMBER;
    struct ct_ledger as = *l; /* that member, seen through this handle's mapping */
    as.slot = slot;
    as.word = word;
    as.share = 0; /* a context is forced, never checked against a share */
    return ct_ledger_set_context(&as, dev, bytes);
}

int32_t ct_ledger_release(ct_ledger *l, int32_t dev, uint64_t bytes)
{
    int32_t rc;
    struct ct_ledger_member *m = member(l, dev, &rc);
    if (!m)
        return rc;
    if (bytes == 0)
        return CT_LEDGER_GRANTED;
    return sub_sat(&m->held[dev], bytes) ? CT_LEDGER_DENIED : CT_LEDGER_GRANTED;
}

/* ---- queries ------------------------------------------------------------------------------- */

uint64_t ct_ledger_limit(struct ct_ledger *l, int32_t dev)
{
    if (!valid(l) || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return 0;
    return LD(&l->hdr->limit[dev]);
}

uint64_t ct_ledger_in_use(struct ct_ledger *l, int32_t dev)
{
    if (!valid(l) || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return 0;
    maybe_reclaim(l);
    return sum_active(l, dev);
}

uint64_t ct_ledger_held(struct ct_ledger *l, int32_t dev)
{
    int32_t rc;
    struct ct_ledger_member *m = member(l, dev, &rc);
    return m ? LD(&m->held[dev]) : 0;
}

int32_t ct_ledger_set_limit(struct ct_ledger *l, int32_t dev, uint64_t bytes)
{
    if (!valid(l))
        return CT_LEDGER_EINVAL;
    if (dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return CT_LEDGER_ENODEV;
    ST(&l->hdr->limit[dev], bytes);
    return CT_LEDGER_OK;
}

int32_t ct_ledger_on_exceed(struct ct_ledger *l)
{
    return valid(l) ? (int32_t)LD(&l->hdr->on_exceed) : CT_LEDGER_EINVAL;
}

int32_t ct_ledger_set_on_exceed(struct ct_ledger *l, int32_t mode)
{
    if (!valid(l) || (mode != CT_LEDGER_DENY && mode != CT_LEDGER_WARN))
        return CT_LEDGER_EINVAL;
    ST(&l->hdr->on_exceed, (uint32_t)mode);
    return CT_LEDGER_OK;
}

int32_t ct_ledger_flags(struct ct_ledger *l)
{
    return valid(l) ? (int32_t)LD(&l->hdr->flags) : CT_LEDGER_EINVAL;
}

int32_t ct_ledger_set_flags(ct_ledger *l, int32_t flags)
{
    if (!valid(l) || flags < 0)
        return CT_LEDGER_EINVAL;
    ST(&l->hdr->flags, (uint32_t)flags);
    return CT_LEDGER_OK;
}

int32_t ct_ledger_snapshot(struct ct_ledger *l, struct ct_ledger_view *out)
{
    if (!valid(l) || !out)
        return CT_LEDGER_EINVAL;
    int saved = errno;
    struct ct_ledger_header *h = l->hdr;
    memset(out, 0, sizeof *out);
    out->version = h->version;
    out->on_exceed = LD(&h->on_exceed);
    out->flags = LD(&h->flags);
    out->uid = h->uid;
    out->created_ns = h->created_ns;
    out->members_hwm = hwm(l);
    out->reclaimed = LD(&h->reclaimed);
    memcpy(out->group, h->group, sizeof out->group);
    out->group[sizeof out->group - 1] = 0;
    int fd = our_fd(l);
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        out->limit[d] = LD(&h->limit[d]);
        out->peak[d] = LD(&h->peak[d]);
        out->denials[d] = LD(&h->denials[d]);
        out->over[d] = LD(&h->over[d]);
    }
    for (uint32_t i = 0; i < out->members_hwm; i++) {
        struct ct_ledger_member *m = &l->mem[i];
        uint64_t w = LD(&m->state);
        if (W_STATE(w) != CT_LEDGER_ACTIVE)
            continue;
        struct ct_ledger_member_view *v = &out->members[out->nmembers];
        v->slot = (int32_t)i;
        v->pid = W_PID(w);
        v->start_ticks = LD(&m->start_ticks);
        v->joined_ns = LD(&m->joined_ns);
        v->share = LD(&m->share);
        v->share_limit = LD(&m->share_limit);
        uint64_t ns = LD(&m->pidns);
        v->other_pidns = ns && l->pidns && ns != l->pidns;
        v->pidns = ns;
        v->alive =
            (uint32_t)((int32_t)i == l->slot ? CT_LEDGER_ALIVE
                                             : member_alive(l, fd, (int32_t)i, v->pid,
                                                            v->start_ticks, ns, LD(&m->liveness)));
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
            v->held[d] = LD(&m->held[d]);
            v->peak[d] = LD(&m->peak[d]);
            v->denials[d] = LD(&m->denials[d]);
            v->over[d] = LD(&m->over[d]);
            v->context[d] = (uint64_t)LD(&m->context_kib[d]) << 10;
            if (v->alive == CT_LEDGER_DEAD)
                out->dead_held[d] = sat_add(out->dead_held[d], v->held[d]);
            else
                out->in_use[d] = sat_add(out->in_use[d], v->held[d]);
        }
        if (LD(&m->state) != w)
            continue; /* left or reclaimed while we copied: drop it */
        out->nmembers++;
    }
    errno = saved;
    return CT_LEDGER_OK;
}

/* ---- shared ledger directories ------------------------------------------------------------ */
/* A directory an integration manages for the jobs of several users (Slurm: one ledger per GPU
 * for every job on it): sticky, so no user can remove or replace another's files, owned by root
 * (or by the caller), group or other writable. Its ledgers are mode 0666 (0660 when others
 * cannot write the directory) and may be owned by any user. The mode of a shared ledger file:
 * 0 when dir_sb does not describe a shared directory. */
static unsigned shared_mode(const struct stat *dsb)
{
    if (!S_ISDIR(dsb->st_mode) || !(dsb->st_mode & S_ISVTX) || !(dsb->st_mode & 022))
        return 0;
    if (dsb->st_uid != 0 && dsb->st_uid != geteuid())
        return 0;
    return (dsb->st_mode & 002) ? 0666 : 0660;
}

/* The shared mode of the directory holding path (0: not shared). */
static unsigned path_shared_mode(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = path ? strrchr(path, '/') : NULL;
    if (!slash) {
        dir[0] = '.';
        dir[1] = 0;
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof dir)
            return 0;
        memcpy(dir, path, n ? n : 1);
        dir[n ? n : 1] = 0;
    }
    struct stat sb;
    if (lstat(dir, &sb) != 0)
        return 0;
    return shared_mode(&sb);
}

int32_t ct_ledger_shared_dir(const char *path)
{
    int saved = errno;
    int32_t r = path_shared_mode(path) != 0;
    errno = saved;
    return r;
}

/* ---- opening ------------------------------------------------------------------------------- */

static void init_header(struct ct_ledger_header *h, const struct ct_ledger_config *cfg,
                        const char *path)
{
    memset(h, 0, sizeof *h);
    h->version = CT_LEDGER_VERSION;
    h->header_size = CT_LEDGER_HEADER_SIZE;
    h->member_size = CT_LEDGER_MEMBER_SIZE;
    h->max_devices = CT_LEDGER_MAX_DEVICES;
    h->max_members = CT_LEDGER_MAX_MEMBERS;
    h->uid = (uint32_t)geteuid();
    h->created_ns = real_ns();
    if (cfg) {
        h->on_exceed = cfg->on_exceed == CT_LEDGER_WARN ? CT_LEDGER_WARN : CT_LEDGER_DENY;
        h->flags = cfg->flags;
        memcpy(h->limit, cfg->limit, sizeof h->limit);
        memcpy(h->group, cfg->group, sizeof h->group);
        h->group[sizeof h->group - 1] = 0;
    }
    if (!h->group[0] && path) { /* <dir>/<group>.ledger */
        const char *b = strrchr(path, '/');
        b = b ? b + 1 : path;
        size_t n = strlen(b);
        if (n > 7 && strcmp(b + n - 7, ".ledger") == 0)
            n -= 7;
        if (n > CT_LEDGER_GROUP_MAX)
            n = CT_LEDGER_GROUP_MAX;
        memcpy(h->group, b, n);
        h->group[n] = 0;
    }
}

/* Size, initialize and publish a new ledger through fd. */
static int init_file(int fd, const struct ct_ledger_config *cfg, const char *path, char *err,
                     uint64_t errlen)
{
    unsigned mode = path_shared_mode(path);
    if (fchmod(fd, mode ? mode : 0600) != 0 || ftruncate(fd, CT_LEDGER_FILE_SIZE) != 0) {
        set_err(err, errlen, "cannot size budget ledger %s: %s", path, strerror(errno));
        return -1;
    }
    void *p = mmap(NULL, CT_LEDGER_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        set_err(err, errlen, "cannot map budget ledger %s: %s", path, strerror(errno));
        return -1;
    }
    struct ct_ledger_header *h = p;
    init_header(h, cfg, path);
    __atomic_store_n(&h->magic, (uint64_t)CT_LEDGER_MAGIC, __ATOMIC_SEQ_CST); /* publish last */
    munmap(p, CT_LEDGER_FILE_SIZE);
    return 0;
}

/* Create path fully initialized: build it under a temporary name and link() it into place, so
 * no one ever sees a half-made ledger; where hard links are not supported, create it in place
 * (O_EXCL) and publish the magic last. Returns 1 created, 0 someone else did, -1 error. */
static int create_file(const char *path, const struct ct_ledger_config *cfg, char *err,
                       uint64_t errlen)
{
    char tmp[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
    int n = snprintf(tmp, sizeof tmp, "%.*s.%s.%d.%llx.tmp", (int)dlen, path,
                     slash ? slash + 1 : path, (int)getpid(), (unsigned long long)mono_ns());
    if (n > 0 && (size_t)n < sizeof tmp) {
        int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            int ok = init_file(fd, cfg, path, err, errlen);
            close(fd);
            if (ok != 0) {
                unlink(tmp);
                return -1;
            }
            int r = link(tmp, path);
            int e = errno;
            unlink(tmp);
            if (r == 0)
                return 1;
            if (e == EEXIST)
                return 0;
            if (e != EPERM && e != EOPNOTSUPP && e != ENOSYS && e != EMLINK && e != EXDEV) {
                set_err(err, errlen, "cannot create budget ledger %s: %s", path, strerror(e));
                return -1;
            }
        } else if (errno != EEXIST && errno != ENAMETOOLONG) {
            set_err(err, errlen, "cannot create budget ledger %s: %s", path, strerror(errno));
            return -1;
        }
    }
    /* fallback: in place */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return 0;
        set_err(err, errlen, "cannot create budget ledger %s: %s", path, strerror(errno));
        return -1;
    }
    int ok = init_file(fd, cfg, path, err, errlen);
    close(fd);
    if (ok != 0) {
        unlink(path);
        return -1;
    }
    return 1;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Open and check an existing ledger. Returns the mapping, NULL with err set (*again = 1: it is
 * being created, try again shortly). */
static void *map_fd(int fd, const char *path, int check_owner, int *again, char *err,
                    uint64_t errlen);

static void *map_existing(const char *path, int *again, int *fd_out, char *err, uint64_t errlen)
{
    *again = 0;
    *fd_out = -1;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            set_err(err, errlen, "budget ledger %s is a symbolic link; refusing to use it", path);
        else
            set_err(err, errlen, "cannot open budget ledger %s: %s", path, strerror(e));
        errno = e;
        return NULL;
    }
    void *p = map_fd(fd, path, 1, again, err, errlen);
    if (p)
        *fd_out = fd; /* kept open: the liveness locks live on it */
    return p;
}

/* Check and map the ledger open on fd (closed on failure). check_owner: the file's owner and
 * mode must be the caller's (or a shared ledger directory's); 0 for a description the caller
 * took from a member's own mapping (ct_ledger_open_fd). */
static void *map_fd(int fd, const char *path, int check_owner, int *again, char *err,
                    uint64_t errlen)
{
    *again = 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        set_err(err, errlen, "cannot stat budget ledger %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    uid_t me = geteuid();
    const char *why = NULL;
    char whybuf[PATH_MAX + 200];
    unsigned shared = check_owner ? path_shared_mode(path) : 0;
    if (!S_ISREG(sb.st_mode)) {
        why = "is not a regular file";
    } else if (!check_owner) {
        /* a member's own mapping: what it uses is the ledger, whoever owns it */
    } else if (shared && (sb.st_mode & 07777) != shared) {
        snprintf(whybuf, sizeof whybuf,
                 "is in a shared ledger directory with mode %04o, not %04o (owner uid %u)",
                 (unsigned)(sb.st_mode & 07777), shared, (unsigned)sb.st_uid);
        why = whybuf;
    } else if (shared) {
        /* any owner: the sticky directory keeps it in place, its mode lets every job use it */
    } else if (sb.st_uid != me) {
        snprintf(whybuf, sizeof whybuf, "is owned by uid %u, not by you (uid %u)",
                 (unsigned)sb.st_uid, (unsigned)me);
        why = whybuf;
    } else if (sb.st_mode & 077) {
        snprintf(whybuf, sizeof whybuf, "has group/other permissions (mode %04o; it must be 0600)",
                 (unsigned)(sb.st_mode & 07777));
        why = whybuf;
    }
    if (why) {
        /* said below */
    } else if (sb.st_size == 0) {
        *again = 1; /* created in place a moment ago, not sized yet */
        why = "is empty (its creator may have died while making it)";
    } else if (sb.st_size != CT_LEDGER_FILE_SIZE) {
        snprintf(whybuf, sizeof whybuf,
                 "has %lld bytes, not %d: not a ledger of this cudatrace version",
                 (long long)sb.st_size, CT_LEDGER_FILE_SIZE);
        why = whybuf;
    }
    if (why) {
        set_err(err, errlen, "budget ledger %s %s; refusing to use it", path, why);
        close(fd);
        errno = EACCES;
        return NULL;
    }
    void *p = mmap(NULL, CT_LEDGER_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    if (p == MAP_FAILED) {
        close(fd);
        set_err(err, errlen, "cannot map budget ledger %s: %s", path, strerror(e));
        return NULL;
    }
    struct ct_ledger_header *h = p;
    uint64_t magic = LD(&h->magic);
    if (magic == 0) {
        *again = 1;
        why = "is not initialized (its creator may have died while making it)";
    } else if (magic != (uint64_t)CT_LEDGER_MAGIC) {
        why = "is not a cudatrace budget ledger (bad magic)";
    } else if (h->version != CT_LEDGER_VERSION) {
        snprintf(whybuf, sizeof whybuf, "has version %u; this cudatrace uses version %d",
                 h->version, CT_LEDGER_VERSION);
        why = whybuf;
    } else if (h->header_size != CT_LEDGER_HEADER_SIZE || h->member_size != CT_LEDGER_MEMBER_SIZE ||
               h->max_devices != CT_LEDGER_MAX_DEVICES || h->max_members != CT_LEDGER_MAX_MEMBERS) {
        why = "has an incompatible layout";
    } else if ((LD(&h->on_exceed) != CT_LEDGER_DENY && LD(&h->on_exceed) != CT_LEDGER_WARN) ||
               (LD(&h->flags) & ~(uint32_t)CT_LEDGER_F_COUNT_HOST) ||
               LD(&h->members_hwm) > CT_LEDGER_MAX_MEMBERS ||
               memchr(h->group, 0, sizeof h->group) == NULL) {
        /* checked before anything is written: a damaged file is never half-updated */
        snprintf(whybuf, sizeof whybuf,
                 "is damaged (on_exceed %u, flags 0x%x, members %u); delete it (rm %s) once no "
                 "run uses it, and start again",
                 (unsigned)LD(&h->on_exceed), (unsigned)LD(&h->flags),
                 (unsigned)LD(&h->members_hwm), path);
        why = whybuf;
    }
    if (why) {
        set_err(err, errlen, "budget ledger %s %s; refusing to use it", path, why);
        munmap(p, CT_LEDGER_FILE_SIZE);
        close(fd);
        errno = EINVAL;
        return NULL;
    }
    return p;
}

static ct_ledger *make_handle(void *p, int fd, const char *path, char *err, uint64_t errlen);

static ct_ledger *open_ledger(const char *path, int32_t create, const struct ct_ledger_config *cfg,
                              int32_t *created, char *err, uint64_t errlen)
{
    if (created)
        *created = 0;
    if (err && errlen)
        err[0] = 0;
    if (!path || !*path || strlen(path) >= PATH_MAX) {
        set_err(err, errlen, "no budget ledger path");
        return NULL;
    }
    int saved = errno;
    void *p = NULL;
    int fd = -1;
    for (int waited = 0, tries = 0; tries < OPEN_WAIT_MS + 16; tries++) {
        int again = 0;
        p = map_existing(path, &again, &fd, err, errlen);
        if (p)
            break;
        if (errno == ENOENT && create) {
            int r = create_file(path, cfg, err, errlen);
            if (r < 0)
                break;
            if (r == 1 && created)
                *created = 1;
            continue; /* open what is there now */
        }
        if (!again || waited >= OPEN_WAIT_MS)
            break;
        sleep_ms(1);
        waited++;
    }
    if (!p) {
        errno = saved;
        return NULL;
    }
    struct ct_ledger *l = make_handle(p, fd, path, err, errlen);
    errno = saved;
    return l;
}

/* The handle on a mapping p made through fd (both given back on failure). */
static ct_ledger *make_handle(void *p, int fd, const char *path, char *err, uint64_t errlen)
{
    struct ct_ledger *l = calloc(1, sizeof *l);
    char *pathcopy = strdup(path);
    if (!l || !pathcopy) {
        free(l);
        free(pathcopy);
        munmap(p, CT_LEDGER_FILE_SIZE);
        close(fd);
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    struct stat sb;
    l->fd = fd;
    l->fd_owner = -1;
    if (fstat(fd, &sb) == 0) {
        l->ino = (uint64_t)sb.st_ino;
        l->dev = (uint64_t)sb.st_dev;
    }
    l->path = pathcopy;
    /* The mapping holds a reference to the description it was made through, and a forked
     * child inherits the mapping: locks on that description would live as long as any child.
     * So the locks go on a description of their own (own_fd reopens the file, on this number). */
    own_fd(l);
    l->hdr = p;
    l->mem = (struct ct_ledger_member *)((char *)p + CT_LEDGER_HEADER_SIZE);
    l->slot = -1;
    l->pidns = ct_procstat_self_pidns();
    return l;
}

ct_ledger *ct_ledger_open(const char *path, int32_t create, char *err, uint64_t errlen)
{
    return open_ledger(path, create, NULL, NULL, err, errlen);
}

ct_ledger *ct_ledger_open_fd(int32_t fd, const char *name, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (fd < 0 || !name || !*name || strlen(name) >= PATH_MAX) {
        set_err(err, errlen, "no budget ledger descriptor");
        return NULL;
    }
    int saved = errno;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (own < 0) {
        set_err(err, errlen, "cannot use budget ledger %s: %s", name, strerror(errno));
        errno = saved;
        return NULL;
    }
    int again = 0;
    void *p = map_fd(own, name, 0, &again, err, errlen);
    struct ct_ledger *l = p ? make_handle(p, own, name, err, errlen) : NULL;
    errno = saved;
    return l;
}

ct_ledger *ct_ledger_create(const char *path, const struct ct_ledger_config *cfg, int32_t *created,
                            char *err, uint64_t errlen)
{
    return open_ledger(path, 1, cfg, created, err, errlen);
}

void ct_ledger_close(struct ct_ledger *l)
{
    if (!l)
        return;
    int saved = errno;
    if (l->hdr)
        munmap(l->hdr, CT_LEDGER_FILE_SIZE);
    if (our_fd(l) >= 0)
        close(l->fd); /* drops our locks (a forked child's copy drops nothing of its parent's) */
    l->hdr = NULL;
    l->mem = NULL;
    free(l->path);
    free(l);
    errno = saved;
}

/* ---- where group ledgers live -------------------------------------------------------------- */

int32_t ct_ledger_valid_group(const char *g)
{
    /* not starting with '.' (such a ledger would be hidden from `cudatrace status`) nor with
     * '-' (it would read as an option on a command line) */
    if (!g || g[0] == '.' || g[0] == '-')
        return 0;
    size_t n = 0;
    for (; g[n]; n++) {
        char c = g[n];
        if (n >= CT_LEDGER_GROUP_MAX)
            return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return n > 0;
}

/* Check (and with create make) one candidate directory. 0 ok, CT_LEDGER_ENOENT missing (or not
 * creatable: *soft = 1, try the next), other < 0: refuse. */
static int32_t check_dir(const char *dir, int32_t create, int shared_ok, int *soft, char *err,
                         uint64_t errlen)
{
    struct stat sb;
    *soft = 0;
    if (lstat(dir, &sb) != 0) {
        if (errno != ENOENT) {
            set_err(err, errlen, "cannot use ledger directory %s: %s", dir, strerror(errno));
            *soft = 1;
            return CT_LEDGER_ESYS;
        }
        if (!create) {
            set_err(err, errlen, "ledger directory %s does not exist", dir);
            return CT_LEDGER_ENOENT;
        }
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            set_err(err, errlen, "cannot create ledger directory %s: %s", dir, strerror(errno));
            *soft = 1;
            return CT_LEDGER_ESYS;
        }
        if (lstat(dir, &sb) != 0) {
            set_err(err, errlen, "cannot use ledger directory %s: %s", dir, strerror(errno));
            return CT_LEDGER_ESYS;
        }
    }
    uid_t me = geteuid();
    if (S_ISLNK(sb.st_mode)) {
        set_err(err, errlen, "ledger directory %s is a symbolic link; refusing to use it", dir);
        return CT_LEDGER_EACCESS;
    }
    if (!S_ISDIR(sb.st_mode)) {
        set_err(err, errlen, "ledger directory %s is not a directory; refusing to use it", dir);
        return CT_LEDGER_EACCESS;
    }
    if (shared_ok && shared_mode(&sb))
        return CT_LEDGER_OK; /* a shared ledger directory (root's or ours, sticky) */
    if (sb.st_uid != me) {
        set_err(err, errlen,
                "ledger directory %s is owned by uid %u, not by you (uid %u), and is not a shared "
                "ledger directory (sticky, mode 1777 or 1770, owned by root); refusing to use it",
                dir, (unsigned)sb.st_uid, (unsigned)me);
        return CT_LEDGER_EACCESS;
    }
    if (sb.st_mode & 077) {
        set_err(err, errlen,
                "ledger directory %s has group/other permissions (mode %04o; it must be 0700); "
                "refusing to use it",
                dir, (unsigned)(sb.st_mode & 07777));
        return CT_LEDGER_EACCESS;
    }
    return CT_LEDGER_OK;
}

int32_t ct_ledger_dir(char *buf, uint64_t len, int32_t create, char *err, uint64_t errlen)
{
    return ct_ledger_dir_at(getenv("CUDATRACE_LEDGER_DIR"), buf, len, create, err, errlen);
}

int32_t ct_ledger_dir_at(const char *env, char *buf, uint64_t len, int32_t create, char *err,
                         uint64_t errlen)
{
    if (!buf || len == 0)
        return CT_LEDGER_EINVAL;
    buf[0] = 0;
    if (err && errlen)
        err[0] = 0;
    int saved = errno;
    unsigned uid = (unsigned)geteuid();
    char cand[3][PATH_MAX];
    int ncand = 0;
    int chosen = env && *env; /* a directory named by the user is never replaced */
    if (chosen && strlen(env) >= PATH_MAX) {
        set_err(err, errlen, "ledger directory %.60s... is longer than a path may be", env);
        return CT_LEDGER_EINVAL;
    }
    if (chosen) {
        snprintf(cand[ncand++], PATH_MAX, "%s", env);
    } else {
        struct stat sb;
        if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode))
            snprintf(cand[ncand++], PATH_MAX, "/dev/shm/cudatrace-%u", uid);
        const char *xdg = getenv("XDG_RUNTIME_DIR");
        if (xdg && xdg[0] == '/')
            snprintf(cand[ncand++], PATH_MAX, "%s/cudatrace", xdg);
        snprintf(cand[ncand++], PATH_MAX, "/tmp/cudatrace-%u", uid);
    }
    int32_t rc = CT_LEDGER_ENOENT;
    int first_missing = -1;
    for (int i = 0; i < ncand; i++) {
        int soft = 0;
        rc = check_dir(cand[i], create, chosen, &soft, err, errlen);
        if (rc == CT_LEDGER_OK) {
            if (strlen(cand[i]) >= len) {
                rc = CT_LEDGER_EINVAL;
                set_err(err, errlen, "ledger directory path too long");
                break;
            }
            strcpy(buf, cand[i]);
            break;
        }
        if (rc == CT_LEDGER_ENOENT) {
            if (first_missing < 0)
                first_missing = i;
            continue;
        }
        /* A default candidate that is refused (a link, another owner, loose permissions:
         * perhaps planted by another user to block ours) is passed over for the next one,
         * each checked alike; a directory the user named is refused outright. */
        if (!soft && (chosen || i + 1 >= ncand))
            break;
    }
    if (rc == CT_LEDGER_ENOENT && first_missing >= 0 && strlen(cand[first_missing]) < len) {
        strcpy(buf, cand[first_missing]);
        set_err(err, errlen, "ledger directory %s does not exist", buf);
    }
    errno = saved;
    return rc;
}

int32_t ct_ledger_group_path(const char *group, char *buf, uint64_t len, int32_t create_dir,
                             char *err, uint64_t errlen)
{
    if (!buf || len == 0)
        return CT_LEDGER_EINVAL;
    buf[0] = 0;
    if (!ct_ledger_valid_group(group)) {
        set_err(err, errlen,
                "invalid budget group name '%.80s': use 1 to %d of A-Z a-z 0-9 _ . -, not "
                "starting with '.' or '-'",
                group ? group : "", CT_LEDGER_GROUP_MAX);
        return CT_LEDGER_EINVAL;
    }
    char dir[PATH_MAX];
    int32_t rc = ct_ledger_dir(dir, sizeof dir, create_dir, err, errlen);
    if (rc != CT_LEDGER_OK && rc != CT_LEDGER_ENOENT)
        return rc;
    int n = snprintf(buf, len, "%s/%s.ledger", dir, group);
    if (n < 0 || (size_t)n >= len) {
        buf[0] = 0;
        set_err(err, errlen, "ledger path too long");
        return CT_LEDGER_EINVAL;
    }
    return rc;
}

const char *ct_ledger_strerror(int32_t code)
{
    switch (code) {
    case CT_LEDGER_OK:
        return "ok";
    case CT_LEDGER_GRANTED:
        return "granted";
    case CT_LEDGER_EINVAL:
        return "invalid argument";
    case CT_LEDGER_ENOTMEMBER:
        return "not a member of the ledger";
    case CT_LEDGER_EFULL:
        return "the ledger has no free member slot";
    case CT_LEDGER_ENODEV:
        return "device index out of range";
    case CT_LEDGER_ENOENT:
        return "does not exist";
    case CT_LEDGER_EACCESS:
        return "refused (ownership or permissions)";
    case CT_LEDGER_ESYS:
        return "system error";
    case CT_LEDGER_ECONFLICT:
        return "the group has another budget, and live members";
    case CT_LEDGER_ENOBUDGET:
        return "the group has no budget";
    case CT_LEDGER_EBUSY:
        return "another member is deciding the group's budget";
    default:
        return "unknown error";
    }
}

/* ---- the group rule (ct_ledger_adopt) ------------------------------------------------------ */
/* One member at a time decides a group's budget: it holds budget_token (its slot's state word
 * with the slot number in the low byte). Deciding is a few loads and at most 16 stores; a token
 * whose member has left or died is taken over, so no process waits on one that is gone, and a
 * live holder is waited for at most ADOPT_WAIT_MS. */
#define ADOPT_WAIT_MS 1000

static uint64_t my_token(const struct ct_ledger *l)
{
    return (l->word & ~0xffull) | (uint64_t)(uint32_t)l->slot;
}

/* whether the member named by token t is gone (left, reclaimed or dead) */
static int token_stale(struct ct_ledger *l, uint64_t t)
{
    uint32_t slot = (uint32_t)(t & 0xff);
    uint64_t w = (t & ~0xffull) | CT_LEDGER_ACTIVE;
    struct ct_ledger_member *m = &l->mem[slot];
    if (slot >= CT_LEDGER_MAX_MEMBERS || LD(&m->state) != w)
        return 1;
    return member_alive(l, our_fd(l), (int32_t)slot, W_PID(w), LD(&m->start_ticks), LD(&m->pidns),
                        LD(&m->liveness)) == CT_LEDGER_DEAD;
}

/* "8.00 GiB", "512.0 MiB", "17 B" (as cudatrace/units.py format_bytes writes sizes) */
static void fmt_size(char *buf, size_t n, uint64_t v)
{
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (v < 1024) {
        snprintf(buf, n, "%llu B", (unsigned long long)v);
        return;
    }
    double x = (double)v / 1024.0;
    int i = 0;
    while (x >= 1024.0 && i < 5) {
        x /= 1024.0;
        i++;
    }
    snprintf(buf, n, x < 10 ? "%.2f %s" : "%.1f %s", x, units[i]);
}

/* "8.00 GiB on every device", "8.00 GiB on device 0, 4.00 GiB on device 1" or "none" */
static void limits_text(const uint64_t *lim, char *buf, size_t n)
{
    int all = 1, any = 0;
    char one[32];
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        all &= lim[d] == lim[0];
        any |= lim[d] != 0;
    }
    snprintf(buf, n, "none");
    if (any && all) {
        fmt_size(one, sizeof one, lim[0]);
        snprintf(buf, n, "%s on every device", one);
    }
    size_t o = 0;
    for (int d = 0; any && !all && d < CT_LEDGER_MAX_DEVICES && o < n; d++)
        if (lim[d]) {
            fmt_size(one, sizeof one, lim[d]);
            o += (size_t)snprintf(buf + o, n - o, "%s%s on device %d", o ? ", " : "", one, d);
        }
}

/* the pids of live members other than ourselves, ", "-separated into buf; how many */
static int other_live(struct ct_ledger *l, char *buf, size_t n)
{
    int fd = our_fd(l), count = 0;
    size_t o = 0;
    buf[0] = 0;
    uint32_t h = hwm(l);
    for (uint32_t i = 0; i < h; i++) {
        struct ct_ledger_member *m = &l->mem[i];
        uint64_t w = LD(&m->state);
        if ((int32_t)i == l->slot || W_STATE(w) != CT_LEDGER_ACTIVE)
            continue;
        if (member_alive(l, fd, (int32_t)i, W_PID(w), LD(&m->start_ticks), LD(&m->pidns),
                         LD(&m->liveness)) == CT_LEDGER_DEAD)
            continue;
        if (o < n)
            o += (size_t)snprintf(buf + o, n - o, "%s%d", count ? ", " : "", W_PID(w));
        count++;
    }
    return count;
}

/* the group rule's verdict for want on the group as it is: CT_LEDGER_OK, _ECONFLICT, _ENOBUDGET
 * (err says why), or 1: want replaces the budget (no live member but this handle's) */
static int32_t budget_verdict(struct ct_ledger *l, const uint64_t *want, char *err, uint64_t errlen)
{
    uint64_t cur[CT_LEDGER_MAX_DEVICES];
    int any = 0, same = 1;
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        cur[d] = LD(&l->hdr->limit[d]);
        any |= cur[d] != 0;
        same &= want && cur[d] == want[d];
    }
    const char *g = l->hdr->group;
    char have[400], asked[400], pids[200];
    limits_text(cur, have, sizeof have);
    if (!want) {
        if (any)
            return CT_LEDGER_OK;
        set_err(err, errlen, "group %s has no budget, and this process names none", g);
        return CT_LEDGER_ENOBUDGET;
    }
    if (same)
        return CT_LEDGER_OK;
    limits_text(want, asked, sizeof asked);
    if (other_live(l, pids, sizeof pids)) {
        set_err(err, errlen,
                "group %s has a budget of %s, in use by pids %s; this process asks for %s", g, have,
                pids, asked);
        return CT_LEDGER_ECONFLICT;
    }
    set_err(err, errlen, "group %s had a budget of %s and no live member; it is now %s", g, have,
            asked);
    return 1;
}

/* with the token held: the decision of ct_ledger_adopt */
static int32_t adopt_decide(struct ct_ledger *l, const uint64_t *want, int32_t *replaced, char *err,
                            uint64_t errlen)
{
    int32_t rc = budget_verdict(l, want, err, errlen);
    if (rc != 1)
        return rc;
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        ST(&l->hdr->limit[d], want[d]);
    if (replaced)
        *replaced = 1;
    return CT_LEDGER_OK;
}

int32_t ct_ledger_check_budget(ct_ledger *l, const uint64_t *want, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!valid(l))
        return CT_LEDGER_EINVAL;
    int saved = errno;
    int32_t rc = budget_verdict(l, want, err, errlen);
    errno = saved;
    return rc == 1 ? CT_LEDGER_OK : rc;
}

int32_t ct_ledger_adopt(ct_ledger *l, const uint64_t *want, int32_t *replaced, char *err,
                        uint64_t errlen)
{
    if (replaced)
        *replaced = 0;
    if (err && errlen)
        err[0] = 0;
    if (!valid(l))
        return CT_LEDGER_EINVAL;
    if (l->slot < 0 || l->slot >= CT_LEDGER_MAX_MEMBERS || LD(&l->mem[l->slot].state) != l->word)
        return CT_LEDGER_ENOTMEMBER;
    int saved = errno;
    uint64_t mine = my_token(l);
    int32_t rc = CT_LEDGER_EBUSY;
    for (int waited = 0;; waited++) {
        uint64_t t = 0;
        if (CAS(&l->hdr->budget_token, &t, mine) || t == mine) {
            reclaim_scan(l); /* dead members are not "live members" */
            rc = adopt_decide(l, want, replaced, err, errlen);
            CAS(&l->hdr->budget_token, &mine, 0);
            break;
        }
        if (token_stale(l, t)) {
            CAS(&l->hdr->budget_token, &t, 0);
            continue;
        }
        if (waited >= ADOPT_WAIT_MS) {
            set_err(err, errlen,
                    "pid %d has been deciding group %s's budget for a second; try again", W_PID(t),
                    l->hdr->group);
            break;
        }
        sleep_ms(1);
    }
    errno = saved;
    return rc;
}

/* ---- the budget grammar -------------------------------------------------------------------- */

static const char *skip_blank(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    return p;
}

/* the multiplier of a unit (case-insensitive), 0 when none matches */
static uint64_t unit_mult(const char *u, size_t n)
{
    static const struct {
        const char *name;
        uint64_t mult;
    } units[] = {
        {"b", 1},
        {"k", 1ull << 10},
        {"kib", 1ull << 10},
        {"kb", 1000ull},
        {"m", 1ull << 20},
        {"mib", 1ull << 20},
        {"mb", 1000000ull},
        {"g", 1ull << 30},
        {"gib", 1ull << 30},
        {"gb", 1000000000ull},
        {"t", 1ull << 40},
        {"tib", 1ull << 40},
        {"tb", 1000000000000ull},
    };
    char low[4];
    if (n == 0 || n > 3)
        return 0;
    for (size_t i = 0; i < n; i++)
        low[i] = (char)(u[i] >= 'A' && u[i] <= 'Z' ? u[i] + 32 : u[i]);
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (strlen(units[i].name) == n && memcmp(units[i].name, low, n) == 0)
            return units[i].mult;
    return 0;
}

/* one amount in [s, end): 0 with *out, else CT_LEDGER_EINVAL with err */
static int32_t parse_amount(const char *s, const char *end, uint64_t *out, char *err,
                            uint64_t errlen)
{
    const char *p = skip_blank(s, end), *q = end;
    while (q > p && (q[-1] == ' ' || q[-1] == '\t'))
        q--;
    int len = (int)(q - p);
    s = p;
    if (p < q && *p == '-') {
        set_err(err, errlen, "'%.*s': must be positive", len, s);
        return CT_LEDGER_EINVAL;
    }
    if (p < q && *p == '+')
        p++;
    unsigned __int128 whole = 0, frac = 0, scale = 1;
    int digits = 0, fdigits = 0;
    for (; p < q && *p >= '0' && *p <= '9'; p++, digits++)
        if ((whole = whole * 10 + (unsigned)(*p - '0')) > UINT64_MAX)
            goto too_large;
    if (p < q && *p == '.')
        for (p++; p < q && *p >= '0' && *p <= '9'; p++, fdigits++)
            if (fdigits < 18) {
                frac = frac * 10 + (unsigned)(*p - '0');
                scale *= 10;
            }
    if (!digits && !fdigits) {
        set_err(err, errlen, "'%.*s' is not a size (write e.g. 8GiB, 512MiB, 1.5GiB)", len, s);
        return CT_LEDGER_EINVAL;
    }
    const char *u = skip_blank(p, q);
    uint64_t mult = u == q ? 1 : unit_mult(u, (size_t)(q - u));
    for (const char *x = u; x < q && !mult; x++)
        if (!((*x >= 'a' && *x <= 'z') || (*x >= 'A' && *x <= 'Z'))) {
            set_err(err, errlen, "'%.*s' is not a size (write e.g. 8GiB, 512MiB, 1.5GiB)", len, s);
            return CT_LEDGER_EINVAL;
        }
    if (!mult) {
        set_err(err, errlen,
                "'%.*s': unknown unit '%.*s' (units: B KiB MiB GiB TiB, K M G T alike, KB MB GB "
                "TB = powers of 1000)",
                len, s, (int)(q - u), u);
        return CT_LEDGER_EINVAL;
    }
    if (mult == 1 && frac) {
        set_err(err, errlen, "'%.*s': a number of bytes must be whole", len, s);
        return CT_LEDGER_EINVAL;
    }
    unsigned __int128 v = whole * mult + frac * mult / scale;
    if (v > UINT64_MAX)
        goto too_large;
    if (v == 0) {
        set_err(err, errlen,
                whole || frac ? "'%.*s' is less than a byte" : "'%.*s' must be more than zero", len,
                s);
        return CT_LEDGER_EINVAL;
    }
    if (u == q && v < CT_LEDGER_BARE_MIN) {
        set_err(err, errlen,
                "'%.*s' has no unit, so it means %llu bytes, which is surely not meant: write "
                "%.*sGiB or %.*sMiB (or %.*sB for bytes)",
                len, s, (unsigned long long)v, len, s, len, s, len, s);
        return CT_LEDGER_EINVAL;
    }
    *out = (uint64_t)v;
    return CT_LEDGER_OK;
too_large:
    set_err(err, errlen, "'%.*s' is too large", len, s);
    return CT_LEDGER_EINVAL;
}

int32_t ct_ledger_parse_size(const char *text, uint64_t *out, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!text || !out)
        return CT_LEDGER_EINVAL;
    const char *end = text + strlen(text);
    if (skip_blank(text, end) == end) {
        set_err(err, errlen, "empty size");
        return CT_LEDGER_EINVAL;
    }
    return parse_amount(text, end, out, err, errlen);
}

/* one item "AMOUNT" or "DEV=AMOUNT" of a budget spec; 0 or CT_LEDGER_EINVAL */
static int32_t parse_item(const char *p, const char *e, uint64_t *all, int *have_all, uint64_t *per,
                          uint32_t *set, char *err, uint64_t errlen)
{
    const char *eq = memchr(p, '=', (size_t)(e - p));
    if (skip_blank(p, e) == e) {
        set_err(err, errlen, "empty item in the budget");
        return CT_LEDGER_EINVAL;
    }
    if (memchr(p, '%', (size_t)(e - p))) {
        set_err(err, errlen,
                "'%.*s': a share of device memory (%%) is resolved by cudatrace run or the "
                "integration into bytes; give bytes here",
                (int)(e - p), p);
        return CT_LEDGER_EINVAL;
    }
    if (!eq) {
        if (*have_all) {
            set_err(err, errlen, "more than one amount for every device in the budget");
            return CT_LEDGER_EINVAL;
        }
        *have_all = 1;
        return parse_amount(p, e, all, err, errlen);
    }
    const char *d = skip_blank(p, eq), *de = eq;
    while (de > d && (de[-1] == ' ' || de[-1] == '\t'))
        de--;
    int dev = 0;
    for (const char *x = d; x < de; x++) {
        if (*x < '0' || *x > '9' || dev >= CT_LEDGER_MAX_DEVICES || d == de)
            dev = -1;
        else
            dev = dev * 10 + (*x - '0');
        if (dev < 0)
            break;
    }
    if (d == de || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES) {
        set_err(err, errlen, "'%.*s': the device must be an index below %d", (int)(e - p), p,
                CT_LEDGER_MAX_DEVICES);
        return CT_LEDGER_EINVAL;
    }
    if (*set & (1u << dev)) {
        set_err(err, errlen, "device %d is given twice in the budget", dev);
        return CT_LEDGER_EINVAL;
    }
    *set |= 1u << dev;
    return parse_amount(eq + 1, e, &per[dev], err, errlen);
}

int32_t ct_ledger_parse_budget(const char *spec, uint64_t *limits, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!spec || !limits)
        return CT_LEDGER_EINVAL;
    uint64_t all = 0, per[CT_LEDGER_MAX_DEVICES] = {0};
    uint32_t set = 0;
    int have_all = 0;
    const char *p = spec, *end = spec + strlen(spec);
    if (skip_blank(p, end) == end) {
        set_err(err, errlen, "empty budget");
        return CT_LEDGER_EINVAL;
    }
    for (;;) {
        const char *e = memchr(p, ',', (size_t)(end - p));
        if (!e)
            e = end;
        if (parse_item(p, e, &all, &have_all, per, &set, err, errlen) != CT_LEDGER_OK)
            return CT_LEDGER_EINVAL;
        if (e == end)
            break;
        p = e + 1;
    }
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        limits[d] = (set & (1u << d)) ? per[d] : have_all ? all : 0;
    return CT_LEDGER_OK;
}
