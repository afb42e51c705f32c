/* graph.c - the call graph's fold at a denial, from this process's own stacks (graph.h).
 *
 * The reports fold allocator layers by the whole run's call graph (docs/attribution.md): a
 * function g is a layer when at least two of its callers reach allocation only through it (a
 * caller c is a client of g when every stack holding c has g below c). At the moment of a
 * denial the shim has the stacks recorded so far (stacks.c's tree, written as the trace's
 * STACK records); the same rule over them folds what the run has shown to be a layer, so the
 * shim's line names the caller the report names (`allocate_layer_kv`, not `device_carve`).
 * Functions are told apart by their module and short name (modules.c ct_function_idents: a
 * template's instantiations and a function's overloads are one function, as in the reports);
 * CUDA's own frames are left out, as the reports do. A stack of a free or of another event
 * counts too: it can only take a client away, never make a layer. Cold path: a few passes over
 * the tree at a denial line; without a trace (nothing recorded) nothing folds.
 * The same rule over Python functions (a helper two Python callers allocate through): each
 * stack's link node names its Python stack (pyframes.c's tree), a function is its identity
 * (ct_py_ident: file and qualified name, as the reports tell Python functions apart). */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

#include "modules.h"
#include "pyframes.h"
#include "stacks.h"
#include "trace_format.h"

#define MAX_CALLERS 64
#define MAX_WORK (1u << 24) /* frames read: past this, the graph says nothing */

struct cand {
    uint64_t fn;
    uint64_t callers[MAX_CALLERS];
    int ncallers, more; /* more: callers past MAX_CALLERS */
    int clients;
};

struct paths {
    uint64_t *fn;    /* all paths' functions, innermost first, CUDA's left out */
    uint32_t *start; /* path p is fn[start[p] .. start[p + 1]) */
    uint32_t npaths;
};

/* every leaf of the tree as a path of functions; 0 when there is none or it is too large */
static int read_paths(struct paths *ps)
{
    uint64_t *ips, *fns = NULL;
    uint32_t *parents;
    uint32_t n = ct_stacks_copy(&ips, &parents);
    uint8_t *inner = n ? calloc((size_t)n + 1, 1) : NULL; /* has a child */
    size_t total = 0;
    memset(ps, 0, sizeof *ps);
    if (inner && (fns = malloc(((size_t)n + 1) * sizeof *fns))) {
        ct_function_idents(ips + 1, n, fns + 1);
        for (uint32_t id = 1; id <= n; id++)
            if (parents[id] <= n)
                inner[parents[id]] = 1;
        for (uint32_t id = 1; id <= n; id++)
            if (!inner[id]) {
                ps->npaths++;
                for (uint32_t k = id, d = 0; k && k <= n && d < 1024; k = parents[k], d++)
                    total++;
            }
    }
    if (total && total < MAX_WORK && (ps->fn = malloc(total * sizeof *ps->fn)) &&
        (ps->start = malloc(((size_t)ps->npaths + 1) * sizeof *ps->start))) {
        uint32_t p = 0, o = 0;
        for (uint32_t id = 1; id <= n; id++) {
            if (inner[id])
                continue;
            ps->start[p++] = o;
            for (uint32_t k = id, d = 0; k && k <= n && d < 1024; k = parents[k], d++)
                if (fns[k] > 1) /* 0: unknown, 1: CUDA's own */
                    ps->fn[o++] = fns[k];
        }
        ps->start[p] = o;
    } else {
        free(ps->fn);
        ps->fn = NULL;
    }
    free(ips);
    free(parents);
    free(inner);
    free(fns);
    return ps->fn != NULL;
}

static int first_at(const uint64_t *s, uint32_t len, uint64_t f)
{
    for (uint32_t i = 0; i < len; i++)
        if (s[i] == f)
            return (int)i;
    return -1;
}

/* the callers of each candidate over all paths (recursion is no caller) */
static void find_callers(const struct paths *ps, struct cand *c, int nc)
{
    for (uint32_t p = 0; p < ps->npaths; p++) {
        const uint64_t *s = ps->fn + ps->start[p];
        uint32_t len = ps->start[p + 1] - ps->start[p];
        for (uint32_t i = 0; i + 1 < len; i++)
            for (int k = 0; k < nc; k++) {
                if (s[i] != c[k].fn || s[i + 1] == s[i])
                    continue;
                int seen = 0;
                for (int j = 0; j < c[k].ncallers && !seen; j++)
                    seen = c[k].callers[j] == s[i + 1];
                if (!seen && c[k].ncallers < MAX_CALLERS)
                    c[k].callers[c[k].ncallers++] = s[i + 1];
                else if (!seen)
                    c[k].more = 1;
            }
    }
}

/* a caller cl of g is a client when every path holding cl has g below cl's first place */
static int is_client(const struct paths *ps, uint64_t g, uint64_t cl)
{
    for (uint32_t p = 0; p < ps->npaths; p++) {
        const uint64_t *s = ps->fn + ps->start[p];
        uint32_t len = ps->start[p + 1] - ps->start[p];
        int ic = first_at(s, len, cl);
        if (ic >= 0 && first_at(s, (uint32_t)ic, g) < 0)
            return 0;
    }
    return 1;
}

static int private_to(const struct cand *c, uint64_t caller)
{
    return !c->ncallers || (c->ncallers == 1 && !c->more && c->callers[0] == caller);
}

/* layers.py CallGraph.cut over the paths: how many of fn[0..n) fold */
static int cut(const struct paths *ps, const uint64_t *fn, const char *const *module, int n)
{
    struct cand *c = calloc((size_t)n, sizeof *c);
    int top = -1;
    if (c) {
        for (int k = 0; k < n; k++)
            c[k].fn = fn[k];
        find_callers(ps, c, n);
        for (int k = 0; k < n; k++)
            for (int j = 0; j < c[k].ncallers && c[k].clients < 2; j++)
                if (fn[k] > 1 && is_client(ps, fn[k], c[k].callers[j]))
                    c[k].clients++;
        /* layers.py CallGraph.cut: the first layer, then up through layers, and through
         * private frames of one module to a layer above them */
        int i = 0;
        while (i < n && c[i].clients < 2)
            i++;
        top = i < n ? i : -1;
        for (i = top + 1; top >= 0 && i < n;) {
            if (c[i].clients >= 2) {
                top = i++;
                continue;
            }
            int j = i;
            while (j + 1 < n && c[j].clients < 2 && private_to(&c[j], fn[j + 1]))
                j++;
            int one = 1;
            for (int k = i - 1; k <= j && k < n; k++)
                one &= !strcmp(module[k], module[i - 1]);
            if (j < n && j > i && c[j].clients >= 2 && one) {
                top = j;
                i = j + 1;
                continue;
            }
            break;
        }
    }
    free(c);
    return top + 1;
}

int ct_graph_cut(const uint64_t *fn, const char *const *module, int n)
{
    struct paths ps;
    if (n < 2 || !read_paths(&ps))
        return 0;
    int k = cut(&ps, fn, module, n);
    free(ps.fn);
    free(ps.start);
    return k;
}

/* the Python stacks the recorded stacks link to, each a path of function identities */
static int read_py_paths(struct paths *ps)
{
    uint64_t *ips, *ident;
    uint32_t *parents, *pypar;
    uint32_t n = ct_stacks_copy(&ips, &parents);
    uint32_t np = n ? ct_py_nodes_copy(&pypar, &ident) : 0;
    uint8_t *leaf = np ? calloc((size_t)np + 1, 1) : NULL; /* named by a link node */
    size_t total = 0;
    memset(ps, 0, sizeof *ps);
    for (uint32_t id = 1; leaf && id <= n; id++) {
        uint64_t ip = ips[id];
        uint32_t v = (uint32_t)ip;
        if ((ip & CT_PYLINK_MASK) == CT_PYLINK_TAG && ((ip >> 32) & 0xffff) == CT_PYLINK_FRAMES &&
            v && v <= np && !leaf[v]) {
            leaf[v] = 1;
            ps->npaths++;
            for (uint32_t k = v, d = 0; k && k <= np && d < 1024; k = pypar[k], d++)
                total++;
        }
    }
    if (total && total < MAX_WORK && (ps->fn = malloc(total * sizeof *ps->fn)) &&
        (ps->start = malloc(((size_t)ps->npaths + 1) * sizeof *ps->start))) {
        uint32_t p = 0, o = 0;
        for (uint32_t v = 1; v <= np; v++) {
            if (!leaf[v])
                continue;
            ps->start[p++] = o;
            for (uint32_t k = v, d = 0; k && k <= np && d < 1024; k = pypar[k], d++)
                if (ident[k])
                    ps->fn[o++] = ident[k];
        }
        ps->start[p] = o;
    } else {
        free(ps->fn);
        ps->fn = NULL;
    }
    free(ips);
    free(parents);
    if (np) {
        free(pypar);
        free(ident);
    }
    free(leaf);
    return ps->fn != NULL;
}

int ct_graph_py_cut(const uint64_t *ident, const char *const *where, int n)
{
    struct paths ps;
    if (n < 2 || !read_py_paths(&ps))
        return 0;
    int k = cut(&ps, ident, where, n);
    free(ps.fn);
    free(ps.start);
    return k;
}
