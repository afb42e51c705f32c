/* util.c - settings, no-stdio helpers and the real dlsym of the preload library (util.h). */
#include "util.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct ct_config ct_cfg;
CT_TLS struct ct_thread ct_thr;
ct_dlsym_fn ct_real_dlsym_ptr;

/* ---- the real dlsym, obtained per glibc version and architecture --------------------- */
/* Newest first: libc's own (glibc >= 2.34), then libdl's base version on aarch64 (2.17) and on
 * x86-64 (2.2.5) for older glibc. A build may pass its own list (tests do, to see the order). */
#ifndef CT_DLSYM_VERSIONS
#define CT_DLSYM_VERSIONS "GLIBC_2.34", "GLIBC_2.17", "GLIBC_2.2.5"
#endif
static const char *const dlsym_versions[] = {CT_DLSYM_VERSIONS, NULL};
static const char *real_dlsym_version = "none";

const char *ct_real_dlsym_version(void) { return real_dlsym_version; }

CT_NO_SANITIZE ct_dlsym_fn ct_real_dlsym_lookup(void)
{
    ct_dlsym_fn f = __atomic_load_n(&ct_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (f)
        return f;
    for (int i = 0; dlsym_versions[i] && !f; i++) {
        f = (ct_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", dlsym_versions[i]);
        if (f)
            real_dlsym_version = dlsym_versions[i];
    }
    __atomic_store_n(&ct_real_dlsym_ptr, f, __ATOMIC_RELEASE);
    return f;
}

static int dlclose_missing(void *h) { return -1; }

ct_dlclose_fn ct_real_dlclose(void)
{
    static ct_dlclose_fn real;
    ct_dlclose_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (f)
        return f;
    for (int i = 0; dlsym_versions[i] && !f; i++)
        f = (ct_dlclose_fn)dlvsym(RTLD_NEXT, "dlclose", dlsym_versions[i]);
    if (!f)
        f = dlclose_missing;
    __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    return f;
}

/* ---- settings: the environment, read once (settings.def) ------------------------------- */
#define CT_SHIM 1
#define CT_COMMON 1 /* the ledger's C reads them itself; the shim asks whether they are set */
#define CT_PYTHON 0
static const struct {
    const char *name, *dflt;
    int ours;
} settings[CT_NSETTINGS] = {
#define CT_SETTING(ID, NAME, SCOPE, DEFAULT, MEANING) {NAME, DEFAULT, SCOPE},
#include "settings.def"
#undef CT_SETTING
};
/* copies (the program may change its environment later), in a pool as large as they need: a
 * long value (an 8 KiB CUDATRACE_HINTS) never pushes another out, so no fence setting is ever
 * dropped "as if unset" (it was, read after one that filled a fixed pool) */
static char settings_small[4096];
static const char *settings_val[CT_NSETTINGS];
static const char *settings_env[CT_NSETTINGS]; /* as the environment says it; NULL: unset */
static unsigned char settings_lost[CT_NSETTINGS];

void ct_settings_load(void)
{
    const char *v[CT_NSETTINGS];
    size_t need = 0, used = 0;
    for (int i = 0; i < CT_NSETTINGS; i++) {
        v[i] = settings[i].ours ? getenv(settings[i].name) : NULL;
        if (v[i] && !*v[i])
            v[i] = NULL; /* empty: as if unset */
        need += v[i] ? strlen(v[i]) + 1 : 0;
    }
    char *pool = settings_small;
    if (need > sizeof settings_small) {
        void *m = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        pool = m == MAP_FAILED ? NULL : m;
    }
    for (int i = 0; i < CT_NSETTINGS; i++) {
        settings_val[i] = settings[i].dflt;
        settings_env[i] = NULL;
        settings_lost[i] = v[i] && !pool; /* no memory: said, never taken as unset */
        if (!v[i] || !pool)
            continue;
        size_t l = strlen(v[i]);
        memcpy(pool + used, v[i], l + 1);
        settings_val[i] = settings_env[i] = pool + used;
        used += l + 1;
    }
}

const char *ct_setting_env(int id)
{
    return id >= 0 && id < CT_NSETTINGS ? settings_env[id] : NULL;
}

int ct_setting_lost(int id) { return id >= 0 && id < CT_NSETTINGS && settings_lost[id]; }

const char *ct_setting(int id) { return id >= 0 && id < CT_NSETTINGS ? settings_val[id] : NULL; }

const char *ct_setting_default(int id)
{
    return id >= 0 && id < CT_NSETTINGS ? settings[id].dflt : NULL;
}

const char *ct_setting_name(int id)
{
    return id >= 0 && id < CT_NSETTINGS ? settings[id].name : "";
}

/* s as a number of that base into *out; 0 when s is none, empty or not a number */
static int parse_num(const char *s, int base, long *out)
{
    if (!s || !*s)
        return 0;
    char *end;
    long v = strtol(s, &end, base);
    if (*end)
        return 0;
    *out = v;
    return 1;
}

long ct_setting_default_num(int id)
{
    long v = 0;
    if (id >= 0 && id < CT_NSETTINGS)
        (void)parse_num(settings[id].dflt, 10, &v);
    return v;
}

long ct_setting_num(int id)
{
    long v;
    return parse_num(ct_setting(id), 10, &v) ? v : ct_setting_default_num(id);
}

int ct_config_load(int sealed)
{
    const char *dir = ct_setting(CT_SET_DIR), *mode = ct_setting(CT_SET_MODE);
    ct_cfg.mode = strcmp(mode, "aggregate") == 0 ? CT_MODE_AGGREGATE
                  : strcmp(mode, "none") == 0    ? CT_MODE_NONE
                                                 : CT_MODE_FULL;
    /* fencing asked for (budget.c: a sealed record, CUDATRACE_GROUP, _BUDGET, _SHARE*, _LEDGER)
     * is never dropped because nothing is traced (no CUDATRACE_DIR, or one too long): the budget is all then */
    static const int fence_vars[] = {CT_SET_GROUP,        CT_SET_BUDGET,      CT_SET_SHARE,
                                     CT_SET_SHARE_BUDGET, CT_SET_SHARE_LABEL, CT_SET_LEDGER,
                                     CT_SET_FENCE_ERROR};
    int fence = sealed; /* a sealed fence record applies (fence.c) */
    for (size_t i = 0; i < sizeof fence_vars / sizeof *fence_vars; i++)
        fence |= ct_setting(fence_vars[i]) != NULL || ct_setting_lost(fence_vars[i]);
    int dir_ok = dir && *dir && strlen(dir) < sizeof ct_cfg.dir;
    if (fence && !dir_ok) {
        if (dir && *dir)
            ct_log("CUDATRACE_DIR is too long: nothing is traced, the budget is kept", NULL, NULL,
                   NULL);
        ct_cfg.mode = CT_MODE_NONE;
    }
    if (ct_cfg.mode == CT_MODE_NONE) {
        if (!fence) /* no file and no budget: nothing to do */
            return 0;
        ct_cfg.dir[0] = 0;
    } else {
        if (!dir_ok)
            return 0;
        ct_strlcpy(ct_cfg.dir, dir, sizeof ct_cfg.dir);
    }
    long depth = ct_setting_num(CT_SET_STACK_DEPTH);
    ct_cfg.stack_depth = depth < 0 ? 0 : depth > CT_MAX_DEPTH ? CT_MAX_DEPTH : (int)depth;
    ct_cfg.launcher_pid = (int)ct_setting_num(CT_SET_LAUNCHER_PID);
    ct_cfg.quiet = (int)ct_setting_num(CT_SET_QUIET);
    long fmode = -1; /* octal: a value that is no octal number or negative reads as the default */
    if (!parse_num(ct_setting(CT_SET_FILE_MODE), 8, &fmode) || fmode < 0)
        (void)parse_num(settings[CT_SET_FILE_MODE].dflt, 8, &fmode);
    ct_cfg.file_mode = (int)(fmode & 0666);
    /* the command the launcher started writes its file at once, so a run always shows whether
     * the shim entered it; other processes only once they use CUDA */
    ct_cfg.eager = ct_cfg.launcher_pid > 0 && ct_cfg.launcher_pid == (int)getppid();
    ct_cfg.count_host = (int)ct_setting_num(CT_SET_COUNT_HOST);
    ct_cfg.ctx_watch = ct_setting_num(CT_SET_RECORD_CONTEXTS) == 1;
    ct_cfg.virtualize = (int)ct_setting_num(CT_SET_VIRTUALIZE);
    const char *oe = ct_setting(CT_SET_ON_EXCEED);
    ct_cfg.on_exceed = strcmp(oe, "warn") == 0    ? CT_EXCEED_WARN
                       : strcmp(oe, "abort") == 0 ? CT_EXCEED_ABORT
                                                  : CT_EXCEED_FAIL; /* another: a fence error */
    const char *lp = ct_setting(CT_SET_LEDGER);
    if (lp && *lp && strlen(lp) < sizeof ct_cfg.ledger_path)
        ct_strlcpy(ct_cfg.ledger_path, lp, sizeof ct_cfg.ledger_path);
    return 1;
}

/* ---- small helpers ---------------------------------------------------------------------- */
size_t ct_strlcpy(char *dst, const char *src, size_t n)
{
    size_t l = 0;
    if (!n)
        return 0;
    while (src && src[l] && l + 1 < n) {
        dst[l] = src[l];
        l++;
    }
    dst[l] = 0;
    return l;
}

void ct_fmt_u64(char *out, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = 0;
}

void ct_fmt_hex(char *out, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    out[0] = '0';
    out[1] = 'x';
    for (int i = 0; i < n; i++)
        out[2 + i] = tmp[n - 1 - i];
    out[2 + n] = 0;
}

void ct_fmt_bytes(char *out, uint64_t v)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    uint64_t scale = 1;
    while (u < 4 && v >= scale * 1024) {
        scale *= 1024;
        u++;
    }
    uint64_t whole = v / scale, frac = (v % scale) * 100 / scale;
    ct_fmt_u64(out, whole);
    size_t l = strlen(out);
    if (u > 0) {
        out[l++] = '.';
        out[l++] = (char)('0' + frac / 10);
        out[l++] = (char)('0' + frac % 10);
    }
    out[l++] = ' ';
    ct_strlcpy(out + l, units[u], 8);
}

void ct_log(const char *a, const char *b, const char *c, const char *d)
{
    char line[1024];
    size_t l = ct_strlcpy(line, "cudatrace: ", sizeof line);
    const char *parts[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (parts[i] && l < sizeof line - 2)
            l += ct_strlcpy(line + l, parts[i], sizeof line - 1 - l);
    line[l++] = '\n';
    ssize_t r = write(2, line, l);
    (void)r;
}
