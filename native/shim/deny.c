/* deny.c - the code a budget denial names, at the moment (see deny.h).
 *
 * The reports attribute offline, from the whole run's call graph and the boundary rule
 * (docs/attribution.md). At the moment of a denial the shim has one stack; it applies the
 * boundary rule alone: walking outwards from the innermost frame, a frame is still the
 * allocator's while it lies in the same library family (libggml-cuda and libggml-base are one)
 * and in a namespace the walk has been in, or an enclosing one of the same module; a frame of
 * another library whose name says it allocates (`empty`, `alloc`) starts the allocator anew.
 * A frame of a framework (frameworks.c: PyTorch's c10/at/torch over three libraries, ...)
 * belongs to the allocator whatever its library or namespace while the walk is in that
 * framework. A lambda, block or local class is read as the function it is in.
 * The first frame past that is the site; std:: frames and frames without a symbol are never
 * it. A walk that reaches the C library, or the end of the frames, found no boundary: the raw
 * path is printed, innermost first. The launcher's hints add the frames the compiler inlined
 * (the DWARF only it reads); without them, a site in a module with debug information says
 * that code inlined into it is not known here. Cold path: a few symbol lookups per line. */
#include "deny.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dwarf.h"
#include "frameworks.h"
#include "graph.h"
#include "modules.h"
#include "pydeny.h"
#include "util.h"

#define DENY_FRAMES 64
#define NAME_MAX_LEN CT_INLINE_NAME
#define SCOPE_LEN 160
#define MAX_SCOPES 8

struct frame {
    char name[NAME_MAX_LEN]; /* short name; "" when the frame has no symbol */
    size_t encl;             /* name[0..encl): the function a lambda is in (0: none) */
    const char *module;      /* basename; "" when unknown */
    uintptr_t ip, offset;    /* the address, its offset in the module */
    int exe, inlined;
    int hinted;            /* the hints cover this frame's module (its inline frames are known) */
    unsigned fw;           /* the frameworks it belongs to (frameworks.h) */
    char scope[SCOPE_LEN]; /* "a::b": the namespaces of the name */
    int plain_c;           /* an unqualified name */
    const uint8_t *bid;    /* its module's GNU build-id */
    uint32_t blen;
};

/* the name the rule reads: the function a lambda, block or local class is in, else its own */
static size_t rule_len(const struct frame *f) { return f->encl ? f->encl : strlen(f->name); }

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
    char rule[NAME_MAX_LEN];
    size_t rl = rule_len(f);
    memcpy(rule, f->name, rl);
    rule[rl] = 0;
    int n = split(rule, parts, lens, 24);
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
    char rule[NAME_MAX_LEN];
    size_t rl = rule_len(f);
    memcpy(rule, f->name, rl);
    rule[rl] = 0;
    int n = split(rule, parts, lens, 24);
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

/* the site's index by the boundary rule; 0 when the frames show no boundary. A frame of the
 * framework the run is in always belongs to it; a framework's run that reaches the system's
 * own code names the framework's entry (its outermost frame) */
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
    unsigned run_fw = fr[i].fw ? fr[i].fw : i ? fr[0].fw : 0;
    int site = i && strcmp(fr[i].module, fr[0].module) && !(fr[i].fw & fr[0].fw) ? i : -1;
    int last = i;
    for (int k = i + 1; site < 0 && k < n; k++) {
        struct frame *f = &fr[k];
        if (system_frame(f)) {
            if (run_fw && last > i && !transparent(&fr[last]))
                return last;
            return 0;
        }
        if (run_fw && (f->fw & run_fw)) {
            if (f->name[0] && !transparent(f))
                last = k;
            continue;
        }
        if (!f->name[0]) {
            if (!strcmp(f->module, r.last->module))
                continue;
            site = k;
            break;
        }
        if (transparent(f))
            continue;
        if (same_family(f, r.last) && !run_fw) {
            if (continues(&r, f)) {
                add_scope(&r, f);
                r.last = f;
                last = k;
                continue;
            }
        } else if (!f->exe && alloc_named(f) && (!same_family(f, r.last) || f->fw)) {
            r.nscopes = 1;
            r.scopes[0] = f->scope;
            r.last = f;
            run_fw = f->fw;
            last = k;
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
static size_t add_name(char *out, size_t o, size_t cap, const struct frame *f)
{
    char fn[NAME_MAX_LEN];
    if (f->name[0])
        return add(out, o, cap, f->name);
    ct_describe_function(f->ip, fn, sizeof fn);
    return add(out, o, cap, fn);
}

/* the program's own code: its executable, a library outside the system's directories (the
 * ones the launcher's hints read, record/hints.py SYSTEM_DIRS) */
static int own_code(const struct frame *f)
{
    static const char *const dirs[] = {"/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/",
                                       "/usr/local/cuda"};
    const char *path = ct_module_path(f->ip);
    if (f->exe)
        return 1;
    for (size_t i = 0; path && i < sizeof dirs / sizeof dirs[0]; i++)
        if (!strncmp(path, dirs[i], strlen(dirs[i])))
            return 0;
    return path != NULL;
}

/* code the compiler inlined may be what the reports name at this frame: its DWARF shows an
 * inlined subroutine there (dwarf.c); where that cannot be told, only in the program's own code */
static int maybe_inlined(const struct frame *f)
{
    if (f->hinted || f->inlined || !f->offset)
        return 0;
    int r = ct_dwarf_inlined_at(ct_module_path(f->ip), f->bid, f->blen, f->offset - 1);
    return r > 0 || (r < 0 && own_code(f));
}

/* the site: `name (module+0xoff)`, and when the compiler inlined code at that address and the
 * hints did not say which, that code inlined into it is not known here */
static size_t add_site(char *out, size_t o, size_t cap, const struct frame *f)
{
    char hexs[24];
    if (!f->module[0]) {
        ct_fmt_hex(hexs, f->ip);
        return add(out, o, cap, hexs);
    }
    if (f->name[0]) {
        o = add(out, o, cap, f->name);
        o = add(out, o, cap, " (");
    }
    o = add(out, o, cap, f->module);
    o = add(out, o, cap, "+");
    ct_fmt_hex(hexs, f->offset);
    o = add(out, o, cap, hexs);
    if (maybe_inlined(f))
        o = add(out, o, cap, ", or a function inlined into it");
    return f->name[0] ? add(out, o, cap, ")") : o;
}

/* the frames of ips (innermost first, CUDA's own left out), each preceded by the frames the
 * hints say were inlined at it; returns how many */
static int read_frames(const uintptr_t *ips, int n, struct frame *fr)
{
    int m = 0;
    for (int k = 0; k < n && m < DENY_FRAMES; k++) { /* one symbol lookup a frame */
        struct ct_frame_desc d;
        int got = ct_frame_info(ips[k], &d);
        if (got == 2 && k)
            continue; /* CUDA's own (ips[0] is the first frame outside it already) */
        char inl[4][CT_INLINE_NAME];
        size_t encl[4];
        int ni = got ? ct_fw_inlines(d.module, d.build_id, d.build_id_len,
                                     d.offset ? d.offset - 1 : 0, inl, encl, 4)
                     : -1;
        for (int j = 0; j <= (ni > 0 ? ni : 0) && m < DENY_FRAMES; j++) {
            struct frame *f = &fr[m++];
            int real = j == (ni > 0 ? ni : 0);
            ct_strlcpy(f->name, real ? d.name : inl[j], sizeof f->name);
            f->encl = real ? d.encl : encl[j];
            f->module = d.module;
            f->ip = ips[k];
            f->offset = d.offset;
            f->exe = d.exe;
            f->inlined = !real;
            f->hinted = ni >= 0;
            f->bid = got ? d.build_id : NULL;
            f->blen = got ? d.build_id_len : 0;
            set_scope(f);
            f->fw = got ? ct_fw_of(f->module, f->exe, f->name, rule_len(f)) : 0;
        }
    }
    return m;
}

/* the call graph's fold (graph.c) over the concrete frames, as an index of fr: the first frame
 * (its inline frames first) of the function above the layers; 0 when nothing folds */
static int graph_site(const struct frame *fr, int m)
{
    uint64_t ips[DENY_FRAMES], fn[DENY_FRAMES];
    const char *mods[DENY_FRAMES];
    int at[DENY_FRAMES + 1], nc = 0;
    for (int k = 0; k < m; k++)
        if (!fr[k].inlined) {
            ips[nc] = fr[k].ip;
            mods[nc] = fr[k].module;
            at[nc++] = k;
        }
    ct_function_starts(ips, (size_t)nc, fn);
    int kc = ct_graph_cut(fn, mods, nc);
    if (!kc)
        return 0;
    if (kc >= nc)
        return at[nc - 1]; /* everything is allocator: the outermost frame asked */
    int site = at[kc];
    while (site > at[kc - 1] + 1 && fr[site - 1].inlined)
        site--;
    return site;
}

void ct_deny_describe(const uintptr_t *ips, int n, char *out, size_t cap)
{
    out[0] = 0;
    if (ct_pydeny_describe(ips, n, out, cap))
        return; /* Python code made the call: its line, or that it could not be read */
    struct frame *fr = malloc(DENY_FRAMES * sizeof *fr); /* cold path: large, not on the stack */
    int m = fr ? read_frames(ips, n, fr) : 0;
    if (!m) {
        free(fr);
        return;
    }
    int site = boundary(fr, m), g = graph_site(fr, m);
    if (g > site) { /* as the reports: the further of the two reaches, at a named frame */
        int k = g;
        while (k < m && (!fr[k].name[0] || transparent(&fr[k])))
            k++;
        site = k < m && !system_frame(&fr[k]) ? k : g;
    }
    size_t o = add_site(out, 0, cap, &fr[site]);
    if (site) {
        o = add(out, o, cap, " via ");
        for (int k = site - 1; k >= 0; k--) {
            if (k < site - 1 && fr[k].name[0] && !strcmp(fr[k].name, fr[k + 1].name))
                continue; /* a constructor's two symbols, one inlined into the other */
            if (k < site - 1)
                o = add(out, o, cap, " > ");
            o = add_name(out, o, cap, &fr[k]);
        }
    }
    for (int k = site + 1; k < m; k++) {
        o = add(out, o, cap, k == site + 1 && site ? ", called from " : " <- ");
        o = add_name(out, o, cap, &fr[k]);
        if (!strcmp(fr[k].name, "main"))
            break;
    }
    free(fr);
}
