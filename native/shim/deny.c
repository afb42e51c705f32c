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
#define DWARF_READS 24 /* physical frames whose DWARF a denial reads */
#define DWARF_CHAIN 16 /* inlined calls at one address (the innermost kept past it) */
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
    int dwarf;                /* its DWARF: -2 not read, -1 cannot tell, else read */
    char file[CT_DWARF_FILE]; /* its source file and line, "" and 0 when unknown */
    uint32_t line;
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
    const char *m = f->name + 2; /* a name no demangler read: its first qualifier is std */
    if (!strncmp(f->name, "_Z", 2)) {
        m += *m == 'N';
        while (*m && strchr("rVKRO", *m))
            m++;
        if (!strncmp(m, "St", 2) || !strncmp(m, "9__gnu_cxx", 10))
            return 1;
    }
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

/* the words of a frame's own name (its last component, template arguments aside), lower-case,
 * each NUL-terminated in buf: `CreateTensorAsOrtValue` -> create tensor as ort value; how many */
static int name_words(const struct frame *f, char *buf, size_t cap, const char **w, int max)
{
    const char *parts[24];
    size_t lens[24];
    char rule[NAME_MAX_LEN];
    size_t rl = rule_len(f), o = 0;
    memcpy(rule, f->name, rl);
    rule[rl] = 0;
    int n = split(rule, parts, lens, 24), nw = 0, depth = 0;
    if (n < 1)
        return 0;
    const char *s = parts[n - 1];
    for (size_t i = 0; i < lens[n - 1] && nw < max; i++) {
        char c = s[i], prev = i ? s[i - 1] : 0, next = i + 1 < lens[n - 1] ? s[i + 1] : 0;
        depth += c == '<' ? 1 : c == '>' && depth ? -1 : 0;
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (depth || c == '<' || c == '>' || !alpha) {
            if (o && buf[o - 1])
                buf[o++] = 0; /* a word ends */
            continue;
        }
        int upper = c >= 'A' && c <= 'Z', digit = c >= '0' && c <= '9';
        int pdigit = prev >= '0' && prev <= '9', plower = prev >= 'a' && prev <= 'z';
        int pupper = prev >= 'A' && prev <= 'Z', nlower = next >= 'a' && next <= 'z';
        int starts = !o || !buf[o - 1] || (upper && (plower || pdigit || (pupper && nlower))) ||
                     (digit != pdigit);
        if (o + 2 >= cap)
            break;
        if (starts && o && buf[o - 1])
            buf[o++] = 0;
        if (starts)
            w[nw++] = buf + o;
        buf[o++] = upper ? (char)(c - 'A' + 'a') : c;
    }
    buf[o] = 0;
    return nw;
}

/* f, outside the framework just above its frame api, only forwards to it: its name is the
 * API's, or the API's is the start of its own (layers.py forwards) */
static int forwards(const struct frame *f, const struct frame *api)
{
    char hb[NAME_MAX_LEN], ab[NAME_MAX_LEN];
    const char *h[16], *a[16];
    if (system_frame(f) || f->fw)
        return 0;
    int nh = name_words(f, hb, sizeof hb, h, 16), na = name_words(api, ab, sizeof ab, a, 16);
    if (!nh || !na)
        return 0;
    for (int k = 0; k < nh && k < na; k++)
        if (strcmp(h[k], a[k]))
            return 0;
    return 1;
}

/* what the walk saw: the first frame that joined the run through an enclosing namespace of
 * its module (0: none), the program's helpers that only forwarded to a framework (bits) */
struct walk {
    int widened;
    uint64_t forwarders;
};

/* the walk outwards from the allocator's first named frame i: the first frame past the
 * boundary, or -1 when it reaches the system's code (or the end) without one, -2 - k when a
 * framework's run reaches it (k: the framework's entry, its outermost frame) */
static int walk_run(struct frame *fr, int n, int i, struct walk *w)
{
    struct run r = {{fr[i].scope}, 1, &fr[i]};
    unsigned run_fw = fr[i].fw ? fr[i].fw : i ? fr[0].fw : 0;
    int last = i;
    if (i && strcmp(fr[i].module, fr[0].module) && !(fr[i].fw & fr[0].fw))
        return i; /* an allocator without symbols in a module of its own: its caller asked */
    for (int k = i + 1; k < n; k++) {
        struct frame *f = &fr[k];
        if (system_frame(f))
            return run_fw && last > i && !transparent(&fr[last]) ? -2 - last : -1;
        if (run_fw && (f->fw & run_fw)) {
            if (f->name[0] && !transparent(f))
                last = k;
            continue;
        }
        if (!f->name[0]) {
            if (!strcmp(f->module, r.last->module))
                continue;
            return k;
        }
        if (transparent(f))
            continue;
        if (run_fw && forwards(f, &fr[last])) {
            if (k < 64)
                w->forwarders |= 1ull << k;
            continue;
        }
        if (same_family(f, r.last) && !run_fw) {
            if (continues(&r, f)) {
                int seen = 0;
                for (int s = 0; s < r.nscopes; s++)
                    seen |= !strcmp(r.scopes[s], f->scope);
                if (!seen && !w->widened)
                    w->widened = k;
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
            w->widened = 0;
            continue;
        }
        return k;
    }
    return -1;
}

/* the program's entry point: main, or the outermost frame of its code below the C library (a
 * thread's start routine) */
static int entry(const struct frame *fr, int n, int k)
{
    if (!strcmp(fr[k].name, "main"))
        return 1;
    for (int j = k + 1; j < n; j++)
        if (fr[j].name[0] && !transparent(&fr[j]))
            return system_frame(&fr[j]);
    return 0;
}

/* a frame of the program's own (named, of frame k's module, no framework's, no forwarder)
 * lies between frame k and the allocator's call */
static int owned(const struct frame *fr, int k, const struct walk *w)
{
    for (int j = 0; j < k; j++)
        if (!strcmp(fr[j].module, fr[k].module) && fr[j].name[0] && !transparent(&fr[j]) &&
            !fr[j].fw && !(j < 64 && (w->forwarders >> j & 1)))
            return 1;
    return 0;
}

/* the site's index by the boundary rule; 0 when the frames show no boundary. A frame of the
 * framework the run is in always belongs to it; a framework's run that reaches the system's
 * own code names the framework's entry (its outermost frame). The entry point (main, a
 * thread's start routine) is never the site while the program's own code stands between it
 * and the allocator: the first frame that left the allocator's namespace is (layers.py
 * boundary_split) */
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
    struct walk w = {0, 0};
    int site = walk_run(fr, n, i, &w);
    if (site <= -2)
        return -2 - site;
    if (site < 0)
        return w.widened; /* no boundary, unless the run left the allocator's namespace */
    while (site < n && (!fr[site].name[0] || transparent(&fr[site])))
        site++;
    if (site >= n || system_frame(&fr[site]))
        return 0;
    if (entry(fr, n, site) && owned(fr, site, &w))
        return w.widened && !strcmp(fr[w.widened].module, fr[site].module) ? w.widened : 0;
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
 * inlined subroutine there that neither the hints nor the shim's own reading named (dwarf.c);
 * where that cannot be told, only in the program's own code */
static int maybe_inlined(const struct frame *f)
{
    if (f->hinted || f->inlined || !f->offset || f->dwarf >= 0)
        return 0;
    int r = f->dwarf == -1
                ? -1
                : ct_dwarf_inlined_at(ct_module_path(f->ip), f->bid, f->blen, f->offset - 1);
    return r > 0 || (r < 0 && own_code(f));
}

/* the site: `name (file:line)` where its DWARF has a line table, as the reports name it, else
 * `name (module+0xoff)`; where the compiler inlined code at that address and neither the hints
 * nor the DWARF said which, that code inlined into it is not known here */
static size_t add_site(char *out, size_t o, size_t cap, const struct frame *f)
{
    char hexs[24], num[24];
    if (!f->module[0]) {
        ct_fmt_hex(hexs, f->ip);
        return add(out, o, cap, hexs);
    }
    if (f->name[0]) {
        o = add(out, o, cap, f->name);
        o = add(out, o, cap, " (");
    }
    if (f->name[0] && f->file[0] && f->line) {
        o = add(out, o, cap, f->file);
        o = add(out, o, cap, ":");
        ct_fmt_u64(num, f->line);
        return add(out, add(out, o, cap, num), cap, ")");
    }
    o = add(out, o, cap, f->module);
    o = add(out, o, cap, "+");
    ct_fmt_hex(hexs, f->offset);
    o = add(out, o, cap, hexs);
    if (maybe_inlined(f))
        o = add(out, o, cap, ", or a function inlined into it");
    return f->name[0] ? add(out, o, cap, ")") : o;
}

/* one frame of the denied call: a physical one (real) or one inlined at its address */
static void fill(struct frame *f, const struct ct_frame_desc *d, uintptr_t ip, int got,
                 const char *name, size_t encl, int real)
{
    ct_strlcpy(f->name, name, sizeof f->name);
    f->encl = encl;
    f->module = d->module;
    f->ip = ip;
    f->offset = d->offset;
    f->exe = d->exe;
    f->inlined = !real;
    f->bid = got ? d->build_id : NULL;
    f->blen = got ? d->build_id_len : 0;
    f->dwarf = -2;
    f->file[0] = 0;
    f->line = 0;
    set_scope(f);
    f->fw = got ? ct_fw_of(f->module, f->exe, f->name, rule_len(f)) : 0;
}

/* a name the DWARF gives (a linkage name, or a qualified one) as the reports shorten it */
static size_t dwarf_name(const char *raw, char *out, size_t cap)
{
    char full[1024];
    if (ct_demangle_any(raw, full, sizeof full))
        raw = full;
    return ct_shorten_name(raw, out, cap); /* control bytes: shim.c escapes the whole line */
}

/* the module's own DWARF at a frame of the program's code the hints do not cover: the calls
 * inlined there (innermost first, the concrete function last) into df; how many, -1 when it
 * cannot be told, -2 when not read (a system library's, past DWARF_READS) */
static int read_dwarf(const struct ct_frame_desc *d, uintptr_t ip, struct ct_dwarf_frame *df,
                      int *reads)
{
    const char *path = ct_module_path(ip);
    struct frame probe = {.exe = d->exe, .ip = ip};
    if (!df || !d->offset || !path || *reads >= DWARF_READS || !own_code(&probe))
        return -2;
    (*reads)++;
    return ct_dwarf_frames(path, d->build_id, d->build_id_len, d->offset - 1, df, DWARF_CHAIN);
}

/* the frames of ips (innermost first, CUDA's own left out), each preceded by the frames the
 * hints say were inlined at it, else those its DWARF says were; returns how many */
static int read_frames(const uintptr_t *ips, int n, struct frame *fr)
{
    struct ct_dwarf_frame *df = malloc(DWARF_CHAIN * sizeof *df);
    int m = 0, reads = 0;
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
        int nd = got && ni < 0 ? read_dwarf(&d, ips[k], df, &reads) : -2;
        for (int j = 0; j < ni && m < DENY_FRAMES; j++) {
            fill(&fr[m], &d, ips[k], got, inl[j], encl[j], 0);
            fr[m++].hinted = 1;
        }
        for (int j = 0; j + 1 < nd && m < DENY_FRAMES; j++) {
            char name[CT_INLINE_NAME];
            size_t e = dwarf_name(df[j].name, name, sizeof name);
            fill(&fr[m], &d, ips[k], got, name, e, 0);
            fr[m].hinted = 0;
            ct_strlcpy(fr[m].file, df[j].file, sizeof fr[m].file);
            fr[m++].line = df[j].line;
        }
        if (m >= DENY_FRAMES)
            break;
        struct frame *f = &fr[m++];
        fill(f, &d, ips[k], got, got ? d.name : "", got ? d.encl : 0, 1);
        f->hinted = ni >= 0;
        f->dwarf = nd;
        if (nd > 0) {
            ct_strlcpy(f->file, df[nd - 1].file, sizeof f->file);
            f->line = df[nd - 1].line;
        }
    }
    free(df);
    return m;
}

/* the site's file and line where the hints named the frames inlined at its address (they
 * hold no lines): the DWARF read at that address alone, the site found among its frames by
 * name (the hints leave std:: frames out) */
static void site_line(struct frame *f)
{
    if (!f->hinted || f->file[0] || !f->offset || !own_code(f))
        return;
    struct ct_dwarf_frame *df = malloc(DWARF_CHAIN * sizeof *df);
    const char *path = ct_module_path(f->ip);
    int nd =
        df && path ? ct_dwarf_frames(path, f->bid, f->blen, f->offset - 1, df, DWARF_CHAIN) : -1;
    int at = f->inlined ? -1 : nd - 1;
    for (int j = nd - 2; f->inlined && j >= 0 && at < 0; j--) {
        char name[CT_INLINE_NAME];
        dwarf_name(df[j].name, name, sizeof name);
        if (!strcmp(name, f->name))
            at = j;
    }
    if (at >= 0) {
        ct_strlcpy(f->file, df[at].file, sizeof f->file);
        f->line = df[at].line;
    }
    free(df);
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
    ct_function_idents(ips, (size_t)nc, fn);
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
    site_line(&fr[site]);
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
