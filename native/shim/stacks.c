/* stacks.c - call stacks, each distinct one stored once.
 *
 * As in heaptrack's trace tree: a stack is a path in a tree whose root is the outermost frame
 * side; node = (parent node, return address). A new node is written to the trace as a STACK
 * record the first time it is seen, so an event carries only its leaf id. Lookups go through an
 * open-addressing hash of (parent, ip) -> id. A per-thread cache of the last stack makes the
 * common case (the same call site in a loop) take no lock at all.
 */
#include "stacks.h"

#include <pthread.h>

#include "modules.h"
#include "pyframes.h"
#include "trace_format.h"
#include "unwind.h"
#include "util.h"
#include "writer.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define TABLE_BITS 21
#define TABLE_SIZE (1u << TABLE_BITS)
#define MAX_NODES (TABLE_SIZE - TABLE_SIZE / 4)

struct slot {
    uint64_t ip;
    uint32_t parent;
    uint32_t id; /* 0: empty */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct slot *table; /* mmap'd on first use, NORESERVE: pages cost only when touched */
static uint32_t nnodes;
uint32_t ct_stack_generation = 1; /* bumped on reset, invalidates the per-thread caches */
int ct_stack_recall_depth;        /* stacks.h */

static CT_TLS uintptr_t last_ips[CT_MAX_DEPTH];
CT_TLS const uintptr_t *ct_stack_last; /* last_ips, or the unwinder's memo of the same walk */
CT_TLS int ct_stack_last_n = -1;

static inline uint32_t hash(uint64_t ip, uint32_t parent)
{
    uint64_t h = ip * 0x9E3779B97F4A7C15ull ^ ((uint64_t)parent * 0xC2B2AE3D27D4EB4Full);
    h ^= h >> 29;
    return (uint32_t)h & (TABLE_SIZE - 1);
}

/* with mu held; 0 when the table is full or unavailable */
static uint32_t node(uint32_t parent, uint64_t ip)
{
    if (!table) {
        void *m = mmap(NULL, sizeof(struct slot) * TABLE_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return 0;
        table = m;
    }
    uint32_t i = hash(ip, parent);
    for (;;) {
        struct slot *s = &table[i];
        if (s->id == 0)
            break;
        if (s->ip == ip && s->parent == parent)
            return s->id;
        i = (i + 1) & (TABLE_SIZE - 1);
    }
    if (nnodes >= MAX_NODES)
        return 0;
    if ((ip & CT_PYLINK_MASK) != CT_PYLINK_TAG && !ct_modules_covers(ip))
        ct_modules_scan();
    struct ct_rec_stack rec = {nnodes + 1, parent, ip};
    if (!ct_rec_write(CT_REC_STACK, &rec, sizeof rec, NULL, 0, NULL, 0))
        return 0;
    nnodes++;
    table[i].ip = ip;
    table[i].parent = parent;
    table[i].id = nnodes;
    return nnodes;
}

/* ---- unwinding -------------------------------------------------------------------------
 * A full unwind is libgcc's (what glibc's backtrace() uses, loaded the same way). A repeated
 * call site is served by unwind.c's cached CFI rules instead, on x86-64 and aarch64 alike: the
 * same stack a full unwind gives (unwind.c says why), for a few compares per frame. Each event
 * counts which way its stack was taken in the file header; CUDATRACE_STACK_VERIFY=1 also runs
 * the full unwind for every cached one and counts (and logs) any difference.
 */
struct _Unwind_Context;
typedef int (*unwind_trace_fn)(struct _Unwind_Context *, void *);
static int (*p_Unwind_Backtrace)(unwind_trace_fn, void *);
static uintptr_t (*p_Unwind_GetIP)(struct _Unwind_Context *);
static uintptr_t (*p_Unwind_GetCFA)(struct _Unwind_Context *);

/* the last few stacks of this thread, to find a leaf id without the global lock */
#define CACHE_WAYS 4
struct cached {
    uint32_t gen, leaf;
    int n;
    uintptr_t ips[CT_MAX_DEPTH];
};
struct tcache {
    unsigned next;
    struct cached way[CACHE_WAYS];
    uintptr_t ips[CT_MAX_DEPTH], ref[CT_MAX_DEPTH]; /* scratch: not on the target's stack */
};
static CT_TLS struct tcache *tcache;
static pthread_key_t tcache_key; /* gives a thread's cache back when it exits */
static int tcache_key_ok;
static int verify_stacks;

static void tcache_free(void *p)
{
    if (p) {
        if (p == tcache)
            tcache = NULL;
        munmap(p, sizeof(struct tcache));
    }
} /* CUDATRACE_STACK_VERIFY=1: check cached walks against libgcc */

void ct_stacks_init(void)
{
    void *h = dlopen("libgcc_s.so.1", RTLD_NOW);
    ct_dlsym_fn ds = ct_real_dlsym(); /* not the dlsym the shim exports */
    if (h && ds) {
        p_Unwind_Backtrace = (int (*)(unwind_trace_fn, void *))ds(h, "_Unwind_Backtrace");
        p_Unwind_GetIP = (uintptr_t(*)(struct _Unwind_Context *))ds(h, "_Unwind_GetIP");
        p_Unwind_GetCFA = (uintptr_t(*)(struct _Unwind_Context *))ds(h, "_Unwind_GetCFA");
    }
    if (!p_Unwind_Backtrace || !p_Unwind_GetIP || !p_Unwind_GetCFA)
        p_Unwind_Backtrace = NULL;
    verify_stacks = ct_setting_num(CT_SET_STACK_VERIFY) == 1;
    ct_stack_recall_depth = verify_stacks ? 0 : ct_cfg.stack_depth; /* clamped by util.c */
    if (!tcache_key_ok && pthread_key_create(&tcache_key, tcache_free) == 0)
        tcache_key_ok = 1;
    ct_uw_init();
}

struct walk {
    int n, max, started;
    uintptr_t *ips;
};

static int walk_cb(struct _Unwind_Context *ctx, void *arg)
{
    struct walk *w = arg;
    /* At the callback for a frame, the context's CFA is that of the frame it called, so the
     * return address into this frame (its IP) was stored just below it. */
    uintptr_t ip = p_Unwind_GetIP(ctx);
    if (!ip)
        return 5; /* _URC_END_OF_STACK */
    if (!w->started && ct_in_shim(ip))
        return 0;
    w->started = 1;
    w->ips[w->n] = ip;
    return ++w->n >= w->max ? 5 : 0;
}

static uint32_t insert(const uintptr_t *ips, int cnt)
{
    uint32_t id = 0;
    pthread_mutex_lock(&mu);
    for (int k = cnt - 1; k >= 0; k--) { /* outermost first */
        uint32_t next = node(id, ips[k]);
        if (!next)
            break;
        id = next;
    }
    pthread_mutex_unlock(&mu);
    return id;
}

/* the full unwind: libgcc's, frame by frame (or glibc's backtrace without libgcc_s) */
static int full_unwind(uintptr_t *ips, int depth)
{
    if (p_Unwind_Backtrace) {
        struct walk wk = {0, depth, 0, ips};
        p_Unwind_Backtrace(walk_cb, &wk);
        return wk.n;
    }
    void *buf[CT_MAX_DEPTH + 16]; /* only without libgcc_s */
    int n = backtrace(buf, depth + 16);
    int first = 0;
    while (first < n && ct_in_shim((uintptr_t)buf[first]))
        first++;
    int cnt = n - first;
    if (cnt > depth)
        cnt = depth;
    for (int k = 0; k < cnt; k++)
        ips[k] = (uintptr_t)buf[first + k];
    return cnt < 0 ? 0 : cnt;
}

static void report_mismatch(const uintptr_t *a, int na, const uintptr_t *b, int nb)
{
    int k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    char n1[24], n2[24], at[24], h1[24], h2[24];
    ct_fmt_u64(n1, (uint64_t)na);
    ct_fmt_u64(n2, (uint64_t)nb);
    ct_fmt_u64(at, (uint64_t)k);
    ct_fmt_hex(h1, k < na ? a[k] : 0);
    ct_fmt_hex(h2, k < nb ? b[k] : 0);
    ct_log("stack cache MISMATCH (cached frames / full unwind frames / first different frame): ",
           n1, n2, at);
    ct_log("  cached ", h1, " full ", h2);
}

static uint32_t native_capture(const struct ct_caller *from, int *cached);

/* (native leaf, Python link) pairs of this thread met before and their nodes */
#define LINK_WAYS 16
struct link_ent {
    uint64_t ip;
    uint32_t leaf, node, gen;
};
static CT_TLS struct link_ent links[LINK_WAYS];

static uint32_t capture(const struct ct_caller *from, int *cached);

/* what stacks.h's inline ct_stack_capture does not answer itself */
uint32_t ct_stack_capture_slow(const struct ct_caller *from, int *cached)
{
    return capture(from, cached);
}

static uint32_t capture(const struct ct_caller *from, int *cached)
{
    *cached = 0;
    /* the process's first record opens the trace and writes its preamble, which asks the
     * driver (dlopen: the loader's lock): here, before any lock of ours is held, never from
     * inside the stack table or the module walk (a thread holding the loader's lock may be
     * waiting for those) */
    if (__builtin_expect(!ct_writer_generation(), 0))
        ct_writer_open_now();
    uint32_t leaf = native_capture(from, cached);
    if (ct_cfg.stack_depth <= 0)
        return leaf;
    /* a process running CPython: one more node naming the Python stack (pyframes.c) */
    uint64_t link = ct_py_capture();
    if (!link)
        return leaf;
    uint32_t gen = __atomic_load_n(&ct_stack_generation, __ATOMIC_ACQUIRE);
    struct link_ent *c =
        &links[((link * 0x9E3779B97F4A7C15ull) ^ leaf * 0xC2B2AE3D27D4EB4Full) >> 60];
    if (c->gen == gen && c->leaf == leaf && c->ip == link && c->node)
        return c->node;
    pthread_mutex_lock(&mu);
    uint32_t id = node(leaf, link);
    pthread_mutex_unlock(&mu);
    if (!id)
        return leaf;
    *c = (struct link_ent){link, leaf, id, gen};
    return id;
}

static uint32_t native_capture(const struct ct_caller *from, int *cached)
{
    int depth = ct_cfg.stack_depth;
    if (depth <= 0)
        return 0;
    if (depth > CT_MAX_DEPTH)
        depth = CT_MAX_DEPTH;
    uint32_t gen = __atomic_load_n(&ct_stack_generation, __ATOMIC_ACQUIRE);
    if (!tcache) {
        void *m = mmap(NULL, sizeof(struct tcache), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return 0;
        tcache = m;
        if (tcache_key_ok)
            pthread_setspecific(tcache_key, m);
    }
    uintptr_t *ips = tcache->ips, *ref = tcache->ref;
    const uintptr_t *walked = NULL;
    uint64_t *tag = NULL;
    int learned = 0;
    /* the one call of the cached walk: its own return addresses are part of what it caches */
    uintptr_t start[3] = {from ? from->ra : 0, from ? from->sp : 0, from ? from->fp : 0};
    const struct ct_uw_memo *memo =
        start[1] ? ct_uw_recall(start[0], start[1], start[2], depth) : NULL;
    int cnt;
    if (memo) {
        cnt = memo->n;
        walked = memo->ips;
        tag = (uint64_t *)&memo->tag; /* the memo is the thread's own */
    } else
        cnt = ct_uw_walk(start[1] ? start : NULL, ips, depth, &learned, &walked, &tag);
    if (cnt >= 0 && !learned) {
        *cached = 1; /* the event says so (CT_EV_STACK_CACHED) */
        if (verify_stacks) {
            int m = full_unwind(ref, depth);
            ct_writer_stack_count(CT_SC_VERIFIED);
            if (m != cnt || memcmp(ref, walked, sizeof(uintptr_t) * (size_t)cnt) != 0) {
                ct_writer_stack_count(CT_SC_MISMATCH);
                report_mismatch(walked, cnt, ref, m);
                memcpy(ips, ref, sizeof(uintptr_t) * (size_t)m);
                walked = ips;
                cnt = m;
                tag = NULL; /* the full unwind's answer is not the memo's */
            }
        }
        /* the same walk as before, every word it read re-checked: the leaf it gave then */
        if (tag && *tag >> 32 == gen && cnt > 0) {
            ct_stack_last = walked;
            ct_stack_last_n = cnt;
            return (uint32_t)*tag;
        }
    } else {
        /* a new call site, or frames the rules do not describe: the full unwind decides (the
         * walk's own answer, when it had one, is only compared with it) */
        int w = cnt;
        cnt = full_unwind(ref, depth);
        ct_writer_stack_count(CT_SC_FULL);
        if (verify_stacks && w >= 0) {
            ct_writer_stack_count(CT_SC_VERIFIED);
            if (w != cnt || memcmp(ref, walked, sizeof(uintptr_t) * (size_t)cnt) != 0) {
                ct_writer_stack_count(CT_SC_MISMATCH);
                report_mismatch(walked, w, ref, cnt);
            }
        }
        /* the memo keeps what the walk found; when the full unwind differs, no tag for it */
        if (tag && (w != cnt || memcmp(ref, walked, sizeof(uintptr_t) * (size_t)cnt) != 0))
            tag = NULL;
        if (cnt > 0)
            memcpy(ips, ref, sizeof(uintptr_t) * (size_t)cnt);
        walked = ips;
    }
    if (cnt <= 0)
        return 0;
    memcpy(last_ips, walked, sizeof(uintptr_t) * (size_t)cnt);
    ct_stack_last = last_ips;
    ct_stack_last_n = cnt;
    uint32_t leaf = 0;
    for (int w = 0; w < CACHE_WAYS && !leaf; w++) {
        struct cached *c = &tcache->way[w];
        if (c->gen == gen && c->n == cnt &&
            memcmp(c->ips, last_ips, sizeof(uintptr_t) * (size_t)cnt) == 0)
            leaf = c->leaf;
    }
    if (!leaf) {
        leaf = insert(last_ips, cnt);
        struct cached *c = &tcache->way[tcache->next++ % CACHE_WAYS];
        c->gen = gen;
        c->n = cnt;
        c->leaf = leaf;
        memcpy(c->ips, last_ips, sizeof(uintptr_t) * (size_t)cnt);
    }
    if (tag && leaf && cnt > 0)
        *tag = (uint64_t)gen << 32 | leaf;
    return leaf;
}

uintptr_t ct_stack_first_user_frame(void)
{
    /* the stack this thread captured last, innermost first */
    return ct_stack_last_n > 0 ? ct_pick_caller(ct_stack_last, ct_stack_last_n) : 0;
}

int ct_stack_user_frames(uintptr_t *out, int max)
{
    uintptr_t first = ct_stack_first_user_frame();
    int k = 0, n = 0;
    if (!first)
        return 0;
    while (k < ct_stack_last_n && ct_stack_last[k] != first)
        k++;
    for (; k < ct_stack_last_n && n < max; k++)
        out[n++] = ct_stack_last[k];
    return n;
}

uint32_t ct_stacks_copy(uint64_t **ips, uint32_t **parents)
{
    *ips = NULL;
    *parents = NULL;
    pthread_mutex_lock(&mu);
    uint32_t n = table ? nnodes : 0;
    uint64_t *ip = n ? malloc(((size_t)n + 1) * sizeof *ip) : NULL;
    uint32_t *par = n ? malloc(((size_t)n + 1) * sizeof *par) : NULL;
    if (ip && par) {
        memset(par, 0, ((size_t)n + 1) * sizeof *par);
        memset(ip, 0, ((size_t)n + 1) * sizeof *ip);
        for (uint32_t i = 0; i < TABLE_SIZE; i++)
            if (table[i].id && table[i].id <= n) {
                ip[table[i].id] = table[i].ip;
                par[table[i].id] = table[i].parent;
            }
    }
    pthread_mutex_unlock(&mu);
    if (!ip || !par) {
        free(ip);
        free(par);
        return 0;
    }
    *ips = ip;
    *parents = par;
    return n;
}

void ct_stacks_atfork_prepare(void) { pthread_mutex_lock(&mu); }
void ct_stacks_atfork_parent(void) { pthread_mutex_unlock(&mu); }

void ct_stacks_reset(void)
{
    pthread_mutex_init(&mu, NULL);
    if (table)
        munmap(table, sizeof(struct slot) * TABLE_SIZE);
    table = NULL;
    nnodes = 0;
    __atomic_add_fetch(&ct_stack_generation, 1, __ATOMIC_RELEASE);
    ct_uw_invalidate(); /* the memos' tags name nodes of the old tree (stacks.h) */
    ct_stack_last_n = -1;
}
