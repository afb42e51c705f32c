/* budget.c - the budget inside the target (budget.h). The ledger itself (native/common/ledger.c)
 * is shared with the Python side; this file holds what only the shim needs: joining it, the
 * table that gives bytes back on free, and the virtualized memory figures. */
#include "budget.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fence.h"
#include "route.h"
#include "trace_format.h"
#include "util.h"

ct_ledger *ct_budget_ledger;
int ct_budget_pending;

/* ---- a budget from a sealed record or the environment alone (docs/budgets.md, "The sealed
 * fence", "Budgets without the launcher") --------------------------------------------------
 * A sealed fence record (fence.c) names the group, its ledger directory and budget, the share;
 * the environment may then only make it stricter (ct_fence_value says what holds). Without
 * one, whoever sets a process's environment (a user's own script, an image's entry point)
 * names a group: CUDATRACE_GROUP, with CUDATRACE_LEDGER_DIR (the ledger
 * directory it manages), CUDATRACE_BUDGET (resolved bytes: "N" or "DEV=N,..." in the grammar of
 * ct_ledger_parse_budget, no percentages: the integration resolves those) and optionally
 * CUDATRACE_SHARE, CUDATRACE_SHARE_BUDGET and CUDATRACE_SHARE_LABEL. The shim creates or joins
 * the group's ledger by itself at the process's first CUDA call that needs the budget, so a
 * shell or helper that never uses CUDA takes no member slot; the group rule (ct_ledger_adopt)
 * is the launcher's too. It takes no lock other processes could wait on (the launchers' group
 * lock is theirs alone). CUDATRACE_LEDGER (the launcher's) takes precedence. */
static int env_mode;          /* the budget comes from CUDATRACE_GROUP */
static ct_ledger *env_handle; /* opened, perhaps not joined in this process yet */
static pthread_mutex_t ensure_mu = PTHREAD_MUTEX_INITIALIZER;
static char share_label[96];
static uint64_t share_limit;                        /* CUDATRACE_SHARE_BUDGET, bytes */
static uint64_t want_limits[CT_LEDGER_MAX_DEVICES]; /* CUDATRACE_BUDGET, bytes */
static int want_budget;                             /* CUDATRACE_BUDGET was given */

const char *ct_budget_share_label(void) { return share_label; }
uint64_t ct_budget_share_limit(void) { return share_limit; }

static void (*join_report)(void);
void ct_budget_set_join_report(void (*fn)(void)) { join_report = fn; }

/* ---- when fencing cannot be set up (docs/budgets.md, the table) ----------------------------
 * Fencing was asked for (a CUDATRACE_GROUP, _BUDGET, _SHARE* or _LEDGER) and cannot be set up:
 * with CUDATRACE_ON_FENCE_ERROR=refuse (the default) the process's CUDA use that needs the
 * budget is refused (cuInit and counted allocations answer CUDA_ERROR_NOT_PERMITTED); with warn
 * it runs unfenced. Either way one line says why and how to fix it, at the first CUDA call that
 * needs the budget (a shell never says it), and the trace records it (INFO "fence"). */
static char fence_why[900];
static int fence_refuse = 1, fence_said, exempt;
static int sealed_said; /* the line of what the environment said of a sealed fence */
static void (*fence_report)(const char *verdict, const char *why);

void ct_budget_set_fence_report(void (*fn)(const char *, const char *)) { fence_report = fn; }

/* note why fencing cannot be set up (the first reason wins): what, detail, more (a clause that
 * goes on: ": all its slots are taken"), how to fix it (after "; ") */
static void fence_error3(const char *what, const char *detail, const char *more, const char *fix)
{
    if (fence_why[0])
        return;
    size_t l = ct_strlcpy(fence_why, what, sizeof fence_why);
    if (detail && *detail)
        l += ct_strlcpy(fence_why + l, detail, sizeof fence_why - l);
    if (more && *more)
        l += ct_strlcpy(fence_why + l, more, sizeof fence_why - l);
    if (fix && *fix) {
        l += ct_strlcpy(fence_why + l, "; ", sizeof fence_why - l);
        ct_strlcpy(fence_why + l, fix, sizeof fence_why - l);
    }
}

static void fence_error(const char *what, const char *detail, const char *fix)
{
    fence_error3(what, detail, NULL, fix);
}

/* what the environment said of a sealed fence and the fence holds against: one line, once, at
 * the first CUDA call that needs the budget (a shell never says it), also under QUIET */
static void sealed_say(void)
{
    if (sealed_said || exempt || !ct_fence_sealed() || !ct_fence_ignored()[0] ||
        ct_fence_error()[0])
        return;
    sealed_said = 1;
    char head[400] = "the sealed fence (";
    size_t l = strlen(head);
    l += ct_strlcpy(head + l, ct_fence_path(), sizeof head - l);
    ct_strlcpy(head + l, ") holds; this process's environment may only lower its budget: ignored ",
               sizeof head - l);
    ct_log(head, ct_fence_ignored(), NULL, NULL);
}

/* say it (once a process), record it, and refuse from now on or run unfenced */
static void fence_say(void)
{
    if (!fence_said && !exempt) {
        fence_said = 1;
        static const char *const verdict[2][2] = {
            {"; this process runs UNFENCED (CUDATRACE_ON_FENCE_ERROR=warn)",
             "; CUDA is refused in this process (CUDATRACE_ON_FENCE_ERROR=refuse; =warn runs it "
             "unfenced)"},
            {"; this process runs UNFENCED (the sealed fence's on-fence-error=warn)",
             "; CUDA is refused in this process (the sealed fence's on-fence-error=refuse)"}};
        ct_log("fencing cannot be set up: ", fence_why, verdict[ct_fence_sealed()][fence_refuse],
               NULL);
        if (fence_report)
            fence_report(fence_refuse ? "refused" : "unfenced", fence_why);
    }
    int next = exempt ? (ct_fence_sealed() ? CT_BUDGET_OBSERVING : 0) /* an observer stays one */
               : fence_refuse ? CT_BUDGET_REFUSING
                              : 0;
    __atomic_store_n(&ct_budget_pending, next, __ATOMIC_RELEASE);
}

int ct_budget_fence_failed(const char *what, const char *detail)
{
    pthread_mutex_lock(&ensure_mu);
    fence_error(what, detail, NULL);
    fence_say();
    pthread_mutex_unlock(&ensure_mu);
    return exempt ? ct_fence_sealed() : fence_refuse;
}

/* the settings that touch the fence and take one of a few values: another is a fence error
 * (CUDATRACE_ON_EXCEED=bogus used to be taken as fail without a word) */
static const struct {
    int id;
    const char *ok[3], *say;
} choices[] = {
    {CT_SET_ON_EXCEED, {"fail", "warn", "abort"}, "fail, warn or abort"},
    {CT_SET_ON_FENCE_ERROR, {"refuse", "warn", NULL}, "refuse or warn"},
    {CT_SET_LEDGER_DIR_MAKE, {"0", "1", NULL}, "0 or 1"},
    {CT_SET_COUNT_HOST, {"-1", "0", "1"}, "-1, 0 or 1"},
    {CT_SET_COUNT_CONTEXTS, {"0", "1", NULL}, "0 or 1"},
};
static const int fence_settings[] = {
    CT_SET_GROUP,           CT_SET_BUDGET,         CT_SET_SHARE,       CT_SET_SHARE_BUDGET,
    CT_SET_SHARE_LABEL,     CT_SET_LEDGER,         CT_SET_FENCE_ERROR, CT_SET_LEDGER_DIR,
    CT_SET_LEDGER_DIR_MAKE, CT_SET_ON_FENCE_ERROR, CT_SET_ON_EXCEED,   CT_SET_COUNT_HOST,
    CT_SET_COUNT_CONTEXTS};

/* name=value, the value quoted (shortened when long), then what */
static void fence_error_value(int id, const char *value, const char *what, const char *fix)
{
    char q[120], head[160];
    ct_fence_quote(q, sizeof q, value);
    size_t l = ct_strlcpy(head, ct_setting_name(id), sizeof head);
    ct_strlcpy(head + l, "=", sizeof head - l);
    fence_error3(head, q, what, fix);
}

/* the environment contract's settings that touch the fence: one that could not be kept, or a
 * value not among its choices, is a fence error (a sealed record's are checked by fence.c, and
 * the environment beside it only ever makes it stricter) */
static void env_values_check(void)
{
    for (size_t i = 0; i < sizeof fence_settings / sizeof *fence_settings; i++)
        if (ct_setting_lost(fence_settings[i]))
            fence_error(ct_setting_name(fence_settings[i]),
                        " could not be kept (the preload library found no memory for the "
                        "settings)",
                        NULL);
    for (size_t i = 0; i < sizeof choices / sizeof *choices; i++) {
        const char *v = ct_setting_env(choices[i].id);
        int ok = !v;
        for (int k = 0; k < 3 && !ok; k++)
            ok = choices[i].ok[k] && strcmp(v, choices[i].ok[k]) == 0;
        if (!ok) {
            char what[80] = " is not ";
            ct_strlcpy(what + 8, choices[i].say, sizeof what - 8);
            fence_error_value(choices[i].id, v, what, "give one of them");
        }
    }
}

/* what the record or the environment alone shows to be wrong (before any ledger is opened) */
static void env_check(void)
{
    static const int asked[] = {CT_SET_BUDGET, CT_SET_SHARE, CT_SET_SHARE_BUDGET,
                                CT_SET_SHARE_LABEL};
    const char *group = ct_fence_value(CT_SET_GROUP), *spec = ct_fence_value(CT_SET_BUDGET);
    const char *share = ct_fence_value(CT_SET_SHARE), *sspec = ct_fence_value(CT_SET_SHARE_BUDGET);
    const char *ledger = ct_fence_value(CT_SET_LEDGER);
    int named = (group && *group) || (ledger && *ledger);
    char err[300];
    if (ct_fence_sealed() && ct_fence_error()[0])
        fence_error(ct_fence_error(), NULL,
                    "the record is the integration's (docs/budgets.md, \"The sealed fence\"): "
                    "set it up again, as root");
    if (!ct_fence_sealed())
        env_values_check();
    if (ct_fence_value(CT_SET_FENCE_ERROR)) /* the integration could not set it up: says why */
        fence_error(ct_fence_value(CT_SET_FENCE_ERROR), NULL, NULL);
    for (size_t i = 0; i < sizeof asked / sizeof *asked && !named; i++)
        if (ct_fence_value(asked[i]))
            fence_error(ct_setting_name(asked[i]),
                        " is set, but no CUDATRACE_GROUP names the group",
                        "set CUDATRACE_GROUP (docs/budgets.md, \"Budgets without the launcher\")");
    if (ledger && *ledger && !ct_cfg.ledger_path[0])
        fence_error("CUDATRACE_LEDGER is longer than the preload library holds", NULL,
                    "use a shorter ledger directory");
    if (group && *group && !ledger && !ct_ledger_valid_group(group))
        fence_error_value(CT_SET_GROUP, group, " is not a group name",
                          "use 1 to 64 of A-Z a-z 0-9 _ . -, not starting with '.' or '-'");
    want_budget = spec != NULL;
    if (spec && ct_ledger_parse_budget(spec, want_limits, err, sizeof err) != CT_LEDGER_OK)
        fence_error("CUDATRACE_BUDGET: ", err, NULL);
    uint64_t slim[CT_LEDGER_MAX_DEVICES] = {0};
    int one = 1;
    if (sspec && ct_ledger_parse_budget(sspec, slim, err, sizeof err) != CT_LEDGER_OK)
        fence_error("CUDATRACE_SHARE_BUDGET: ", err, NULL);
    for (int d = 1; d < CT_LEDGER_MAX_DEVICES; d++)
        one &= slim[d] == slim[0] && slim[0];
    if ((share && !sspec) || (sspec && !share))
        fence_error("CUDATRACE_SHARE and CUDATRACE_SHARE_BUDGET go together", NULL,
                    "set both, or neither");
    else if (sspec && !one)
        fence_error_value(CT_SET_SHARE_BUDGET, sspec, " is not one amount for every device", NULL);
    else if (share && (strlen(share) > 8 || !ct_ledger_valid_group(share)))
        fence_error_value(CT_SET_SHARE, share, " is not a share name",
                          "use 1 to 8 of A-Z a-z 0-9 _ . -");
    share_limit = share ? slim[0] : 0;
    const char *label = ct_fence_value(CT_SET_SHARE_LABEL);
    if (share) /* "(share of slurm job 41)", or "(share of 41)" without a label */
        ct_strlcpy(share_label, label ? label : share, sizeof share_label);
}

static void env_init(void)
{
    const char *group = ct_fence_value(CT_SET_GROUP);
    env_mode = group && *group;
    if (env_mode || fence_why[0])
        __atomic_store_n(&ct_budget_pending, CT_BUDGET_PENDING, __ATOMIC_RELEASE);
}

/* Under the environment contract a shared ledger directory (sticky, writable by others) must be
 * one root made for ledgers: it holds root's CT_FENCE_SHARED_MARK. Any sticky root's directory
 * was taken (CUDATRACE_LEDGER_DIR=/tmp joined a group of one's own choosing). A sealed record
 * names its directory itself. 1 when dir may be used. */
static int shared_dir_marked(const char *dir)
{
    struct stat sb;
    char mark[1100];
    if (ct_fence_sealed() || lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) ||
        !(sb.st_mode & S_ISVTX) || !(sb.st_mode & 022))
        return 1; /* sealed, or not a shared directory (the ledger judges the rest) */
    size_t l = ct_strlcpy(mark, dir, sizeof mark);
    ct_strlcpy(mark + l, "/" CT_FENCE_SHARED_MARK, sizeof mark - l);
    if (lstat(mark, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == 0)
        return 1;
    fence_error3("ledger directory ", dir,
                 " is a shared one (sticky, writable by others) that root did not make for "
                 "ledgers (no root's " CT_FENCE_SHARED_MARK " in it)",
                 "use a directory of your own (mode 0700), or, as root, touch "
                 "DIR/" CT_FENCE_SHARED_MARK " (docs/budgets.md, \"Shared ledger directories\")");
    return 0;
}

/* the group's ledger path: a directory the integration named (a sealed record's ledger-dir,
 * CUDATRACE_LEDGER_DIR) is made here only where the integration says its parent is the group's
 * alone (ledger-dir-make=1: a pod's emptyDir); otherwise it is the integration's, made at boot:
 * one made now would be this user's alone */
static int env_path(const char *group, char *path, size_t n)
{
    char err[512], dir[1024];
    const char *named = ct_fence_value(CT_SET_LEDGER_DIR);
    const char *mk = ct_fence_value(CT_SET_LEDGER_DIR_MAKE);
    int make = !named || (mk && strcmp(mk, "1") == 0);
    /* the ledger's own rule for the path: in a shared directory, this uid's part of the group */
    int32_t rc = ct_ledger_group_path_at(named, group, path, n, make, err, sizeof err);
    if (rc == CT_LEDGER_ENOENT)
        fence_error(err, NULL,
                    "make it at boot (install -d -m 1777 -o root -g root DIR, or the tmpfiles.d "
                    "line of docs/slurm.md)");
    else if (rc != CT_LEDGER_OK)
        fence_error(err, NULL, "fix the directory (cudatrace doctor says why)");
    if (rc != CT_LEDGER_OK)
        return 0;
    ct_strlcpy(dir, path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir] = 0;
    return shared_dir_marked(dir);
}

/* Open (or create, with a budget) the environment's group ledger; NULL after fence_error. */
static ct_ledger *env_open(void)
{
    const char *group = ct_fence_value(CT_SET_GROUP), *share = ct_fence_value(CT_SET_SHARE);
    struct ct_ledger_config cfg;
    memset(&cfg, 0, sizeof cfg);
    memcpy(cfg.limit, want_limits, sizeof cfg.limit);
    cfg.on_exceed = ct_cfg.on_exceed == CT_EXCEED_WARN ? CT_LEDGER_WARN : CT_LEDGER_DENY;
    cfg.flags = ct_cfg.count_host > 0 ? CT_LEDGER_F_COUNT_HOST : 0;
    ct_strlcpy(cfg.group, group, sizeof cfg.group);
    char path[1024], err[512];
    if (!env_path(group, path, sizeof path))
        return NULL;
    /* a process that names no budget never makes a group: it would have none */
    ct_ledger *l = want_budget ? ct_ledger_create(path, &cfg, NULL, err, sizeof err)
                               : ct_ledger_open(path, 0, err, sizeof err);
    char what[200] = "group ";
    ct_strlcpy(what + 6, group, sizeof what - 6);
    if (!l && !want_budget && access(path, F_OK) != 0)
        fence_error(
            what, " does not exist, and this process names no budget",
            "set CUDATRACE_BUDGET (bytes), or start the process that makes the group first");
    else if (!l)
        fence_error("the group's ledger is unusable: ", err, NULL);
    if (l && share && ct_ledger_set_share(l, share, share_limit) != CT_LEDGER_OK) {
        fence_error_value(CT_SET_SHARE, share, " is not a share name", NULL);
        ct_ledger_close(l);
        l = NULL;
    }
    if (l)
        ct_strlcpy(ct_cfg.ledger_path, path, sizeof ct_cfg.ledger_path);
    return l;
}

/* As a member of l: the group rule for this process's budget (ct_ledger_adopt). 1 when the
 * group's budget is the one asked for (or any, when none is asked); else 0 after fence_error. */
static int adopt(ct_ledger *l)
{
    char err[700];
    int32_t replaced = 0;
    int32_t rc = ct_ledger_adopt(l, want_budget ? want_limits : NULL, &replaced, err, sizeof err);
    if (rc == CT_LEDGER_OK && replaced)
        ct_log("note: ", err, NULL, NULL); /* it changes what the group may use: always said */
    if (rc == CT_LEDGER_ECONFLICT)
        fence_error(err, NULL,
                    "give the group's budget (or none, with CUDATRACE_LEDGER), or wait until its "
                    "members end");
    else if (rc == CT_LEDGER_ENOBUDGET)
        fence_error(err, NULL, "set CUDATRACE_BUDGET (bytes)");
    else if (rc != CT_LEDGER_OK)
        fence_error("the group's budget cannot be checked: ", err[0] ? err : ct_ledger_strerror(rc),
                    NULL);
    return rc == CT_LEDGER_OK;
}

/* cuInit: the group rule as the group is now (the join decides): a budget that differs from
 * a live group's, or none for a group without one, refuses CUDA before a context is made */
static void precheck(ct_ledger *l)
{
    char err[700];
    int32_t rc = ct_ledger_check_budget(l, want_budget ? want_limits : NULL, err, sizeof err);
    if (rc == CT_LEDGER_ECONFLICT)
        fence_error(err, NULL,
                    "give the group's budget (or none, with CUDATRACE_LEDGER), or wait until its "
                    "members end");
    else if (rc == CT_LEDGER_ENOBUDGET)
        fence_error(err, NULL, "set CUDATRACE_BUDGET (bytes)");
}

/* join l (and check its budget); 0 after fence_error */
static int join_checked(ct_ledger *l)
{
    int32_t slot = ct_ledger_join(l, getpid(), 0);
    if (slot == CT_LEDGER_EDAMAGED) {
        fence_error(ct_ledger_damage(l), NULL, NULL);
        return 0;
    }
    if (slot < 0) {
        fence_error3("cannot join the budget ledger ", ct_cfg.ledger_path,
                     ": all its member slots are taken (256 processes)",
                     "end some, or use another group");
        return 0;
    }
    if (adopt(l))
        return 1;
    ct_ledger_leave(l);
    return 0;
}

static ct_ledger *env_join(void)
{
    if (!env_handle)
        env_handle = env_open();
    return env_handle && join_checked(env_handle) ? env_handle : NULL;
}

/* an observer inside a sealed fence allocates: said once (its allocations are refused) */
static void observer_say(void)
{
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL))
        ct_log("this process declared itself cudatrace's own (cudatrace_exempt) inside the sealed "
               "fence of ",
               ct_fence_path(),
               ": it may observe, not allocate device memory; its allocations are refused", NULL);
}

ct_ledger *ct_budget_ensure(void)
{
    ct_ledger *l = __atomic_load_n(&ct_budget_ledger, __ATOMIC_ACQUIRE);
    if (l)
        return l;
    int pending = __atomic_load_n(&ct_budget_pending, __ATOMIC_ACQUIRE);
    if (pending != CT_BUDGET_PENDING) {
        if (pending == CT_BUDGET_OBSERVING)
            observer_say();
        return NULL;
    }
    pthread_mutex_lock(&ensure_mu); /* this process's threads only */
    l = ct_budget_ledger;
    sealed_say();
    if (!l && ct_budget_pending == CT_BUDGET_PENDING) {
        if (!fence_why[0] && env_mode)
            l = env_join();
        if (l) {
            __atomic_store_n(&ct_budget_ledger, l, __ATOMIC_RELEASE);
            __atomic_store_n(&ct_budget_pending, 0, __ATOMIC_RELEASE);
            if (join_report)
                join_report(); /* the trace says which budget (its preamble may be written) */
        } else {
            fence_say();
        }
    }
    pthread_mutex_unlock(&ensure_mu);
    return l;
}

int ct_budget_cuinit(void)
{
    if (!sealed_said && ct_fence_sealed()) {
        pthread_mutex_lock(&ensure_mu);
        sealed_say();
        pthread_mutex_unlock(&ensure_mu);
    }
    if (__atomic_load_n(&ct_budget_pending, __ATOMIC_ACQUIRE) == CT_BUDGET_PENDING) {
        pthread_mutex_lock(&ensure_mu);
        if (ct_budget_pending == CT_BUDGET_PENDING && !ct_budget_ledger) {
            if (!fence_why[0] && env_mode && !env_handle)
                env_handle = env_open(); /* joined at the first allocation */
            if (!fence_why[0] && env_handle)
                precheck(env_handle);
            if (fence_why[0])
                fence_say();
        }
        pthread_mutex_unlock(&ensure_mu);
    }
    return __atomic_load_n(&ct_budget_pending, __ATOMIC_ACQUIRE) != CT_BUDGET_REFUSING;
}

void ct_budget_join(void)
{
    if (ct_budget_ledger && ct_ledger_join(ct_budget_ledger, getpid(), 0) < 0) {
        fence_error3("cannot join the budget ledger ", ct_cfg.ledger_path,
                     ": all its member slots are taken (256 processes)",
                     "end some, or use another group");
        ct_budget_ledger = NULL; /* the slot is the parent's */
        ct_budget_pending = CT_BUDGET_PENDING;
    }
}

/* a sealed record's settings where the environment put them at load (util.c: ct_config_load) */
static void sealed_config(void)
{
    const char *oe = ct_fence_value(CT_SET_ON_EXCEED), *lp = ct_fence_value(CT_SET_LEDGER);
    const char *ch = ct_fence_value(CT_SET_COUNT_HOST);
    ct_cfg.on_exceed = !oe || !strcmp(oe, "fail") ? CT_EXCEED_FAIL
                       : !strcmp(oe, "warn")      ? CT_EXCEED_WARN
                                                  : CT_EXCEED_ABORT;
    ct_cfg.count_host = ch && !strcmp(ch, "1");
    ct_strlcpy(ct_cfg.ledger_path, lp ? lp : "", sizeof ct_cfg.ledger_path);
}

/* the directory of a ledger file (a launcher's): shared_dir_marked */
static int ledger_dir_marked(const char *path)
{
    char dir[1024];
    ct_strlcpy(dir, path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return 1;
    slash[slash == dir] = 0;
    return shared_dir_marked(dir);
}

/* what the ledger says while the process runs (ledger.h ct_ledger_set_report): its own file
 * damaged under it refuses its CUDA as a fence error does (one line); a note about another
 * user's part of its group (unreadable: counted as its last figure) is said once */
static void ledger_report(int32_t fatal, const char *msg)
{
    if (fatal)
        ct_budget_fence_failed(msg, NULL);
    else
        ct_log(msg, NULL, NULL, NULL);
}

void ct_budget_init(void)
{
    ct_ledger_set_report(ledger_report);
    if (ct_fence_sealed())
        sealed_config();
    const char *fe = ct_fence_value(CT_SET_ON_FENCE_ERROR);
    fence_refuse = !(fe && strcmp(fe, "warn") == 0);
    env_check();
    if (!ct_cfg.ledger_path[0] || fence_why[0] || !ledger_dir_marked(ct_cfg.ledger_path)) {
        env_init();
        return;
    }
    char err[512];
    ct_ledger *l = ct_ledger_open(ct_cfg.ledger_path, 0, err, sizeof err);
    const char *share = ct_fence_value(CT_SET_SHARE);
    if (!l)
        fence_error("the budget ledger is unusable: ", err, NULL);
    else if (share && ct_ledger_set_share(l, share, share_limit) != CT_LEDGER_OK)
        fence_error_value(CT_SET_SHARE, share, " is not a share name", NULL);
    else if (join_checked(l))
        ct_budget_ledger = l;
    if (!ct_budget_ledger) {
        if (l)
            ct_ledger_close(l);
        env_init(); /* says it at the first CUDA call that needs the budget */
        ct_budget_pending = CT_BUDGET_PENDING;
    }
}

void ct_budget_leave(void)
{
    if (ct_budget_ledger)
        ct_ledger_leave(ct_budget_ledger);
}

/* cudatrace's own processes (the launcher, status, the TaskProlog) observe: a preload library
 * loaded into them from the job's environment never makes them members, never answers their
 * memory queries with the budget, never refuses their cuInit (cudatrace/cli.py calls it).
 * Any program can call it (it is exported): inside a sealed fence it only observes, and its
 * counted allocations are refused, so calling it never lifts a fence an operator sealed. */
CT_EXPORT void cudatrace_exempt(void)
{
    pthread_mutex_lock(&ensure_mu);
    exempt = 1;
    if (ct_budget_ledger)
        ct_ledger_leave(ct_budget_ledger); /* the handle stays: other threads may read it */
    __atomic_store_n(&ct_budget_ledger, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&ct_budget_pending, ct_fence_sealed() ? CT_BUDGET_OBSERVING : 0,
                     __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ensure_mu);
}

static int device_integrated(int dev)
{
    static int8_t known[CT_LEDGER_MAX_DEVICES]; /* 0 unknown, 1 no, 2 yes */
    if (dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return 0;
    if (!known[dev]) {
        CUresult (*attr)(int *, int, CUdevice) =
            (CUresult(*)(int *, int, CUdevice))ct_driver_sym("cuDeviceGetAttribute");
        int v = 0;
        if (attr && attr(&v, CU_DEVICE_ATTRIBUTE_INTEGRATED, dev) == CUDA_SUCCESS)
            known[dev] = v ? 2 : 1;
        else
            return 0;
    }
    return known[dev] == 2;
}

int ct_budget_counted(int kind, int dev)
{
    switch (kind) {
    case CT_KIND_HOST:
        return ct_cfg.count_host > 0 || (ct_cfg.count_host == 0 && device_integrated(dev));
    case CT_KIND_IMPORT:
    case CT_KIND_NONE:
        return 0;
    default:
        return 1;
    }
}

/* live counted allocations of this process: (space, address) -> bytes, device.
 * Only used with a budget, to give bytes back on free. */
#define ATAB_BITS 20
#define ATAB_SIZE (1u << ATAB_BITS)
struct aent {
    uint64_t addr; /* 0 empty, 1 tombstone */
    uint64_t size;
    uint64_t handle; /* CT_SPACE_MAPPING: the VMM handle mapped there */
    int32_t dev;
    int32_t space;
    int32_t maps;     /* VMM handle: live mappings */
    int32_t released; /* VMM handle: cuMemRelease seen, memory stays until the last unmap */
};
/* a pseudo address space for VMM mappings (address -> handle), never written to traces */
#define CT_SPACE_MAPPING 100
static struct aent *atab;
static uint32_t atab_used;
static pthread_mutex_t atab_mu = PTHREAD_MUTEX_INITIALIZER;

static uint32_t ahash(uint64_t a, int space)
{
    uint64_t h = (a ^ ((uint64_t)space << 56)) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> (64 - ATAB_BITS));
}

/* with atab_mu held: the entry of (addr, space), or NULL */
static struct aent *atab_find(uint64_t addr, int space)
{
    if (!atab || addr < 2)
        return NULL;
    uint32_t i = ahash(addr, space);
    while (atab[i].addr != 0) {
        if (atab[i].addr == addr && atab[i].space == space)
            return &atab[i];
        i = (i + 1) & (ATAB_SIZE - 1);
    }
    return NULL;
}

static int atab_insert(uint64_t addr, int space, uint64_t size, int dev, uint64_t handle)
{
    if (addr < 2)
        return 0;
    pthread_mutex_lock(&atab_mu);
    if (!atab) {
        void *m = mmap(NULL, sizeof(struct aent) * ATAB_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        atab = m == MAP_FAILED ? NULL : m;
    }
    int ok = 0;
    if (atab && atab_used < ATAB_SIZE - ATAB_SIZE / 8) {
        uint32_t i = ahash(addr, space);
        while (atab[i].addr > 1)
            i = (i + 1) & (ATAB_SIZE - 1);
        if (atab[i].addr == 0)
            atab_used++;
        atab[i] = (struct aent){addr, size, handle, dev, space, 0, 0};
        ok = 1;
    }
    pthread_mutex_unlock(&atab_mu);
    return ok;
}

/* A free: the bytes to give back now (0 if none, or if a VMM handle is still mapped). */
int ct_budget_untrack(uint64_t addr, int space, uint64_t *size, int *dev)
{
    int ok = 0;
    pthread_mutex_lock(&atab_mu);
    struct aent *e = atab_find(addr, space);
    if (e) {
        *size = e->size;
        *dev = e->dev;
        if (space == CT_SPACE_VMM && e->maps > 0) {
            e->released = 1; /* physical memory lives until its last mapping goes */
        } else {
            e->addr = 1;
            ok = 1;
        }
    }
    pthread_mutex_unlock(&atab_mu);
    return ok;
}

void ct_budget_map(uint64_t ptr, uint64_t size, uint64_t handle)
{
    pthread_mutex_lock(&atab_mu);
    struct aent *h = atab_find(handle, CT_SPACE_VMM);
    if (h)
        h->maps++;
    pthread_mutex_unlock(&atab_mu);
    if (h)
        atab_insert(ptr, CT_SPACE_MAPPING, size, 0, handle);
}

/* cuMemUnmap(ptr, size) may cover several mappings; handles released earlier give their bytes
 * back when their last mapping goes. */
void ct_budget_unmap(uint64_t ptr, uint64_t size)
{
    uint64_t cur = ptr, end = ptr + size;
    for (int guard = 0; cur < end && guard < 4096; guard++) {
        uint64_t give = 0, msize = 0;
        int dev = 0;
        pthread_mutex_lock(&atab_mu);
        struct aent *m = atab_find(cur, CT_SPACE_MAPPING);
        if (m) {
            msize = m->size;
            struct aent *h = atab_find(m->handle, CT_SPACE_VMM);
            m->addr = 1;
            if (h && --h->maps <= 0 && h->released) {
                give = h->size;
                dev = h->dev;
                h->addr = 1;
            }
        }
        pthread_mutex_unlock(&atab_mu);
        if (!m || !msize)
            break;
        if (give)
            ct_ledger_release(ct_budget_ledger, dev, give);
        cur += msize;
    }
}

int ct_budget_track(uint64_t addr, int space, uint64_t size, int dev)
{
    return atab_insert(addr, space, size, dev, 0);
}

int ct_budget_virtualize(int dev, uint64_t *total, uint64_t *free_, int clamp)
{
    if (!ct_cfg.virtualize || dev < 0)
        return 0;
    ct_ledger *l = ct_budget_ensure(); /* sizing code asks first: a CUDA call that needs it */
    if (!l)
        return 0;
    uint64_t limit = ct_ledger_limit(l, dev);
    uint64_t in_use = ct_ledger_in_use(l, dev);
    uint64_t vt = *total;
    if (limit && (!vt || limit < vt))
        vt = limit;
    uint64_t vf = in_use < vt ? vt - in_use : 0;
    uint64_t slimit = 0, sused = 0;
    if ((slimit = share_limit) != 0) {
        sused = ct_ledger_share_in_use(l, dev);
        if (!vt || slimit < vt)
            vt = slimit;
        uint64_t sf = sused < slimit ? slimit - sused : 0;
        if (sf < vf || !limit)
            vf = sf;
    }
    if (!limit && !slimit)
        return 0;
    if (vf > vt)
        vf = vt;
    if (clamp && vf > *free_)
        vf = *free_;
    *total = vt;
    *free_ = vf;
    return 1;
}

void ct_budget_atfork_prepare(void)
{
    pthread_mutex_lock(&ensure_mu);
    pthread_mutex_lock(&atab_mu);
}
void ct_budget_atfork_parent(void)
{
    pthread_mutex_unlock(&atab_mu);
    pthread_mutex_unlock(&ensure_mu);
}

static void ctx_atfork_child(void);

void ct_budget_atfork_child(void)
{
    ctx_atfork_child();
    pthread_mutex_init(&atab_mu, NULL);
    pthread_mutex_init(&ensure_mu, NULL);
    if (atab) {
        munmap(atab, sizeof(struct aent) * ATAB_SIZE); /* the parent's allocations, not ours */
        atab = NULL;
        atab_used = 0;
    }
    if (exempt)
        return;
    if (env_mode) {
        /* the child joins at its own first CUDA call, if it makes one (ct_budget_ensure) */
        if (ct_budget_ledger)
            env_handle = ct_budget_ledger;
        ct_budget_ledger = NULL;
        if (ct_budget_pending != CT_BUDGET_REFUSING && (env_handle || ct_budget_pending))
            ct_budget_pending = CT_BUDGET_PENDING;
        return;
    }
    ct_budget_join();
}

/* Membership lost: another member judged us dead (the program closed the descriptor that
 * holds our liveness lock, so the lock test said so) and freed our slot with its bytes. Join
 * again and count anew what this process still holds (its table of live allocations; the
 * context is measured again), so nothing it holds goes uncounted. 1 if a member again. */
static pthread_mutex_t rejoin_mu = PTHREAD_MUTEX_INITIALIZER;
static void ctx_forget(void);

int ct_budget_rejoin(void)
{
    ct_ledger *l = ct_budget_ledger;
    if (!l)
        return 0;
    pthread_mutex_lock(&rejoin_mu);
    int ok = ct_ledger_reserve(l, 0, 0, NULL, NULL) == CT_LEDGER_GRANTED; /* another thread? */
    if (!ok && ct_ledger_join(l, getpid(), 0) >= 0) {
        uint64_t per[CT_LEDGER_MAX_DEVICES] = {0};
        pthread_mutex_lock(&atab_mu);
        for (uint32_t i = 0; atab && i < ATAB_SIZE; i++)
            if (atab[i].addr > 1 && atab[i].space != CT_SPACE_MAPPING && atab[i].dev >= 0 &&
                atab[i].dev < CT_LEDGER_MAX_DEVICES)
                per[atab[i].dev] += atab[i].size;
        pthread_mutex_unlock(&atab_mu);
        for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
            if (per[d])
                ct_ledger_force(l, d, per[d]);
        ctx_forget();
        ct_log("budget membership was lost (the program closed cudatrace's ledger descriptor?); "
               "joined again and counted what this process holds",
               NULL, NULL, NULL);
        ok = 1;
    }
    pthread_mutex_unlock(&rejoin_mu);
    return ok;
}

/* ---- CUDA contexts -------------------------------------------------------------------------
 * A context and the modules loaded into it hold device memory that no hooked call allocates
 * (~0.5 GiB a process on an H200). With a budget the shim counts it: at the first counted
 * allocation on a device (before and after it, as the context may be made by that very call)
 * and then at most once a second at allocations, it reads NVML's figure for this process
 * (nvmlDeviceGetComputeRunningProcesses_v3) and counts what of it is not counted allocations
 * as the member's context (ct_ledger_set_context: held, never denied, shown apart). No lock is
 * taken: one CAS picks the thread that measures. A reading is exact only when no budgeted call
 * of the process is between its ledger change and its driver call's end (ct_budget_inflight);
 * else it can only read low, and a low reading never lowers the figure. Until a device's first
 * figure, the process's other allocations wait (1 s at most, NVML's start-up included): the
 * measuring thread lets the calls under way end first, and when NVML does not list the process
 * yet (the context is made by the allocation about to be made) that allocation measures again
 * when it returns. So the budget starts from the context, not the context less the allocations
 * then in flight, nor from nothing while allocations fill it (as while NVML starts, which takes
 * a while): a correction upward with the allocations at the limit puts the ledger above the
 * budget (seen on an H200: 1.19 and 1.4-1.5 GiB under 1 GiB). The hold lasts as long as the
 * first measurement does (NVML's start-up, the calls under way: 10 s at most, for an NVML that
 * hangs), then 1 s more while the allocation that may make the context is made; the waiting
 * threads sleep, so that on a loaded machine the measuring thread and the calls it waits for
 * get the CPU (a 1 s hold spent yielding let a budget of 40 MiB reach 48 with 64 threads on
 * 2 busy CPUs). Where NVML lists no figure for
 * this pid (integrated devices, a container that does not share the host's pid namespace),
 * nothing is counted and `cudatrace status` shows no context. CUDATRACE_COUNT_CONTEXTS=0 turns
 * it off. */
#define CTX_PERIOD_NS 1000000000ull
#define CTX_TRIES 4
#define CTX_HOLD_NS 1000000000ull     /* after a first measurement that found no figure yet */
#define CTX_MEASURE_NS 10000000000ull /* while the first measurement runs, at most */
#define CTX_FIRST_TRIES 16 /* more readings of the first figure, while calls disturb it */
#define NVML_ERROR_INSUFFICIENT_SIZE 7
static uint64_t ctx_next_ns[CT_LEDGER_MAX_DEVICES];    /* when the next measurement is due */
static uint32_t ctx_misses[CT_LEDGER_MAX_DEVICES];     /* measurements that found no figure */
static uint64_t ctx_counted[CT_LEDGER_MAX_DEVICES];    /* what this process counts now */
static uint32_t ctx_known[CT_LEDGER_MAX_DEVICES];      /* 1: measured once (atomic) */
static uint64_t ctx_hold_until[CT_LEDGER_MAX_DEVICES]; /* before the first figure: held to */
static int ctx_nvml_index[CT_LEDGER_MAX_DEVICES];      /* CUDA ordinal -> NVML index, -1 none */
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static nvmlReturn_t (*ctx_get_handle)(unsigned, nvmlDevice_t *);
static nvmlReturn_t (*ctx_procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *);
static void (*ctx_report)(int dev, uint64_t bytes);

void ct_budget_set_context_report(void (*fn)(int dev, uint64_t bytes)) { ctx_report = fn; }

static void ctx_init(void)
{
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++)
        ctx_nvml_index[d] = d;
    const char *v = ct_setting(CT_SET_CUDA_VISIBLE_DEVICES); /* ordinals name NVML indices */
    if (v) {
        int d = 0;
        for (const char *p = v; d < CT_LEDGER_MAX_DEVICES; d++) {
            if (*p < '0' || *p > '9')
                break; /* a UUID or MIG name, or the end: no mapping from here on */
            int idx = 0;
            while (*p >= '0' && *p <= '9')
                idx = idx * 10 + (*p++ - '0');
            ctx_nvml_index[d] = idx;
            if (*p != ',')
                break;
            p++;
        }
        for (int k = d + 1; k < CT_LEDGER_MAX_DEVICES; k++)
            ctx_nvml_index[k] = -1;
        if (!*v)
            ctx_nvml_index[0] = -1;
    }
    const char *cc = ct_fence_value(CT_SET_COUNT_CONTEXTS);
    if (cc && strcmp(cc, "0") == 0)
        return;
    ct_dlsym_fn ds = ct_real_dlsym();
    void *h = ds ? dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h)
        return;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))ds(h, "nvmlInit_v2");
    ctx_get_handle =
        (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))ds(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v2_t *))ds(
            h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (init && ctx_get_handle && procs && init() == NVML_SUCCESS)
        __atomic_store_n(&ctx_procs, procs, __ATOMIC_RELEASE);
}

/* NVML's figure for this process on dev: 1 found; 0 not listed (no context there yet); -1 NVML
 * cannot say (an error: integrated devices answer NOT_SUPPORTED; or the figure is N/A, as in
 * some containers) */
static int ctx_nvml_used(int dev, uint64_t *used)
{
    int idx = ctx_nvml_index[dev];
    nvmlDevice_t h;
    if (idx < 0 || ctx_get_handle((unsigned)idx, &h) != NVML_SUCCESS)
        return -1;
    nvmlProcessInfo_v2_t info[128];
    unsigned n = 128;
    if (ctx_procs(h, &n, info) != NVML_SUCCESS)
        return -1;
    unsigned me = (unsigned)getpid();
    for (unsigned i = 0; i < n && i < 128; i++)
        if (info[i].pid == me) {
            if (info[i].usedGpuMemory == ~0ull)
                return -1;
            *used = info[i].usedGpuMemory;
            return 1;
        }
    return 0;
}

/* Budgeted calls between their ledger change and the end of their driver call: an allocation
 * reserved but not made yet, a free the device may have taken back that the ledger still holds;
 * and the bytes allocations have reserved so far (budget.h) */
uint32_t ct_budget_inflight;
uint64_t ct_budget_reserved;

/* NVML's figure for this process on dev less the allocations the ledger holds (mine: the
 * context counted now, part of what the ledger holds): 1 with *ctx, else ctx_nvml_used's 0 or
 * -1. *exact when no budgeted call was under way or begun across the reading. Else *ctx is a
 * lower bound: calls under way only make it read low (an allocation reserved and not made, a
 * free made and not given back), and what allocations reserved during the reading is taken
 * off (one made and freed again within it is in NVML's figure and in neither ledger read). */
static int ctx_measure(int dev, uint64_t mine, uint64_t *ctx, int *exact)
{
    uint32_t b0 = __atomic_load_n(&ct_budget_inflight, __ATOMIC_ACQUIRE);
    uint64_t r0 = __atomic_load_n(&ct_budget_reserved, __ATOMIC_ACQUIRE);
    uint64_t h0 = ct_ledger_held(ct_budget_ledger, dev), used = 0;
    int found = ctx_nvml_used(dev, &used);
    if (found != 1)
        return found;
    uint64_t h1 = ct_ledger_held(ct_budget_ledger, dev);
    uint64_t r1 = __atomic_load_n(&ct_budget_reserved, __ATOMIC_ACQUIRE);
    uint32_t b1 = __atomic_load_n(&ct_budget_inflight, __ATOMIC_ACQUIRE);
    uint64_t held = h0 > h1 ? h0 : h1;
    uint64_t allocs = (held > mine ? held - mine : 0) + (r1 - r0);
    *ctx = ((used > allocs ? used - allocs : 0) + 1023) & ~1023ull; /* the ledger keeps KiB */
    *exact = !b0 && !b1 && r0 == r1 && h0 == h1;
    return 1;
}

/* no figure yet for dev, and NVML may still give one (it has not failed CTX_TRIES times) */
static inline int ctx_unknown(int dev)
{
    return !__atomic_load_n(&ctx_known[dev], __ATOMIC_ACQUIRE) &&
           __atomic_load_n(&ctx_misses[dev], __ATOMIC_RELAXED) < CTX_TRIES;
}

/* one wait of a thread held for the first figure: a few yields, then sleeps of 100 us, which
 * leave the CPU to the thread that measures and to the calls it waits for */
static void ctx_pause(unsigned *waits)
{
    if ((*waits)++ < 16) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
}

/* before dev's first figure: an allocation waits for it, until ctx_hold_until. Until 0 while
 * the figure is unknown: the thread that claimed the measurement has not set it yet (a thread
 * preempted there let 16 others allocate past the hold, and 40 MiB reach 48) */
static void ctx_hold(int dev)
{
    unsigned waits = 0;
    uint64_t limit = ct_now_ns() + CTX_MEASURE_NS;
    while (ctx_unknown(dev)) {
        uint64_t until = __atomic_load_n(&ctx_hold_until[dev], __ATOMIC_ACQUIRE), now = ct_now_ns();
        if ((until && now >= until) || now >= limit)
            return;
        ctx_pause(&waits);
    }
}

/* the measuring thread, the first time: let the budgeted calls under way end */
static void ctx_quiet(int dev)
{
    unsigned waits = 0;
    while (__atomic_load_n(&ct_budget_inflight, __ATOMIC_ACQUIRE) &&
           ct_now_ns() < __atomic_load_n(&ctx_hold_until[dev], __ATOMIC_ACQUIRE))
        ctx_pause(&waits);
}

/* a measurement found no figure: when the process is not listed yet, again at the next
 * allocation (which may be the one that makes the context), until CTX_TRIES; when NVML cannot
 * say (never: nothing is counted), and after CTX_TRIES, no more holding */
static void ctx_missed(int dev, int never)
{
    if (never)
        __atomic_store_n(&ctx_misses[dev], CTX_TRIES, __ATOMIC_RELAXED);
    if (__atomic_add_fetch(&ctx_misses[dev], 1, __ATOMIC_RELAXED) < CTX_TRIES) {
        __atomic_store_n(&ctx_next_ns[dev], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ctx_hold_until[dev], ct_now_ns() + CTX_HOLD_NS, __ATOMIC_RELEASE);
    } else
        __atomic_store_n(&ctx_hold_until[dev], 0, __ATOMIC_RELEASE);
}

static void ctx_take(int dev, int first);

void ct_budget_context(int dev)
{
    if (!ct_budget_ledger || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES)
        return;
    uint64_t now = ct_now_ns(), due = __atomic_load_n(&ctx_next_ns[dev], __ATOMIC_RELAXED);
    if (now < due || !__atomic_compare_exchange_n(&ctx_next_ns[dev], &due, now + CTX_PERIOD_NS, 0,
                                                  __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        ctx_hold(dev); /* another thread measures (or has): the first time, wait for it */
        return;
    }
    int first = ctx_unknown(dev);
    if (!first) {
        ctx_take(dev, 0);
        return;
    }
    /* hold new allocations back while it measures (NVML's start-up included), and frees */
    __atomic_store_n(&ctx_hold_until[dev], now + CTX_MEASURE_NS, __ATOMIC_RELEASE);
    __atomic_add_fetch(&ct_budget_ctx_first, 1, __ATOMIC_ACQ_REL);
    ctx_take(dev, 1);
    __atomic_sub_fetch(&ct_budget_ctx_first, 1, __ATOMIC_ACQ_REL);
}

/* Frees wait while a device's first figure is read: a free the device has taken back and the
 * ledger not yet makes the reading low, and threads that free without pause (not held, as
 * allocations are) kept every reading of a loaded machine inexact: the first figure came out
 * 0 or 1 MiB of an 8 MiB context, and 40 MiB budgets reached 47-48 MiB. */
uint32_t ct_budget_ctx_first;

void ct_budget_free_wait(void)
{
    unsigned waits = 0;
    uint64_t until = ct_now_ns() + CTX_MEASURE_NS;
    while (__atomic_load_n(&ct_budget_ctx_first, __ATOMIC_ACQUIRE) && ct_now_ns() < until)
        ctx_pause(&waits);
}

/* a measurement of dev's context (first: the one the budget starts from) */
static void ctx_take(int dev, int first)
{
    int exact = 0;
    pthread_once(&ctx_once, ctx_init);
    if (!__atomic_load_n(&ctx_procs, __ATOMIC_ACQUIRE)) { /* no NVML: nothing to count */
        ctx_missed(dev, 1);
        return;
    }
    if (first)
        ctx_quiet(dev); /* let those under way end: an exact first reading */
    uint64_t mine = __atomic_load_n(&ctx_counted[dev], __ATOMIC_RELAXED), ctx = 0;
    int found = ctx_measure(dev, mine, &ctx, &exact);
    /* the first figure is what the budget starts from: a reading that calls disturbed (threads
     * that passed before the hold was set reserve during it, and read low) is made again once
     * they ended, a few times within the hold */
    for (int again = 0; first && found == 1 && !exact && again < CTX_FIRST_TRIES; again++) {
        ctx_quiet(dev);
        found = ctx_measure(dev, mine, &ctx, &exact);
    }
    if (found != 1) {
        ctx_missed(dev, found < 0);
        return;
    }
    __atomic_store_n(&ctx_known[dev], 1, __ATOMIC_RELEASE);
    /* a low reading while calls were under way says only that the context is at least that */
    if (ctx == mine || (!exact && ctx < mine))
        return;
    if (ct_ledger_set_context(ct_budget_ledger, dev, ctx) == CT_LEDGER_OK) {
        __atomic_store_n(&ctx_counted[dev], ctx, __ATOMIC_RELAXED);
        if (ctx_report)
            ctx_report(dev, ctx);
    }
}

#define CTX_RETRY_NS 10000000ull /* after a reading disturbed by other calls */

void ct_budget_context_watch(int dev, uint64_t (*held)(int dev), uint64_t pending)
{
    if (ct_budget_ledger || dev < 0 || dev >= CT_LEDGER_MAX_DEVICES ||
        __atomic_load_n(&ctx_misses[dev], __ATOMIC_RELAXED) >= CTX_TRIES)
        return;
    uint64_t now = ct_now_ns(), due = __atomic_load_n(&ctx_next_ns[dev], __ATOMIC_RELAXED);
    if (now < due || !__atomic_compare_exchange_n(&ctx_next_ns[dev], &due, now + CTX_PERIOD_NS, 0,
                                                  __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return; /* measured less than a second ago, or by another thread now */
    pthread_once(&ctx_once, ctx_init);
    if (!__atomic_load_n(&ctx_procs, __ATOMIC_ACQUIRE)) {
        ctx_missed(dev, 1); /* no NVML: nothing to record */
        return;
    }
    uint32_t b0 = __atomic_load_n(&ct_budget_inflight, __ATOMIC_ACQUIRE);
    uint64_t r0 = __atomic_load_n(&ct_budget_reserved, __ATOMIC_ACQUIRE), used = 0;
    uint64_t h0 = held(dev) + pending;
    int found = ctx_nvml_used(dev, &used);
    uint64_t h1 = held(dev) + pending, r1 = __atomic_load_n(&ct_budget_reserved, __ATOMIC_ACQUIRE);
    uint32_t b1 = __atomic_load_n(&ct_budget_inflight, __ATOMIC_ACQUIRE);
    if (found != 1) {
        ctx_missed(dev, found < 0);
        return;
    }
    if (b0 || b1 || r0 != r1 || h0 != h1) { /* another call was under way: again soon */
        __atomic_store_n(&ctx_next_ns[dev], now + CTX_RETRY_NS, __ATOMIC_RELAXED);
        return;
    }
    uint64_t ctx = ((used > h0 ? used - h0 : 0) + 1023) & ~1023ull; /* in KiB, as the ledger */
    if (ctx > __atomic_load_n(&ctx_counted[dev], __ATOMIC_RELAXED)) {
        __atomic_store_n(&ctx_counted[dev], ctx, __ATOMIC_RELAXED);
        if (ctx_report)
            ctx_report(dev, ctx);
    }
}

static void ctx_forget(void)
{
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        __atomic_store_n(&ctx_known[d], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ctx_counted[d], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ctx_misses[d], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ctx_next_ns[d], 0, __ATOMIC_RELAXED);
    }
}

/* a child has no context of its own yet */
static void ctx_atfork_child(void)
{
    ct_budget_ctx_first = 0;
    ct_budget_inflight = 0; /* the parent's other threads' calls are not the child's */
    for (int d = 0; d < CT_LEDGER_MAX_DEVICES; d++) {
        ctx_known[d] = 0;
        ctx_hold_until[d] = 0;
        ctx_next_ns[d] = 0;
        ctx_misses[d] = 0;
        ctx_counted[d] = 0;
    }
}
