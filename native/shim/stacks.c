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
#include "trace_format.h"
#include "util.h"
#include "writer.h"

#include <dlfcn.h>
#include <execinfo.h>
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
static uint32_t generation = 1; /* bumped on reset, invalidates the per-thread caches */

static CT_TLS uintptr_t last_ips[CT_MAX_DEPTH];
static CT_TLS int last_n = -1;
static CT_TLS uint32_t last_leaf;
static CT_TLS uint32_t last_gen;

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
    if (!ct_modules_covers(ip))
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
 * The unwinder of libgcc (what glibc's backtrace() uses, loaded the same way) gives each
 * frame's return address and CFA. On x86-64 a frame's return address sits at the CFA of the
 * frame below minus 8, which makes a cheap exact check possible: a thread calling from the
 * same place again (same stack slot for the first return address, same return addresses in
 * every recorded slot) has the same stack, so the unwind is skipped. That is what makes a loop
 * of allocations cheap; a new call site pays one real unwind.
 */
struct _Unwind_Context;
typedef int (*unwind_trace_fn)(struct _Unwind_Context *, void *);
static int (*p_Unwind_Backtrace)(unwind_trace_fn, void *);
static uintptr_t (*p_Unwind_GetIP)(struct _Unwind_Context *);
static uintptr_t (*p_Unwind_GetCFA)(struct _Unwind_Context *);

#if defined(__x86_64__)
#define CACHE_WAYS 4
struct cached {
    uintptr_t loc0; /* stack slot of the first user return address */
    uint32_t gen, leaf;
    int n;
    uintptr_t ips[CT_MAX_DEPTH];
    uintptr_t locs[CT_MAX_DEPTH]; /* where each return address was found */
};
struct tcache {
    unsigned next;
    struct cached way[CACHE_WAYS];
};
static CT_TLS struct tcache *tcache;

#endif
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
}

#if defined(__x86_64__)
struct walk {
    int n, max, started;
    uintptr_t *ips, *locs;
};

static int walk_cb(struct _Unwind_Context *ctx, void *arg)
{
    struct walk *w = arg;
    /* At the callback for a frame, the context's CFA is that of the frame it called, so the
     * return address into this frame (its IP) was stored just below it. */
    uintptr_t ip = p_Unwind_GetIP(ctx), cfa = p_Unwind_GetCFA(ctx);
    if (!ip)
        return 5; /* _URC_END_OF_STACK */
    if (!w->started && ct_in_shim(ip))
        return 0;
    w->started = 1;
    w->ips[w->n] = ip;
    w->locs[w->n] = cfa - sizeof(uintptr_t);
    return ++w->n >= w->max ? 5 : 0;
}

#endif

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

uint32_t ct_stack_capture(uintptr_t wrapper_cfa)
{
    int depth = ct_cfg.stack_depth;
    if (depth <= 0)
        return 0;
    if (depth > CT_MAX_DEPTH)
        depth = CT_MAX_DEPTH;
    uint32_t gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
#if defined(__x86_64__)
    if (p_Unwind_Backtrace) {
        if (!tcache) {
            void *m = mmap(NULL, sizeof(struct tcache), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            tcache = m == MAP_FAILED ? NULL : m;
        }
        /* the wrapper's CFA: its return address into the caller sits just below it */
        uintptr_t *slot = wrapper_cfa ? (uintptr_t *)wrapper_cfa - 1 : NULL;
        if (tcache && slot) {
            for (int w = 0; w < CACHE_WAYS; w++) {
                struct cached *c = &tcache->way[w];
                if (c->loc0 != (uintptr_t)slot || c->gen != gen || c->n > depth)
                    continue;
                int k = 0;
                while (k < c->n && *(const uintptr_t *)c->locs[k] == c->ips[k])
                    k++;
                if (k == c->n) {
                    last_n = c->n;
                    memcpy(last_ips, c->ips, sizeof(uintptr_t) * c->n);
                    return c->leaf;
                }
            }
            struct cached *c = &tcache->way[tcache->next++ % CACHE_WAYS];
            struct walk wk = {0, depth, 0, c->ips, c->locs};
            p_Unwind_Backtrace(walk_cb, &wk);
            int ok = wk.n > 0 && c->locs[0] == (uintptr_t)slot;
            for (int k = 1; ok && k < wk.n; k++) /* slots must climb the same stack */
                ok = c->locs[k] > c->locs[k - 1] && c->locs[k] - c->locs[0] < (64u << 20);
            uint32_t leaf = wk.n ? insert(c->ips, wk.n) : 0;
            c->n = wk.n;
            c->gen = gen;
            c->leaf = leaf;
            c->loc0 = ok ? (uintptr_t)slot : 0;
            last_n = wk.n;
            memcpy(last_ips, c->ips, sizeof(uintptr_t) * wk.n);
            return leaf;
        }
    }
#endif
    /* elsewhere: glibc's backtrace and a one-entry cache on the addresses */
    void *buf[CT_MAX_DEPTH + 16];
    int n = backtrace(buf, depth + 16);
    int first = 0;
    while (first < n && ct_in_shim((uintptr_t)buf[first]))
        first++;
    int cnt = n - first;
    if (cnt > depth)
        cnt = depth;
    if (cnt <= 0)
        return 0;
    uintptr_t *ips = (uintptr_t *)(buf + first);
    if (last_n == cnt && last_gen == gen && memcmp(last_ips, ips, sizeof(uintptr_t) * cnt) == 0)
        return last_leaf;
    uint32_t id = insert(ips, cnt);
    memcpy(last_ips, ips, sizeof(uintptr_t) * cnt);
    last_n = cnt;
    last_leaf = id;
    last_gen = gen;
    return id;
}

uintptr_t ct_stack_first_user_frame(void)
{
    /* the stack this thread captured last, innermost first */
    return last_n > 0 ? ct_pick_caller(last_ips, last_n) : 0;
}

int ct_stack_user_frames(uintptr_t *out, int max)
{
    uintptr_t first = ct_stack_first_user_frame();
    int k = 0, n = 0;
    if (!first)
        return 0;
    while (k < last_n && last_ips[k] != first)
        k++;
    for (; k < last_n && n < max; k++)
        out[n++] = last_ips[k];
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
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
    last_n = -1;
}
