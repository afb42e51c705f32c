/* fence.c - the sealed fence record (fence.h): where it is, whether the workload could have
 * written it, and what it says (native/include/fence.def). Read once, at load: no lock, no
 * allocation, libc only. */
#include "fence.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ledger.h"

/* the kinds of value (fence.def KIND) */
enum {
    CT_FK_GROUP,
    CT_FK_SHARE,
    CT_FK_BUDGET,
    CT_FK_AMOUNT,
    CT_FK_PATH,
    CT_FK_FLAG,
    CT_FK_EXCEED,
    CT_FK_ON_ERROR,
    CT_FK_UID,
    CT_FK_TEXT
};

static const struct {
    const char *key;
    int kind, setting;
} fields[CT_FENCE_NFIELDS] = {
#define CT_FENCE_FIELD(ID, KEY, KIND, SETTING, MEANING) {KEY, KIND, CT_SET_##SETTING},
#include "fence.def"
#undef CT_FENCE_FIELD
};

/* one record: its text (values NUL-ended in place) and each field's value */
struct rec {
    char text[CT_FENCE_MAX + 1];
    const char *val[CT_FENCE_NFIELDS];
};

static struct rec sealed;
static int found;
static char where[320];
static char why[700];

int ct_fence_sealed(void) { return found; }
const char *ct_fence_error(void) { return why; }
const char *ct_fence_path(void) { return where; }
const char *ct_fence_get(int f)
{
    return found && f >= 0 && f < CT_FENCE_NFIELDS ? sealed.val[f] : NULL;
}
const char *ct_fence_key(int f) { return f >= 0 && f < CT_FENCE_NFIELDS ? fields[f].key : ""; }
int ct_fence_setting(int f)
{
    return f >= 0 && f < CT_FENCE_NFIELDS ? fields[f].setting : CT_SET_NONE;
}

void ct_fence_quote(char *out, size_t n, const char *v)
{
    size_t len = v ? strlen(v) : 0, l = ct_strlcpy(out, "'", n);
    if (len <= 48) {
        l += ct_strlcpy(out + l, v ? v : "", n - l);
        ct_strlcpy(out + l, "'", n - l);
        return;
    }
    char head[41], num[24];
    ct_strlcpy(head, v, sizeof head);
    for (char *p = head; *p; p++) /* a value said in a line never breaks it */
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    ct_fmt_u64(num, len);
    l += ct_strlcpy(out + l, head, n - l);
    l += ct_strlcpy(out + l, "...' (", n - l);
    l += ct_strlcpy(out + l, num, n - l);
    ct_strlcpy(out + l, " bytes)", n - l);
}

/* ---- what a value must be ----------------------------------------------------------------- */

static int one_of(const char *v, const char *a, const char *b, const char *c)
{
    return strcmp(v, a) == 0 || strcmp(v, b) == 0 || (c && strcmp(v, c) == 0);
}

/* NULL when v is a value of kind, else what it must be */
static const char *bad_value(int kind, const char *v)
{
    uint64_t lim[CT_LEDGER_MAX_DEVICES], x;
    char err[160];
    switch (kind) {
    case CT_FK_GROUP:
        return ct_ledger_valid_group(v) ? NULL : "a group name (1 to 64 of A-Z a-z 0-9 _ . -)";
    case CT_FK_SHARE:
        return strlen(v) <= 8 && ct_ledger_valid_group(v)
                   ? NULL
                   : "a share name (1 to 8 of A-Z a-z 0-9 _ . -)";
    case CT_FK_BUDGET:
        return ct_ledger_parse_budget(v, lim, err, sizeof err) == CT_LEDGER_OK
                   ? NULL
                   : "a budget in bytes (N, or DEV=N items)";
    case CT_FK_AMOUNT:
        return ct_ledger_parse_size(v, &x, err, sizeof err) == CT_LEDGER_OK ? NULL : "bytes";
    case CT_FK_PATH:
        return v[0] == '/' && strlen(v) < 1000 ? NULL : "an absolute path";
    case CT_FK_FLAG:
        return one_of(v, "0", "1", NULL) ? NULL : "0 or 1";
    case CT_FK_EXCEED:
        return one_of(v, "fail", "warn", "abort") ? NULL : "fail, warn or abort";
    case CT_FK_ON_ERROR:
        return one_of(v, "refuse", "warn", NULL) ? NULL : "refuse or warn";
    case CT_FK_UID:
        for (const char *p = v; *p; p++)
            if (*p < '0' || *p > '9' || p - v >= 10)
                return "a uid (a number)";
        return NULL;
    default:
        return NULL;
    }
}

/* ---- the text ---------------------------------------------------------------------------- */

static void say_line(char *err, size_t n, int line, const char *what, const char *value)
{
    char num[24], q[80];
    ct_fmt_u64(num, (uint64_t)line);
    size_t l = ct_strlcpy(err, "line ", n);
    l += ct_strlcpy(err + l, num, n - l);
    l += ct_strlcpy(err + l, ": ", n - l);
    if (value) {
        ct_fence_quote(q, sizeof q, value);
        l += ct_strlcpy(err + l, q, n - l);
        l += ct_strlcpy(err + l, " ", n - l);
    }
    ct_strlcpy(err + l, what, n - l);
}

static int field_of(const char *key)
{
    for (int f = 0; f < CT_FENCE_NFIELDS; f++)
        if (strcmp(key, fields[f].key) == 0)
            return f;
    return -1;
}

/* one `key=value` line (NUL-ended in place) into r; 0 or -1 with err */
static int parse_line(struct rec *r, char *s, int line, char *err, size_t n)
{
    char *eq = strchr(s, '=');
    if (!eq) {
        say_line(err, n, line, "is no key=value line", s);
        return -1;
    }
    *eq = 0;
    const char *v = eq + 1;
    int f = field_of(s);
    if (f < 0) {
        say_line(err, n, line, "is no key of a fence record (version 1)", s);
        return -1;
    }
    if (r->val[f]) {
        say_line(err, n, line, "is given twice", s);
        return -1;
    }
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
            say_line(err, n, line, "holds a control character", s);
            return -1;
        }
    if (!*v) {
        say_line(err, n, line, "has no value", s);
        return -1;
    }
    const char *must = bad_value(fields[f].kind, v);
    if (must) { /* line 3: group='x y' is not a group name (...) */
        char what[200], q[80];
        ct_fence_quote(q, sizeof q, v);
        size_t l = ct_strlcpy(what, s, sizeof what);
        l += ct_strlcpy(what + l, "=", sizeof what - l);
        l += ct_strlcpy(what + l, q, sizeof what - l);
        l += ct_strlcpy(what + l, " is not ", sizeof what - l);
        ct_strlcpy(what + l, must, sizeof what - l);
        say_line(err, n, line, what, NULL);
        return -1;
    }
    r->val[f] = v;
    return 0;
}

/* what the fields say together; 0 or -1 with err */
static int check_fields(const struct rec *r, char *err, size_t n)
{
    const char *v[CT_FENCE_NFIELDS];
    memcpy(v, r->val, sizeof v);
    const char *e = NULL;
    if (!v[CT_FENCE_GROUP] == !v[CT_FENCE_LEDGER])
        e = "names neither a group nor a ledger, or both: give one";
    else if (!v[CT_FENCE_BUDGET])
        e = "has no budget";
    else if (v[CT_FENCE_GROUP] && !v[CT_FENCE_LEDGER_DIR])
        e = "names a group without its ledger-dir";
    else if (!v[CT_FENCE_SHARE] != !v[CT_FENCE_SHARE_BUDGET])
        e = "gives share and share-budget apart: both or neither";
    else if (v[CT_FENCE_LEDGER_DIR_MAKE] && !v[CT_FENCE_LEDGER_DIR])
        e = "gives ledger-dir-make without ledger-dir";
    if (e)
        ct_strlcpy(err, e, n);
    return e ? -1 : 0;
}

/* Parse r->text (len bytes) into r->val. 0, or -1 with err. */
static int parse(struct rec *r, size_t len, char *err, size_t n)
{
    memset(r->val, 0, sizeof r->val);
    char *s = r->text, *end = r->text + len;
    r->text[len] = 0;
    if (memchr(s, 0, len)) {
        ct_strlcpy(err, "holds a NUL byte", n);
        return -1;
    }
    if (len == 0 || end[-1] != '\n') {
        ct_strlcpy(err, len ? "is cut short (its last line has no line feed)" : "is empty", n);
        return -1;
    }
    char first[64], num[24];
    size_t ml = ct_strlcpy(first, CT_FENCE_MAGIC " ", sizeof first);
    ct_fmt_u64(num, CT_FENCE_VERSION);
    ct_strlcpy(first + ml, num, sizeof first - ml);
    for (int line = 1; s < end; line++) {
        char *nl = memchr(s, '\n', (size_t)(end - s));
        *nl = 0;
        if (line == 1 && strcmp(s, first) != 0) {
            if (strncmp(s, CT_FENCE_MAGIC " ", ml) == 0)
                say_line(err, n, 1,
                         "is a version this preload library does not read (it reads 1): "
                         "install one cudatrace version on the node",
                         s);
            else
                say_line(err, n, 1, "is not '" CT_FENCE_MAGIC " 1': not a fence record", s);
            return -1;
        }
        if (line > 1 && s[0] && s[0] != '#' && parse_line(r, s, line, err, n) != 0)
            return -1;
        s = nl + 1;
    }
    return check_fields(r, err, n);
}

/* ---- reading a record the workload cannot have written ------------------------------------- */

/* the uid the host's root has for this process: 0 in the initial user namespace (its uid_map
 * maps every uid to itself), else the overflow uid the kernel shows an unmapped owner as (a
 * rootless container's, a pod's with its own user namespace) or 0 where this namespace maps it */
/* the numbers of a text ("0 0 4294967295\n"), at most n: how many */
static int numbers(const char *s, uint64_t *out, int n)
{
    int k = 0;
    while (*s && k < n) {
        while (*s == ' ' || *s == '\n' || *s == '\t')
            s++;
        if (*s < '0' || *s > '9')
            break;
        uint64_t v = 0;
        while (*s >= '0' && *s <= '9')
            v = v * 10 + (uint64_t)(*s++ - '0');
        out[k++] = v;
    }
    return k;
}

static ssize_t read_small(const char *path, char *b, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? read(fd, b, n - 1) : -1;
    if (fd >= 0)
        close(fd);
    b[k > 0 ? k : 0] = 0;
    return k;
}

/* the uid besides 0 the host's root may show as to this process: none (0) in the initial user
 * namespace (its uid_map maps every uid to itself, and uid 65534 is nobody); elsewhere the
 * overflow uid the kernel shows an unmapped owner as (a rootless container's, a pod's with a
 * user namespace of its own) */
static unsigned overflow_uid(void)
{
    static unsigned uid = ~0u;
    if (uid == ~0u) {
        char b[256];
        uint64_t m[4];
        int initial = read_small("/proc/self/uid_map", b, sizeof b) > 0 && numbers(b, m, 4) == 3 &&
                      m[0] == 0 && m[1] == 0 && m[2] == 4294967295ull;
        uid = 0;
        if (!initial)
            uid = read_small("/proc/sys/kernel/overflowuid", b, sizeof b) > 0 &&
                          numbers(b, m, 1) == 1 && m[0]
                      ? (unsigned)m[0]
                      : 65534;
    }
    return uid;
}

/* root's: the host's root (uid 0), or, in a user namespace that does not map it, the overflow
 * uid the kernel shows it as */
static int roots(const struct stat *sb) { return sb->st_uid == 0 || sb->st_uid == overflow_uid(); }

/* Open path (absolute) one component at a time, never through a symbolic link. *safe: every
 * directory on the way is root's and writable by no one else (or sticky: no one else may replace
 * root's entries there), and so is the file. fd of the file, or -1 with errno. */
static int open_nofollow(const char *path, int *safe)
{
    char comp[256];
    int dfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC), fd = -1;
    struct stat sb;
    *safe = dfd >= 0 && fstat(dfd, &sb) == 0 && roots(&sb) && !(sb.st_mode & 022);
    for (const char *p = path; dfd >= 0;) {
        while (*p == '/')
            p++;
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == 0 || l >= sizeof comp) {
            errno = ENAMETOOLONG;
            break;
        }
        memcpy(comp, p, l);
        comp[l] = 0;
        int last = !e;
        int nfd = openat(dfd, comp,
                         (last ? O_RDONLY | O_NONBLOCK : O_RDONLY | O_DIRECTORY) | O_NOFOLLOW |
                             O_CLOEXEC);
        int saved = errno;
        close(dfd);
        dfd = -1;
        errno = saved;
        if (nfd < 0 || fstat(nfd, &sb) != 0) {
            if (nfd >= 0)
                close(nfd);
            break;
        }
        *safe &= roots(&sb) && (!(sb.st_mode & 022) || (!last && (sb.st_mode & S_ISVTX)));
        if (last) {
            fd = nfd;
            break;
        }
        dfd = nfd;
        p = e;
    }
    return fd;
}

static void set_why(const char *a, const char *b, const char *c)
{
    size_t l = ct_strlcpy(why, "the fence record ", sizeof why);
    l += ct_strlcpy(why + l, where, sizeof why - l);
    l += ct_strlcpy(why + l, a, sizeof why - l);
    if (b)
        l += ct_strlcpy(why + l, b, sizeof why - l);
    if (c)
        ct_strlcpy(why + l, c, sizeof why - l);
}

/* Read path into r, checking that the workload cannot have written it. 1 read (why set when it
 * cannot be used), 0 no such file. */
static int read_record(const char *path, struct rec *r, int quiet_missing)
{
    struct stat pre; /* one system call where there is none (every process that loads us) */
    if (quiet_missing && lstat(path, &pre) != 0 && (errno == ENOENT || errno == ENOTDIR))
        return 0;
    int safe = 0, fd = open_nofollow(path, &safe);
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR) && quiet_missing)
        return 0;
    ct_strlcpy(where, path, sizeof where);
    if (fd < 0) {
        set_why(errno == ELOOP ? " is reached through a symbolic link; refusing it"
                               : " cannot be read: ",
                errno == ELOOP ? NULL : strerror(errno), NULL);
        return 1;
    }
    struct stat sb;
    struct statvfs vb;
    int ro = fstatvfs(fd, &vb) == 0 && (vb.f_flag & ST_RDONLY);
    ssize_t len = -1;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        set_why(" is not a regular file; refusing it", NULL, NULL);
    else if (!roots(&sb) || (sb.st_mode & 022))
        set_why(" is not root's, or others may write it; refusing it", NULL, NULL);
    else if (!ro && !safe)
        set_why(" could be rewritten by the workload (it is on a writable mount, on a path that "
                "is not root's alone); refusing it",
                NULL, NULL);
    else if ((len = read(fd, r->text, CT_FENCE_MAX + 1)) < 0)
        set_why(" cannot be read: ", strerror(errno), NULL);
    else if (len > CT_FENCE_MAX)
        set_why(" is longer than 4096 bytes: not a fence record", NULL, NULL);
    close(fd);
    char err[400];
    if (!why[0] && parse(r, (size_t)len, err, sizeof err) != 0)
        set_why(err[0] == 'l' ? ", " : " ", err, NULL);
    return 1;
}

/* ---- Slurm: the job's record ------------------------------------------------------------------ */

static int digits(const char *s, size_t n)
{
    if (n == 0 || n > 20)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

/* the job of this process's cgroup: a component job_<id> of /proc/self/cgroup (Slurm's
 * task/cgroup: /slurm/uid_U/job_J/step_S on cgroup v1, .../job_J/step_S/user/task_T on v2) */
static int cgroup_job(char *id, size_t n)
{
    char b[8192];
    int fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? read(fd, b, sizeof b - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (k <= 0)
        return 0;
    b[k] = 0;
    for (char *p = strstr(b, "/job_"); p; p = strstr(p + 1, "/job_")) {
        char *s = p + 5;
        size_t l = strcspn(s, "/\n");
        if (digits(s, l) && l < n) {
            memcpy(id, s, l);
            id[l] = 0;
            return 1;
        }
    }
    return 0;
}

static uint64_t rec_limit(const struct rec *r)
{
    uint64_t lim[CT_LEDGER_MAX_DEVICES] = {0}, least = UINT64_MAX, s = 0;
    char err[160];
    if (r->val[CT_FENCE_SHARE_BUDGET] &&
        ct_ledger_parse_size(r->val[CT_FENCE_SHARE_BUDGET], &s, err, sizeof err) == CT_LEDGER_OK)
        return s;
    if (r->val[CT_FENCE_BUDGET])
        (void)ct_ledger_parse_budget(r->val[CT_FENCE_BUDGET], lim, err, sizeof err);
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        if (lim[d] && lim[d] < least)
            least = lim[d];
    return least;
}

static int uid_is(const struct rec *r, unsigned uid)
{
    const char *u = r->val[CT_FENCE_UID];
    char num[24];
    ct_fmt_u64(num, uid);
    return u && strcmp(u, num) == 0;
}

/* no job named: the strictest usable record of this real uid (a job can at most spend its own
 * user's shares); 1 when one is in sealed */
static int own_record(void)
{
    static struct rec cand;
    int dfd = open(CT_FENCE_JOBS_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return 0;
    }
    uint64_t best = UINT64_MAX;
    char best_path[320] = "", path[320];
    size_t base = ct_strlcpy(path, CT_FENCE_JOBS_DIR "/", sizeof path);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!digits(e->d_name, strlen(e->d_name)))
            continue;
        ct_strlcpy(path + base, e->d_name, sizeof path - base);
        why[0] = 0;
        if (read_record(path, &cand, 1) && !why[0] && uid_is(&cand, (unsigned)getuid())) {
            uint64_t lim = rec_limit(&cand);
            if (lim < best || (lim == best && strcmp(path, best_path) < 0)) {
                best = lim;
                ct_strlcpy(best_path, path, sizeof best_path);
            }
        }
    }
    closedir(d);
    why[0] = 0;
    return best_path[0] ? read_record(best_path, &sealed, 1) : 0;
}

static int slurm_record(void)
{
    struct stat sb;
    if (lstat(CT_FENCE_JOBS_DIR, &sb) != 0)
        return 0; /* no Slurm Prolog of cudatrace's on this node */
    char id[32], path[320];
    const char *env = ct_setting(CT_SET_SLURM_JOB_ID);
    int from_cgroup = cgroup_job(id, sizeof id);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && !(env && digits(env, strlen(env)) && strlen(env) < sizeof id))
            break;
        if (pass == 1)
            ct_strlcpy(id, env, sizeof id);
        else if (!from_cgroup)
            continue;
        size_t l = ct_strlcpy(path, CT_FENCE_JOBS_DIR "/", sizeof path);
        ct_strlcpy(path + l, id, sizeof path - l);
        if (!read_record(path, &sealed, 1))
            continue; /* no record for this job (no GPU it shares) */
        if (!why[0] && !uid_is(&sealed, (unsigned)getuid())) {
            char num[24];
            ct_fmt_u64(num, (unsigned)getuid());
            set_why(" is another user's job's (its uid is not this process's, ", num,
                    "); refusing it");
        }
        return 1;
    }
    return own_record();
}

/* ---- the environment beside a sealed record: stricter only ------------------------------- */

static const char *eff[CT_NSETTINGS]; /* the fence's values, sealed */
static char ignored[700];
static char tight_num[24];

const char *ct_fence_ignored(void) { return ignored; }

const char *ct_fence_value(int s)
{
    if (s < 0 || s >= CT_NSETTINGS)
        return NULL;
    return found ? eff[s] : ct_setting(s);
}

static void ignore(int s, const char *v, const char *why_not)
{
    char q[80];
    size_t l = strlen(ignored);
    if (l + 4 >= sizeof ignored)
        return;
    if (l)
        l += ct_strlcpy(ignored + l, ", ", sizeof ignored - l);
    l += ct_strlcpy(ignored + l, ct_setting_name(s), sizeof ignored - l);
    ct_fence_quote(q, sizeof q, v);
    l += ct_strlcpy(ignored + l, "=", sizeof ignored - l);
    l += ct_strlcpy(ignored + l, q, sizeof ignored - l);
    if (why_not) {
        l += ct_strlcpy(ignored + l, " (", sizeof ignored - l);
        l += ct_strlcpy(ignored + l, why_not, sizeof ignored - l);
        ct_strlcpy(ignored + l, ")", sizeof ignored - l);
    }
}

static int exceed_rank(const char *v)
{
    return !v ? -1 : !strcmp(v, "warn") ? 0 : !strcmp(v, "fail") ? 1 : !strcmp(v, "abort") ? 2 : -1;
}

/* an amount the environment asks (the least device's of a budget); 0 when not a size */
static uint64_t asked_amount(int s, const char *v)
{
    uint64_t lim[CT_LEDGER_MAX_DEVICES] = {0}, least = 0;
    char err[160];
    if (s == CT_SET_SHARE_BUDGET)
        return ct_ledger_parse_size(v, &least, err, sizeof err) == CT_LEDGER_OK ? least : 0;
    if (ct_ledger_parse_budget(v, lim, err, sizeof err) != CT_LEDGER_OK)
        return 0;
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        if (lim[d] && (!least || lim[d] < least))
            least = lim[d];
    return least;
}

/* one setting the environment gives beside the record: stricter is taken, else ignored;
 * *tight: the least amount asked below the fence (BUDGET, SHARE_BUDGET) */
static void weigh(int s, const char *ev, uint64_t *tight, int *tight_from)
{
    const char *rv = eff[s];
    int has_share = sealed.val[CT_FENCE_SHARE] != NULL;
    uint64_t a;
    switch (s) {
    case CT_SET_BUDGET:
    case CT_SET_SHARE_BUDGET:
        if (!(a = asked_amount(s, ev)))
            ignore(s, ev, "not a size");
        else if (a < *tight) {
            *tight = a;
            *tight_from = s;
        } else
            ignore(s, ev, "not below the fence");
        return;
    case CT_SET_SHARE:
    case CT_SET_SHARE_LABEL: /* they name a lowered share, only where the record has none */
        if (has_share)
            ignore(s, ev, NULL);
        return;
    case CT_SET_ON_EXCEED:
        if (exceed_rank(ev) > exceed_rank(rv))
            eff[s] = ev;
        else
            ignore(s, ev, NULL);
        return;
    case CT_SET_ON_FENCE_ERROR:
        if (!strcmp(ev, "refuse"))
            eff[s] = ev;
        else
            ignore(s, ev, NULL);
        return;
    case CT_SET_COUNT_HOST:
    case CT_SET_COUNT_CONTEXTS:
        if (!strcmp(ev, "1"))
            eff[s] = ev;
        else
            ignore(s, ev, NULL);
        return;
    default:
        ignore(s, ev, NULL);
    }
}

/* the bytes a share lowered by the environment must stay below to lower anything: the
 * record's share's, else its largest device budget */
static uint64_t fence_bound(void)
{
    uint64_t lim[CT_LEDGER_MAX_DEVICES] = {0}, most = 0, s = 0;
    char err[160];
    if (sealed.val[CT_FENCE_SHARE_BUDGET] &&
        ct_ledger_parse_size(sealed.val[CT_FENCE_SHARE_BUDGET], &s, err, sizeof err) ==
            CT_LEDGER_OK)
        return s;
    if (sealed.val[CT_FENCE_BUDGET])
        (void)ct_ledger_parse_budget(sealed.val[CT_FENCE_BUDGET], lim, err, sizeof err);
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        if (lim[d] > most)
            most = lim[d];
    return most ? most : UINT64_MAX;
}

static void resolve(void)
{
    for (int f = 0; f < CT_FENCE_NFIELDS; f++) {
        int s = fields[f].setting;
        if (s != CT_SET_NONE)
            eff[s] = sealed.val[f] ? sealed.val[f] : ct_setting_default(s);
    }
    uint64_t tight = fence_bound();
    int tight_from = CT_SET_NONE, has_share = sealed.val[CT_FENCE_SHARE] != NULL;
    for (int f = 0; f < CT_FENCE_NFIELDS; f++) {
        int s = fields[f].setting;
        const char *ev = s != CT_SET_NONE ? ct_setting_env(s) : NULL;
        if (ev && !(eff[s] && strcmp(ev, eff[s]) == 0))
            weigh(s, ev, &tight, &tight_from);
        else if (s != CT_SET_NONE && ct_setting_lost(s))
            ignore(s, "", "could not be kept");
    }
    if (tight_from == CT_SET_NONE) {
        static const int names[] = {CT_SET_SHARE, CT_SET_SHARE_LABEL};
        for (int i = 0; i < 2 && !has_share; i++)
            if (ct_setting_env(names[i]))
                ignore(names[i], ct_setting_env(names[i]), "no lower budget to name");
        return;
    }
    ct_fmt_u64(tight_num, tight);
    eff[CT_SET_SHARE_BUDGET] = tight_num;
    if (!has_share) { /* a share of the processes that lowered it so (their own name, or env) */
        const char *name = ct_setting_env(CT_SET_SHARE),
                   *label = ct_setting_env(CT_SET_SHARE_LABEL);
        eff[CT_SET_SHARE] = name ? name : "env";
        eff[CT_SET_SHARE_LABEL] = label ? label : name ? name : "the environment's lower budget";
    }
}

int ct_fence_load(void)
{
    why[0] = 0;
    ignored[0] = 0;
    found = read_record(CT_FENCE_PATH, &sealed, 1) || slurm_record();
    if (found && why[0])
        memset(sealed.val, 0, sizeof sealed.val); /* nothing of an unusable record is used */
    if (found)
        resolve();
    return found;
}
