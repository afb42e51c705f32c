/* util.h - what every file of the preload library uses: the process-wide settings, the clock,
 * no-stdio string helpers (nothing inside the target may take stdio's locks), and the real
 * dlsym. The shim's own lookups (libgcc's unwinder, __cxa_demangle, driver entry points) go
 * through ct_real_dlsym(), never through the dlsym the shim exports to the program. */
#ifndef CUDATRACE_UTIL_H
#define CUDATRACE_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CT_EXPORT __attribute__((visibility("default")))
/* on extern data of the library: addressed directly, not through the GOT (hot path) */
#define CT_HIDDEN __attribute__((visibility("hidden")))
#define CT_TLS __thread __attribute__((tls_model("initial-exec")))
/* on what may run before a sanitizer's runtime is set up (its own start-up looks functions up
 * through dlsym(RTLD_NEXT, ...), reaching the shim's dlsym): never instrumented, so the
 * sanitizers' builds (native/Makefile: sanitize, tsan) load; no effect on a normal build */
#define CT_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))
/* the package's version (cudatrace.__version__), stamped by native/Makefile */
#ifndef CT_SHIM_VERSION
#error "CT_SHIM_VERSION: build with native/Makefile, which stamps cudatrace.__version__"
#endif
#define CT_MAX_DEPTH 256

/* ---- process-wide settings, read once from the environment at load -------------------- */
struct ct_config {
    int active; /* 1: CUDATRACE_DIR set and usable; 0: pure pass-through */
    int eager;  /* create the trace file at load (the root process of a run) */
    int stack_depth;
    int on_exceed;  /* CT_EXCEED_* */
    int count_host; /* 1 forced, 0 auto (integrated devices), -1 never */
    int virtualize;
    int launcher_pid;
    int quiet;     /* CUDATRACE_QUIET=1: no notes on stderr (budget lines are rate-limited) */
    int file_mode; /* of trace files: 0600 (they hold argv and cwd) unless CUDATRACE_FILE_MODE */
    char dir[1024];
    char ledger_path[1024]; /* "" without a budget */
    int mode;               /* CT_MODE_*: CUDATRACE_MODE full | aggregate | none */
    int ctx_watch; /* CUDATRACE_RECORD_CONTEXTS=1 and no budget: measure contexts (budget.c) */
};
#define CT_MODE_FULL 0
#define CT_MODE_AGGREGATE 1
#define CT_MODE_NONE 2 /* --no-trace: budget and virtualization only, no file */
#define CT_EXCEED_FAIL 0
#define CT_EXCEED_WARN 1
#define CT_EXCEED_ABORT 2
extern CT_HIDDEN struct ct_config ct_cfg;

/* Fill ct_cfg from CUDATRACE_* (all but .active). 0: CUDATRACE_DIR unset or unusable and no
 * fencing asked for (sealed: a fence record applies, fence.c), the shim stays pass-through. The
 * environment is read here alone, once (settings.def). */
int ct_config_load(int sealed);

/* ---- the environment, read once at load (native/include/settings.def) ------------------ */
enum {
#define CT_SETTING(ID, ...) CT_SET_##ID,
#include "settings.def"
#undef CT_SETTING
    CT_NSETTINGS
};
/* read every setting from the environment, once, at load (before anything asks for one) */
void ct_settings_load(void);
/* the value (its default when unset or empty; NULL when it has none) */
const char *ct_setting(int id);
/* the value as a decimal number; the declared default when unset, empty or no number */
long ct_setting_num(int id);
/* the declared default as a decimal number (0: none): the fallback of a value out of range */
long ct_setting_default_num(int id);
/* the value as the environment says it: NULL when unset or empty (no default) */
const char *ct_setting_env(int id);
/* 1: set, but could not be kept (no memory for the settings): fencing it touches is refused */
int ct_setting_lost(int id);
/* the declared default (NULL: none) */
const char *ct_setting_default(int id);
/* the variable's name (CUDATRACE_BUDGET) */
const char *ct_setting_name(int id);

/* the clock and the thread id: inline, both are on every event's path */
static inline uint64_t ct_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The calling thread's state on the call path, in one thread-local object (one TLS offset to
 * load per access, not one per variable). */
struct ct_thread {
    uint32_t tid;      /* 0: not read yet (reset in a child after fork) */
    int depth;         /* >0: inside a wrapper, nested calls pass through (shim.c) */
    uint16_t rt_api;   /* runtime API in progress on this thread (shim.c) */
    int deny_share;    /* the last denial was the share's (shim.c) */
    uintptr_t dev_ctx; /* the context dev belongs to, 0: none yet (shim.c current_device) */
    int dev;
    uintptr_t sdev_ctx; /* another context (a stream's) and its device (shim.c stream_device) */
    int sdev;
    uint32_t ctx_epoch; /* the contexts' epoch dev_ctx and sdev_ctx were learned in (shim.c) */
};
extern CT_HIDDEN CT_TLS struct ct_thread ct_thr;
static inline uint32_t ct_gettid(void)
{
    if (!ct_thr.tid)
        ct_thr.tid = (uint32_t)syscall(SYS_gettid);
    return ct_thr.tid;
}

/* ---- small helpers: no stdio inside the target -------------------------------------- */
size_t ct_strlcpy(char *dst, const char *src, size_t n);
void ct_fmt_u64(char *out, uint64_t v);
void ct_fmt_hex(char *out, uint64_t v);
void ct_fmt_bytes(char *out, uint64_t v);
void ct_log(const char *a, const char *b, const char *c, const char *d);

/* ---- the real dlsym (glibc's), found by version ------------------------------------- */
typedef void *(*ct_dlsym_fn)(void *, const char *);
extern CT_HIDDEN ct_dlsym_fn ct_real_dlsym_ptr;
CT_NO_SANITIZE ct_dlsym_fn ct_real_dlsym_lookup(void);
/* the glibc version name under which the real dlsym was found ("none" before) */
const char *ct_real_dlsym_version(void);
/* the real dlclose (glibc's, by version): the shim exports its own (unwind.c), which forgets
 * every learned unwind rule; the shim's own handles never unload anything */
typedef int (*ct_dlclose_fn)(void *);
ct_dlclose_fn ct_real_dlclose(void);
static inline ct_dlsym_fn ct_real_dlsym(void)
{
    ct_dlsym_fn f = __atomic_load_n(&ct_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    return f ? f : ct_real_dlsym_lookup();
}

#endif
