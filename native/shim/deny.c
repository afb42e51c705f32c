/* deny.c - the code a budget denial names, at the moment (see deny.h).
 *
 * The reports attribute offline, from the whole run's call graph and the boundary rule
 * (docs/attribution.md). At the moment of a denial the shim has one stack; it applies the
 * boundary rule alone: walking outwards from the innermost frame, a frame is still the
 * allocator's while it lies in the same library family (libggml-cuda and libggml-base are one)
 * and in a namespace the walk has been in, or an enclosing one of the same module; a frame of
 * another library whose name says it allocates (`empty`, `alloc`) starts the allocator anew.
 * The first frame past that is the site; std:: frames and frames without a symbol are never
 * it. A walk that reaches the C library, or the end of the frames, found no boundary: the raw
 * path is printed, innermost first. Cold path: a few symbol lookups per denial line. */
#include "deny.h"

#include <string.h>
#include <strings.h>

#include "modules.h"
#include "util.h"

#define DENY_FRAMES 16
#define NAME_MAX_LEN 200
#define SCOPE_LEN 160
#define MAX_SCOPES 8

struct frame {
    char name[NAME_MAX_LEN]; /* short name; "" when the frame has no symbol */
    const char *module;      /* basename; "" when unknown */
    int exe;
    char scope[SCOPE_LEN]; /* "a::b": the namespaces of the name */
    int plain_c;           /* an unqualified name */
};

/* the start of each top-level "::"-separated component of s, at most max */
static int split(const char *s, const char **parts, size_t *lens, int max)
{
    int n = 0, depth = 0;
    const char *start = s;
    for (const char *c = s;; c++) {
        if (*c == '<' || *c == '(' || *c == '{' || *c == '[')
            depth++;
        else if ((*c == '>' || *c == ')' || *c == '}' || *c == ']') && depth)
            depth--;
        if (!*c || (!depth && c[0] == ':' && c[1] == ':')) {
            if (n == max)
                return -1;
            parts[n] = start;
            lens[n++] = (size_t)(c - start);
            if (!*c)
                return n;
            start = c + 2;
            c++;
        }
    }
}

static int is_anon(const char *p, size_t l)
{
    return (l == 6 && !strncmp(p, "(anon)", 6)) ||
           (l == 21 && !strncmp(p, "(anonymous namespace)", 21));
}

static int class_like(const char *p, size_t l, const char *next, size_t nl)
{
    if ((p[0] >= 'A' && p[0] <= 'Z') || memchr(p, '<', l))
        return 1;
    if (next && nl == l && !strncmp(p, next, l))
        return 1; /* a constructor's own name after it */
    return next && nl == l + 1 && next[0] == '~' && !strncmp(p, next + 1, l);
}

static void set_scope(struct frame *f)
{
    const char *parts[24];
    size_t lens[24];
    int n = split(f->name, parts, lens, 24);
    f->scope[0] = 0;
    f->plain_c = n == 1;
    if (n < 2)
        return;
    int q = n - 1;
    for (int k = 0; k < q; k++)
        if ((memchr(parts[k], '{', lens[k]) || memchr(parts[k], '(', lens[k])) &&
            !is_anon(parts[k], lens[k])) {
            q = k;
            break;
        }
    while (q > 0 && !is_anon(parts[q - 1], lens[q - 1]) &&
           class_like(parts[q - 1], lens[q - 1], parts[q], lens[q]))
        q--;
    size_t o = 0;
    for (int k = 0; k < q && o + lens[k] + 3 < sizeof f->scope; k++) {
        if (k) {
            memcpy(f->scope + o, "::", 2);
            o += 2;
        }
        memcpy(f->scope + o, parts[k], lens[k]);
        o += lens[k];
    }
    f->scope[o] = 0;
}

/* a library's family: libggml-cuda.so and libggml-base.so are "ggml" */
static size_t family(const char *module, const char **start)
{
    const char *b = module;
    if (!strncmp(b, "lib", 3) && b[3])
        b += 3;
    *start = b;
    return strcspn(b, "-_.");
}

static int same_family(const struct frame *a, const struct frame *b)
{
    const char *x, *y;
    size_t lx = family(a->module, &x), ly = family(b->module, &y);
    return lx == ly && !strncmp(x, y, lx);
}

static int transparent(const struct frame *f)
{
    return !strncmp(f->name, "std::", 5) || !strncmp(f->name, "__gnu_cxx::", 11) ||
           !strncmp(f->name, "__cxxabiv1::", 12);
}

static int system_frame(const struct frame *f)
{
    static const char *const mods[] = {"libc.so",    "libc-",     "ld-linux", "ld64.so",
                                       "ld-musl",    "libstdc++", "libc++",   "libgcc_s",
                                       "libpthread", "libpython", "python"};
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++)
        if (!strncmp(f->module, mods[i], strlen(mods[i])))
            return 1;
    return !strcmp(f->name, "_start") || !strcmp(f->name, "__libc_start_main") ||
           !strcmp(f->name, "__libc_start_call_main");
}

static int alloc_named(const struct frame *f)
{
    static const char *const words[] = {"alloc", "empty", "zeros", "acquire", "obtain", "reserve"};
    const char *parts[24];
    size_t lens[24];
    int n = split(f->name, parts, lens, 24);
    for (int k = n - 2 < 0 ? 0 : n - 2; k < n; k++)
        for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
            size_t wl = strlen(words[w]);
            for (size_t i = 0; i + wl <= lens[k]; i++)
                if (!strncasecmp(parts[k] + i, words[w], wl))
                    return 1;
        }
    return 0;
}

/* s is r or an enclosing namespace of r */
static int encloses(const char *s, const char *r)
{
    size_t l = strlen(s);
    return !l || (!strncmp(s, r, l) && (!r[l] || (r[l] == ':' && r[l + 1] == ':')));
}

struct run {
    const char *scopes[MAX_SCOPES];
    int nscopes;
    const struct frame *last; /* the run's outermost frame so far */
};

static int continues(struct run *r, const struct frame *f)
{
    int seen_enclosing = 0, seen_global = 0, seen = 0;
    for (int i = 0; i < r->nscopes; i++) {
        if (encloses(f->scope, r->scopes[i]))
            seen_enclosing = 1;
        if (!r->scopes[i][0])
            seen_global = 1;
        if (!strcmp(f->scope, r->scopes[i]))
            seen = 1;
    }
    if (!seen_enclosing)
        return 0;
    int same_mod = !strcmp(f->module, r->last->module);
    if (!f->scope[0]) {
        if (seen_global)
            return same_mod || (f->plain_c && r->last->plain_c);
        return same_mod && !f->exe; /* a library's C API, never the program's own function */
    }
    return same_mod || seen;
}

static void add_scope(struct run *r, const struct frame *f)
{
    for (int i = 0; i < r->nscopes; i++)
        if (!strcmp(r->scopes[i], f->scope))
            return;
    if (r->nscopes < MAX_SCOPES)
        r->scopes[r->nscopes++] = f->scope;
}

/* the site's index by the boundary rule; 0 when the frames show no boundary */
static int boundary(struct frame *fr, int n)
{
    int i = 0;
    while (i < n && (!fr[i].name[0] || transparent(&fr[i]))) {
        i++;
        if (i < n && strcmp(fr[i].module, fr[0].module))
            break;
    }
    if (i >= n)
        return 0;
    struct run r = {{fr[i].scope}, 1, &fr[i]};
    int site = i && strcmp(fr[i].module, fr[0].module) ? i : -1;
    for (int k = i + 1; site < 0 && k < n; k++) {
        struct frame *f = &fr[k];
        if (system_frame(f))
            return 0;
        if (f->name[0] && transparent(f))
            continue;
        if (!f->name[0]) {
            if (!strcmp(f->module, r.last->module))
                continue;
            site = k;
            break;
        }
        if (same_family(f, r.last)) {
            if (continues(&r, f)) {
                add_scope(&r, f);
                r.last = f;
                continue;
            }
        } else if (!f->exe && alloc_named(f)) {
            r.nscopes = 1;
            r.scopes[0] = f->scope;
            r.last = f;
            continue;
        }
        site = k;
    }
    if (site < 0)
        return 0;
    while (site < n && (!fr[site].name[0] || transparent(&fr[site])))
        site++;
    if (site >= n || system_frame(&fr[site]))
        return 0;
    return site;
}

static size_t add(char *out, size_t o, size_t cap, const char *s)
{
    return o < cap ? o + ct_strlcpy(out + o, s, cap - o) : o;
}

/* a frame's short name, or module+offset when it has no symbol */
static size_t add_name(char *out, size_t o, size_t cap, const struct frame *f, uintptr_t ip)
{
    char fn[NAME_MAX_LEN];
    if (f->name[0])
        return add(out, o, cap, f->name);
    ct_describe_function(ip, fn, sizeof fn);
    return add(out, o, cap, fn);
}

void ct_deny_describe(const uintptr_t *ips, int n, char *out, size_t cap)
{
    struct frame fr[DENY_FRAMES];
    uintptr_t at[DENY_FRAMES];
    int m = 0;
    out[0] = 0;
    for (int k = 0; k < n && m < DENY_FRAMES; k++) { /* one symbol lookup a frame */
        struct frame *f = &fr[m];
        int got = ct_frame_info(ips[k], f->name, sizeof f->name, &f->module, &f->exe);
        if (got == 2 && k)
            continue; /* CUDA's own (ips[0] is the first frame outside it already) */
        if (!got)
            f->module = "";
        set_scope(f);
        at[m++] = ips[k];
    }
    if (!m)
        return;
    int site = boundary(fr, m);
    char desc[NAME_MAX_LEN + 80];
    ct_describe_address(at[site], desc, sizeof desc);
    size_t o = add(out, 0, cap, desc);
    if (site) {
        o = add(out, o, cap, " via ");
        for (int k = site - 1; k >= 0; k--) {
            o = add_name(out, o, cap, &fr[k], at[k]);
            if (k)
                o = add(out, o, cap, " > ");
        }
    }
    for (int k = site + 1; k < m; k++) {
        o = add(out, o, cap, k == site + 1 && site ? ", called from " : " <- ");
        o = add_name(out, o, cap, &fr[k], at[k]);
        if (!strcmp(fr[k].name, "main"))
            break;
    }
}
