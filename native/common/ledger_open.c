/* ledger_open.c - opening a budget ledger (ledger.h): a member's mapping of its own file, a
 * reader's pread copy of anyone's, the checks of a file and its header, the ledger
 * directories (a user's own, 0700; a shared one, sticky: one part per user), group paths.
 *
 * A member opens the directory once (O_NOFOLLOW) and the file through it (openat, O_NOFOLLOW,
 * O_NONBLOCK: a FIFO put in its place never blocks it), checks the descriptor (fstat: a regular
 * file of its own uid that no other uid may write, of a ledger's size) and the header before it
 * maps anything. A reader opens the file for reading alone (O_NOFOLLOW, O_NONBLOCK), checks it
 * the same way but for the owner, and reads it with pread into a copy: it never maps it, so a
 * file truncated under it is a short read, never a SIGBUS. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ledger_int.h"

#include "procstat.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define OPEN_WAIT_MS 1000

long ctl_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break; /* the end of a file shorter than a ledger */
        got += (size_t)r;
    }
    return (long)got;
}

/* ---- shared ledger directories ------------------------------------------------------------ */
/* A directory an integration manages for the jobs of several users (Slurm: one group per GPU
 * for every job on it): sticky, so no user can remove or replace another's files, owned by root
 * (or by the caller), group or other writable. There each user's part of a group is its own
 * file (<group>@<uid>.ledger), mode 0644 (0640 when others cannot write the directory): the
 * other users read it, no one but its owner writes it. The mode of a part: 0 when dsb does not
 * describe a shared directory. */
unsigned ctl_shared_mode(const struct stat *dsb)
{
    if (!S_ISDIR(dsb->st_mode) || !(dsb->st_mode & S_ISVTX) || !(dsb->st_mode & 022))
        return 0;
    if (dsb->st_uid != 0 && dsb->st_uid != geteuid())
        return 0;
    return (dsb->st_mode & 002) ? 0644 : 0640;
}

/* the directory part of path into dir ("." when none); 0, -1 too long */
static int dir_of(const char *path, char *dir, size_t n, const char **base)
{
    const char *slash = path ? strrchr(path, '/') : NULL;
    if (!slash) {
        dir[0] = '.';
        dir[1] = 0;
        *base = path;
        return 0;
    }
    size_t len = (size_t)(slash - path);
    if (len + 2 > n)
        return -1;
    memcpy(dir, path, len ? len : 1);
    dir[len ? len : 1] = 0;
    *base = slash + 1;
    return 0;
}

/* The shared mode of the directory holding path (0: not shared). */
static unsigned path_shared_mode(const char *path)
{
    char dir[PATH_MAX];
    const char *base;
    struct stat sb;
    if (dir_of(path, dir, sizeof dir, &base) != 0 || lstat(dir, &sb) != 0)
        return 0;
    return ctl_shared_mode(&sb);
}

int32_t ct_ledger_shared_dir(const char *path)
{
    int saved = errno;
    int32_t r = path_shared_mode(path) != 0;
    errno = saved;
    return r;
}

/* ---- checking a ledger ----------------------------------------------------------------------- */

int ctl_check_header(const struct ct_ledger_header *h, const char *group, char *why, size_t n,
                     int *again)
{
    uint64_t magic = LD(&h->magic);
    *again = 0;
    if (magic == 0) {
        *again = 1;
        snprintf(why, n, "is not initialized (its creator may have died while making it)");
    } else if (magic != (uint64_t)CT_LEDGER_MAGIC) {
        snprintf(why, n, "is not a cudatrace budget ledger (bad magic)");
    } else if (h->version != CT_LEDGER_VERSION) {
        snprintf(why, n, "has version %u; this cudatrace uses version %d", h->version,
                 CT_LEDGER_VERSION);
    } else if (h->header_size != CT_LEDGER_HEADER_SIZE || h->member_size != CT_LEDGER_MEMBER_SIZE ||
               h->max_devices != CT_LEDGER_MAX_DEVICES || h->max_members != CT_LEDGER_MAX_MEMBERS) {
        snprintf(why, n, "has an incompatible layout");
    } else if ((LD(&h->on_exceed) != CT_LEDGER_DENY && LD(&h->on_exceed) != CT_LEDGER_WARN) ||
               (LD(&h->flags) & ~(uint32_t)CT_LEDGER_F_COUNT_HOST) ||
               LD(&h->members_hwm) > CT_LEDGER_MAX_MEMBERS ||
               memchr(h->group, 0, sizeof h->group) == NULL) {
        snprintf(why, n, "is damaged (on_exceed %u, flags 0x%x, members %u)",
                 (unsigned)LD(&h->on_exceed), (unsigned)LD(&h->flags),
                 (unsigned)LD(&h->members_hwm));
    } else if (group && strncmp(h->group, group, sizeof h->group) != 0) {
        snprintf(why, n, "is of group '%.80s', not %s", h->group, group);
    } else {
        return 0;
    }
    return -1;
}

/* Whether the file open on fd may be a member's (member: -1, the caller's uid's; >= 0, that
 * uid's; no other uid may write it: in a private directory no group/other bit at all; in a
 * shared one, sh, no group/other write; INT32_MIN, a reader's: any owner and mode), and of a
 * ledger's size: NULL, or why not (in buf). again: it is being made (empty). */
static const char *check_file(const struct stat *sb, unsigned sh, int member, int *again, char *buf,
                              size_t n)
{
    uid_t me = member < 0 ? geteuid() : (uid_t)member; /* member: -1, or the uid it opened as */
    *again = 0;
    if (!S_ISREG(sb->st_mode))
        return "is not a regular file";
    if (member != INT32_MIN && sb->st_uid != me) {
        snprintf(buf, n,
                 "is owned by uid %u, not by you (uid %u); a member maps only a ledger of its own "
                 "uid",
                 (unsigned)sb->st_uid, (unsigned)me);
        return buf;
    }
    if (member != INT32_MIN && (sb->st_mode & (sh ? 022u : 077u))) {
        snprintf(buf, n,
                 sh ? "is writable by other users (mode %04o; a part is 0644, its owner's alone)"
                    : "has group/other permissions (mode %04o; it must be 0600)",
                 (unsigned)(sb->st_mode & 07777));
        return buf;
    }
    if (sb->st_size == 0) {
        *again = 1; /* created in place a moment ago, not sized yet */
        return "is empty (its creator may have died while making it)";
    }
    if (sb->st_size != CT_LEDGER_FILE_SIZE) {
        snprintf(buf, n,
                 "has %lld bytes, not %d: not a ledger of this cudatrace version, or one cut "
                 "short or grown (remove it once no run uses it)",
                 (long long)sb->st_size, CT_LEDGER_FILE_SIZE);
        return buf;
    }
    return NULL;
}

int ctl_check_own(struct ct_ledger *l)
{
    int fd = ctl_our_fd(l);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0)
        return 0; /* the program closed our descriptor: nothing to tell from here */
    char buf[300], why[300], msg[PATH_MAX + 400];
    int again = 0;
    /* its owner is the uid it was opened as (a process that changed its uid since keeps it) */
    const char *bad = check_file(&sb, l->shared_mode, (int)l->owner, &again, buf, sizeof buf);
    if (!bad && ctl_check_header(l->hdr, NULL, why, sizeof why, &again) != 0)
        bad = why;
    if (!bad)
        return 0;
    snprintf(msg, sizeof msg,
             "the budget ledger %s was changed under its members: it %s (delete it once no run "
             "uses it, and start again)",
             l->path, bad);
    ctl_damaged(l, msg);
    return -1;
}

/* ---- creating a ledger ----------------------------------------------------------------------- */

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
    h->created_ns = ctl_real_ns();
    if (cfg) {
        h->on_exceed = cfg->on_exceed == CT_LEDGER_WARN ? CT_LEDGER_WARN : CT_LEDGER_DENY;
        h->flags = cfg->flags;
        memcpy(h->limit, cfg->limit, sizeof h->limit);
        memcpy(h->group, cfg->group, sizeof h->group);
        h->group[sizeof h->group - 1] = 0;
    }
    if (!h->group[0] && path) { /* <dir>/<group>.ledger (<group>@<uid>.ledger: a part) */
        const char *b = strrchr(path, '/');
        b = b ? b + 1 : path;
        size_t n = strlen(b);
        if (n > 7 && strcmp(b + n - 7, ".ledger") == 0)
            n -= 7;
        const char *at = memchr(b, '@', n);
        if (at && at > b)
            n = (size_t)(at - b);
        if (n > CT_LEDGER_GROUP_MAX)
            n = CT_LEDGER_GROUP_MAX;
        memcpy(h->group, b, n);
        h->group[n] = 0;
    }
}

/* Size, initialize and publish a new ledger through fd (mode: the file's). */
static int init_file(int fd, const struct ct_ledger_config *cfg, const char *path, unsigned mode,
                     char *err, uint64_t errlen)
{
    if (fchmod(fd, mode) != 0 || ftruncate(fd, CT_LEDGER_FILE_SIZE) != 0) {
        ctl_set_err(err, errlen, "cannot size budget ledger %s: %s", path, strerror(errno));
        return -1;
    }
    void *p = mmap(NULL, CT_LEDGER_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        ctl_set_err(err, errlen, "cannot map budget ledger %s: %s", path, strerror(errno));
        return -1;
    }
    struct ct_ledger_header *h = p;
    init_header(h, cfg, path);
    __atomic_store_n(&h->magic, (uint64_t)CT_LEDGER_MAGIC, __ATOMIC_SEQ_CST); /* publish last */
    munmap(p, CT_LEDGER_FILE_SIZE);
    return 0;
}

/* Create base in dirfd fully initialized: build it under a temporary name and link it into
 * place, so no one ever sees a half-made ledger; where hard links are not supported, create it
 * in place (O_EXCL) and publish the magic last. Returns 1 created, 0 someone else did, -1 error. */
static int create_file(int dirfd, const char *base, const char *path,
                       const struct ct_ledger_config *cfg, unsigned mode, char *err,
                       uint64_t errlen)
{
    char tmp[NAME_MAX + 1];
    int n = snprintf(tmp, sizeof tmp, ".%.200s.%d.%llx.tmp", base, (int)getpid(),
                     (unsigned long long)ctl_mono_ns());
    if (n > 0 && (size_t)n < sizeof tmp) {
        int fd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            int ok = init_file(fd, cfg, path, mode, err, errlen);
            close(fd);
            if (ok != 0) {
                unlinkat(dirfd, tmp, 0);
                return -1;
            }
            int r = linkat(dirfd, tmp, dirfd, base, 0);
            int e = errno;
            unlinkat(dirfd, tmp, 0);
            if (r == 0)
                return 1;
            if (e == EEXIST)
                return 0;
            if (e != EPERM && e != EOPNOTSUPP && e != ENOSYS && e != EMLINK && e != EXDEV) {
                ctl_set_err(err, errlen, "cannot create budget ledger %s: %s", path, strerror(e));
                return -1;
            }
        } else if (errno != EEXIST && errno != ENAMETOOLONG) {
            ctl_set_err(err, errlen, "cannot create budget ledger %s: %s", path, strerror(errno));
            return -1;
        }
    }
    /* fallback: in place */
    int fd = openat(dirfd, base, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return 0;
        ctl_set_err(err, errlen, "cannot create budget ledger %s: %s", path, strerror(errno));
        return -1;
    }
    int ok = init_file(fd, cfg, path, mode, err, errlen);
    close(fd);
    if (ok != 0) {
        unlinkat(dirfd, base, 0);
        return -1;
    }
    return 1;
}

/* ---- a member's mapping -------------------------------------------------------------------- */

/* Check and map the ledger open on fd (closed on failure); sh: the directory's shared mode.
 * Returns the mapping, NULL with err set (*again = 1: it is being created, try again). */
static void *map_fd(int fd, const char *path, unsigned sh, int *again, char *err, uint64_t errlen)
{
    struct stat sb;
    char buf[PATH_MAX + 200], why[300];
    const char *bad = NULL;
    if (fstat(fd, &sb) != 0) {
        ctl_set_err(err, errlen, "cannot stat budget ledger %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    bad = check_file(&sb, sh, -1, again, buf, sizeof buf);
    if (bad) {
        ctl_set_err(err, errlen, "budget ledger %s %s; refusing to use it", path, bad);
        close(fd);
        errno = EACCES;
        return NULL;
    }
    void *p = mmap(NULL, CT_LEDGER_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    if (p == MAP_FAILED) {
        close(fd);
        ctl_set_err(err, errlen, "cannot map budget ledger %s: %s", path, strerror(e));
        return NULL;
    }
    /* checked before anything is written: a damaged file is never half-updated */
    if (ctl_check_header(p, NULL, why, sizeof why, again) != 0) {
        if (strncmp(why, "is damaged", 10) == 0)
            ctl_set_err(err, errlen,
                        "budget ledger %s %s; delete it (rm %s) once no run uses it, and start "
                        "again; refusing to use it",
                        path, why, path);
        else
            ctl_set_err(err, errlen, "budget ledger %s %s; refusing to use it", path, why);
        munmap(p, CT_LEDGER_FILE_SIZE);
        close(fd);
        errno = EINVAL;
        return NULL;
    }
    return p;
}

/* The handle on a mapping p made through fd (both given back on failure). */
static ct_ledger *make_handle(void *p, int fd, const char *path, char *err, uint64_t errlen)
{
    struct ct_ledger *l = calloc(1, sizeof *l);
    char *pathcopy = strdup(path);
    if (!l || !pathcopy) {
        free(l);
        free(pathcopy);
        if (p)
            munmap(p, CT_LEDGER_FILE_SIZE);
        close(fd);
        ctl_set_err(err, errlen, "out of memory");
        return NULL;
    }
    struct stat sb;
    l->fd = fd;
    l->fd_owner = -1;
    if (fstat(fd, &sb) == 0) {
        l->ino = (uint64_t)sb.st_ino;
        l->dev = (uint64_t)sb.st_dev;
        l->owner = (uint32_t)sb.st_uid;
    }
    l->path = pathcopy;
    l->slot = -1;
    l->pidns = ct_procstat_self_pidns();
    if (!p) { /* a reader's: its descriptor is the one it reads */
        l->reader = 1;
        return l;
    }
    /* The mapping holds a reference to the description it was made through, and a forked
     * child inherits the mapping: locks on that description would live as long as any child.
     * So the locks go on a description of their own (own_fd reopens the file, on this number). */
    ctl_own_fd(l);
    l->hdr = p;
    l->mem = (struct ct_ledger_member *)((char *)p + CT_LEDGER_HEADER_SIZE);
    return l;
}

/* Open path's directory (O_NOFOLLOW: a link put in its place is refused); -1 with err. */
static int open_dir(const char *path, char *dir, size_t n, const char **base, char *err,
                    uint64_t errlen)
{
    if (dir_of(path, dir, n, base) != 0 || !**base) {
        ctl_set_err(err, errlen, "budget ledger path %s has no file name", path);
        return -1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        ctl_set_err(err, errlen, "cannot open the directory of budget ledger %s: %s%s", path,
                    strerror(errno),
                    errno == ELOOP || errno == ENOTDIR ? " (a link is never followed)" : "");
    return dfd;
}

/* Open (or with create, make) base in dfd and map it; *fd_out its descriptor. */
static void *map_in(int dfd, const char *base, const char *path, unsigned sh, int32_t create,
                    const struct ct_ledger_config *cfg, int32_t *created, int *fd_out, char *err,
                    uint64_t errlen)
{
    void *p = NULL;
    for (int waited = 0, tries = 0; tries < OPEN_WAIT_MS + 16; tries++) {
        int again = 0;
        int fd = openat(dfd, base, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) {
            int e = errno;
            if (e == ENOENT && create) {
                int r = create_file(dfd, base, path, cfg, sh ? sh : 0600, err, errlen);
                if (r < 0)
                    break;
                if (r == 1 && created)
                    *created = 1;
                continue; /* open what is there now */
            }
            if (e == ELOOP)
                ctl_set_err(err, errlen, "budget ledger %s is a symbolic link; refusing to use it",
                            path);
            else
                ctl_set_err(err, errlen, "cannot open budget ledger %s: %s", path, strerror(e));
            break;
        }
        p = map_fd(fd, path, sh, &again, err, errlen);
        if (p) {
            *fd_out = fd; /* kept open: the liveness locks live on it */
            break;
        }
        if (!again || waited >= OPEN_WAIT_MS)
            break;
        ctl_sleep_ms(1);
        waited++;
    }
    return p;
}

static ct_ledger *open_ledger(const char *path, int32_t create, const struct ct_ledger_config *cfg,
                              int32_t *created, char *err, uint64_t errlen)
{
    if (created)
        *created = 0;
    if (err && errlen)
        err[0] = 0;
    if (!path || !*path || strlen(path) >= PATH_MAX) {
        ctl_set_err(err, errlen, "no budget ledger path");
        return NULL;
    }
    int saved = errno;
    char dir[PATH_MAX];
    const char *base = NULL;
    struct ct_ledger *l = NULL;
    int fd = -1, dfd = open_dir(path, dir, sizeof dir, &base, err, errlen);
    struct stat dsb;
    if (dfd >= 0 && fstat(dfd, &dsb) != 0) {
        ctl_set_err(err, errlen, "cannot stat the directory of budget ledger %s: %s", path,
                    strerror(errno));
        close(dfd);
        dfd = -1;
    }
    unsigned sh = dfd >= 0 ? ctl_shared_mode(&dsb) : 0;
    void *p = dfd >= 0 ? map_in(dfd, base, path, sh, create, cfg, created, &fd, err, errlen) : NULL;
    if (p)
        l = make_handle(p, fd, path, err, errlen);
    if (l) {
        l->shared_mode = sh;
        l->next_check_ns = ctl_mono_ns() + 1000000000ull;
        /* a group in a shared directory: the other users' parts count too (they keep dfd) */
        if (sh && ct_ledger_valid_group(l->hdr->group)) {
            int r = ctl_parts_open(l, dfd, err, errlen);
            dfd = -1;
            if (r != 0) {
                ct_ledger_close(l);
                l = NULL;
            }
        }
    }
    if (dfd >= 0)
        close(dfd);
    errno = saved;
    return l;
}

ct_ledger *ct_ledger_open(const char *path, int32_t create, char *err, uint64_t errlen)
{
    return open_ledger(path, create, NULL, NULL, err, errlen);
}

ct_ledger *ct_ledger_create(const char *path, const struct ct_ledger_config *cfg, int32_t *created,
                            char *err, uint64_t errlen)
{
    return open_ledger(path, 1, cfg, created, err, errlen);
}

/* ---- a reader's copy ------------------------------------------------------------------------ */

/* The reader's handle on fd (its own, closed on failure), checked: a regular file of a ledger's
 * size whose header is a ledger's of this version. */
static ct_ledger *reader_on(int fd, const char *name, char *err, uint64_t errlen)
{
    struct stat sb;
    char buf[300], why[300];
    struct ct_ledger_header h;
    int again = 0;
    const char *bad = NULL;
    if (fstat(fd, &sb) != 0) {
        ctl_set_err(err, errlen, "cannot stat budget ledger %s: %s", name, strerror(errno));
        close(fd);
        return NULL;
    }
    bad = check_file(&sb, 0, INT32_MIN, &again, buf, sizeof buf);
    if (!bad && ctl_pread_full(fd, &h, sizeof h, 0) != (long)sizeof h)
        bad = "cannot be read whole (cut short under its reader?)";
    if (!bad && ctl_check_header(&h, NULL, why, sizeof why, &again) != 0)
        bad = why;
    if (bad) {
        ctl_set_err(err, errlen, "budget ledger %s %s; not read", name, bad);
        close(fd);
        return NULL;
    }
    return make_handle(NULL, fd, name, err, errlen);
}

ct_ledger *ct_ledger_open_reader(const char *path, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!path || !*path || strlen(path) >= PATH_MAX) {
        ctl_set_err(err, errlen, "no budget ledger path");
        return NULL;
    }
    int saved = errno;
    struct ct_ledger *l = NULL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        ctl_set_err(err, errlen, "cannot open budget ledger %s: %s", path,
                    errno == ELOOP ? "it is a symbolic link (never followed)" : strerror(errno));
    else
        l = reader_on(fd, path, err, errlen);
    errno = saved;
    return l;
}

ct_ledger *ct_ledger_open_fd(int32_t fd, const char *name, char *err, uint64_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (fd < 0 || !name || !*name || strlen(name) >= PATH_MAX) {
        ctl_set_err(err, errlen, "no budget ledger descriptor");
        return NULL;
    }
    int saved = errno;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    struct ct_ledger *l = NULL;
    if (own < 0)
        ctl_set_err(err, errlen, "cannot use budget ledger %s: %s", name, strerror(errno));
    else
        l = reader_on(own, name, err, errlen);
    errno = saved;
    return l;
}

void ct_ledger_close(struct ct_ledger *l)
{
    if (!l)
        return;
    int saved = errno;
    if (l->hdr)
        munmap(l->hdr, CT_LEDGER_FILE_SIZE);
    if (l->reader ? l->fd >= 0 : ctl_our_fd(l) >= 0)
        close(l->fd); /* drops our locks (a forked child's copy drops nothing of its parent's) */
    ctl_parts_close(l);
    l->hdr = NULL;
    l->mem = NULL;
    free(l->path);
    free(l);
    errno = saved;
}

int32_t ct_ledger_other_parts(ct_ledger *l)
{
    return ctl_valid(l) && l->parts ? ctl_parts_count(l) : 0;
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
            ctl_set_err(err, errlen, "cannot use ledger directory %s: %s", dir, strerror(errno));
            *soft = 1;
            return CT_LEDGER_ESYS;
        }
        if (!create) {
            ctl_set_err(err, errlen, "ledger directory %s does not exist", dir);
            return CT_LEDGER_ENOENT;
        }
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            ctl_set_err(err, errlen, "cannot create ledger directory %s: %s", dir, strerror(errno));
            *soft = 1;
            return CT_LEDGER_ESYS;
        }
        if (lstat(dir, &sb) != 0) {
            ctl_set_err(err, errlen, "cannot use ledger directory %s: %s", dir, strerror(errno));
            return CT_LEDGER_ESYS;
        }
    }
    uid_t me = geteuid();
    if (S_ISLNK(sb.st_mode)) {
        ctl_set_err(err, errlen, "ledger directory %s is a symbolic link; refusing to use it", dir);
        return CT_LEDGER_EACCESS;
    }
    if (!S_ISDIR(sb.st_mode)) {
        ctl_set_err(err, errlen, "ledger directory %s is not a directory; refusing to use it", dir);
        return CT_LEDGER_EACCESS;
    }
    if (shared_ok && ctl_shared_mode(&sb))
        return CT_LEDGER_OK; /* a shared ledger directory (root's or ours, sticky) */
    if (sb.st_uid != me) {
        ctl_set_err(
            err, errlen,
            "ledger directory %s is owned by uid %u, not by you (uid %u), and is not a shared "
            "ledger directory (sticky, mode 1777 or 1770, owned by root); refusing to use it",
            dir, (unsigned)sb.st_uid, (unsigned)me);
        return CT_LEDGER_EACCESS;
    }
    if (sb.st_mode & 077) {
        ctl_set_err(err, errlen,
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
        ctl_set_err(err, errlen, "ledger directory %.60s... is longer than a path may be", env);
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
                ctl_set_err(err, errlen, "ledger directory path too long");
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
        ctl_set_err(err, errlen, "ledger directory %s does not exist", buf);
    }
    errno = saved;
    return rc;
}

int32_t ct_ledger_group_path(const char *group, char *buf, uint64_t len, int32_t create_dir,
                             char *err, uint64_t errlen)
{
    return ct_ledger_group_path_at(getenv("CUDATRACE_LEDGER_DIR"), group, buf, len, create_dir, err,
                                   errlen);
}

int32_t ct_ledger_group_path_at(const char *named, const char *group, char *buf, uint64_t len,
                                int32_t create_dir, char *err, uint64_t errlen)
{
    if (!buf || len == 0)
        return CT_LEDGER_EINVAL;
    buf[0] = 0;
    if (!ct_ledger_valid_group(group)) {
        ctl_set_err(err, errlen,
                    "invalid budget group name '%.80s': use 1 to %d of A-Z a-z 0-9 _ . -, not "
                    "starting with '.' or '-'",
                    group ? group : "", CT_LEDGER_GROUP_MAX);
        return CT_LEDGER_EINVAL;
    }
    char dir[PATH_MAX];
    int32_t rc = ct_ledger_dir_at(named, dir, sizeof dir, create_dir, err, errlen);
    if (rc != CT_LEDGER_OK && rc != CT_LEDGER_ENOENT)
        return rc;
    /* in a shared directory, this uid's part of the group */
    struct stat dsb;
    int n = rc == CT_LEDGER_OK && lstat(dir, &dsb) == 0 && ctl_shared_mode(&dsb)
                ? snprintf(buf, len, "%s/%s@%u.ledger", dir, group, (unsigned)geteuid())
                : snprintf(buf, len, "%s/%s.ledger", dir, group);
    if (n < 0 || (size_t)n >= len) {
        buf[0] = 0;
        ctl_set_err(err, errlen, "ledger path too long");
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
    case CT_LEDGER_EDAMAGED:
        return "the ledger file was damaged under its members";
    default:
        return "unknown error";
    }
}
