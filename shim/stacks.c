/* stacks.c - call stacks, each distinct one stored once.
 *
 * As in heaptrack's trace tree: a stack is a path in a tree whose root is the outermost frame
 * side; node = (parent node, return address). A new node is written to the trace as a STACK
 * record the first time it is seen, so an event carries only its leaf id. Lookups go through an
 * open-addressing hash of (parent, ip) -> id. A per-thread cache of the last stack makes the
 * common case (the same call site in a loop) take no lock at all.
 */
#include "shim.h"

#include <execinfo.h>
#include <string.h>
#include <sys/mman.h>

#define TABLE_BITS 21
#define TABLE_SIZE (1u << TABLE_BITS)
#define MAX_NODES (TABLE_SIZE - TABLE_SIZE / 4)

struct slot {
    uint64_t ip;
    uint32_t parent;
    uint32_t id;               /* 0: empty */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct slot *table;     /* mmap'd on first use, NORESERVE: pages cost only when touched */
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

uint32_t ct_stack_capture(void)
{
    int depth = ct_cfg.stack_depth;
    if (depth <= 0)
        return 0;
    void *buf[CT_MAX_DEPTH + 16];
    int want = depth + 16;
    if (want > CT_MAX_DEPTH + 16)
        want = CT_MAX_DEPTH + 16;
    int n = backtrace(buf, want);
    int first = 0;
    while (first < n && ct_in_shim((uintptr_t)buf[first]))
        first++;
    int cnt = n - first;
    if (cnt > depth)
        cnt = depth;
    if (cnt <= 0)
        return 0;
    uintptr_t *ips = (uintptr_t *)(buf + first);
    uint32_t gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    if (last_n == cnt && last_gen == gen && memcmp(last_ips, ips, sizeof(uintptr_t) * cnt) == 0)
        return last_leaf;
    uint32_t id = 0;
    pthread_mutex_lock(&mu);
    for (int k = cnt - 1; k >= 0; k--) {         /* outermost first */
        uint32_t next = node(id, ips[k]);
        if (!next)
            break;
        id = next;
    }
    pthread_mutex_unlock(&mu);
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
