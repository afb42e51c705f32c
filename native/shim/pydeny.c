/* pydeny.c - the code a denial names when Python code made the call (pydeny.h).
 *
 * In a process running CPython the allocation goes through the interpreter (ctypes, a
 * framework's binding), and the site the reports name is a Python line (docs/python-frames.md,
 * cudatrace/analyze/sites/stacks.py split): the native frames beneath the innermost Python frame are
 * how that Python-level call was carried out (their `via`); an installed framework's Python
 * frames (site-packages, dist-packages) and the standard library's between them fold up to the
 * first frame outside it (symbols/python.py framework_end); Python functions that the stacks
 * recorded so far show to be allocator layers fold above that (graph.c, the reports' rule).
 * Here the same, from what the shim reads of the thread's frames (pyframes.c: file, qualified
 * name, line from the code object's location table). Where it cannot read them (Python frames
 * off, a version it does not know, no frame on the thread) the line says so and gives the
 * native frames up to the interpreter as the raw location, never one of them as the site.
 * Cold path only. */
#include "pydeny.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "graph.h"
#include "modules.h"
#include "pyframes.h"
#include "util.h"

#define PY_FRAMES 128
#define NAT_FRAMES 64
#define CALLERS_SHOWN 8

struct nat {
    char name[200]; /* short name; "" without a symbol */
    const char *module;
    uintptr_t ip, offset;
    int glue, eval; /* Python's call machinery; the eval loop */
};

static size_t add(char *out, size_t o, size_t cap, const char *s)
{
    return o < cap ? o + ct_strlcpy(out + o, s, cap - o) : o;
}

/* Python's own call machinery between a Python line and the native code it called (sites.py
 * PY_GLUE_MODULES, and the interpreter's own module) */
static int glue_module(const char *m, const char *interp)
{
    static const char *const mods[] = {"libpython3", "python3", "libffi.so", "_ctypes.",
                                       "_ctypes_test."};
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++)
        if (!strncmp(m, mods[i], strlen(mods[i])))
            return 1;
    return interp[0] && !strcmp(m, interp);
}

/* the native frames outside CUDA, innermost first, each marked glue or eval loop */
static int read_native(const uintptr_t *ips, int n, struct nat *nf)
{
    char interp[200] = "";
    struct ct_frame_desc d;
    uintptr_t ev = ct_py_eval_start();
    if (ev && ct_frame_info(ev + 1, &d))
        ct_strlcpy(interp, d.module, sizeof interp);
    int m = 0;
    for (int k = 0; k < n && m < NAT_FRAMES; k++) {
        int got = ct_frame_info(ips[k], &d);
        if (got == 2 && k)
            continue; /* CUDA's own (ips[0] is the first frame outside it already) */
        struct nat *f = &nf[m++];
        ct_strlcpy(f->name, got ? d.name : "", sizeof f->name);
        f->module = got ? d.module : "";
        f->ip = ips[k];
        f->offset = got ? d.offset : 0;
        f->eval =
            !strncmp(f->name, "_PyEval_EvalFrame", 17) || !strncmp(f->name, "PyEval_EvalCode", 15);
        f->glue = f->eval || glue_module(f->module, interp);
    }
    return m;
}

static size_t add_native(char *out, size_t o, size_t cap, const struct nat *f, int where)
{
    char buf[240], hexs[24];
    if (f->name[0] && !where)
        return add(out, o, cap, f->name);
    if (!f->module[0]) {
        ct_fmt_hex(hexs, f->ip);
        return add(out, o, cap, hexs);
    }
    if (f->name[0]) {
        o = add(out, o, cap, f->name);
        o = add(out, o, cap, " (");
    }
    ct_strlcpy(buf, f->module, sizeof buf);
    o = add(out, o, cap, buf);
    o = add(out, o, cap, "+");
    ct_fmt_hex(hexs, f->offset);
    o = add(out, o, cap, hexs);
    return f->name[0] ? add(out, o, cap, ")") : o;
}

/* the function a comprehension or generator expression is written in (names.py
 * comprehension_owner: `load.<locals>.<listcomp>` -> `load`, `<genexpr>` -> `<module>`) into
 * out; 0 when the frame's code is none */
static int comprehension_owner(const char *name, char *out, size_t cap)
{
    static const char *const kinds[] = {"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        size_t k = strlen(kinds[i]);
        if (n < k || strcmp(name + n - k, kinds[i]))
            continue;
        size_t end = n - k;
        if (end && name[end - 1] != '.')
            continue;
        end = end ? end - 1 : 0;
        if (end >= 9 && !strncmp(name + end - 9, ".<locals>", 9))
            end -= 9;
        if (!end) {
            ct_strlcpy(out, "<module>", cap);
            return 1;
        }
        ct_strlcpy(out, name, end + 1 < cap ? end + 1 : cap);
        return 1;
    }
    return 0;
}

/* the name a frame is shown by: a comprehension's is its function's */
static const char *py_name(const struct ct_pyd_frame *f, char *buf, size_t cap)
{
    return comprehension_owner(f->name, buf, cap) ? buf : f->name;
}

/* frame k is the function of the comprehension just below it (CPython before 3.12 calls one as
 * a function): left out, as the reports leave it out (sites.py _comprehensions) */
static int owner_of_below(const struct ct_pyd_frame *py, int k)
{
    char owner[160];
    return k > 0 && comprehension_owner(py[k - 1].name, owner, sizeof owner) &&
           !strcmp(owner, py[k].name) && !strcmp(py[k - 1].where, py[k].where);
}

static size_t add_py(char *out, size_t o, size_t cap, const struct ct_pyd_frame *f, int where)
{
    char num[24], buf[160];
    o = add(out, o, cap, py_name(f, buf, sizeof buf));
    if (!where)
        return o;
    o = add(out, o, cap, " (");
    o = add(out, o, cap, f->base);
    o = add(out, o, cap, ":");
    if (f->line > 0)
        ct_fmt_u64(num, (uint64_t)f->line);
    else
        ct_strlcpy(num, "?", sizeof num);
    o = add(out, o, cap, num);
    return add(out, o, cap, ")");
}

/* two installed packages of one framework (symbols/python.py one_framework) */
static int one_framework(const char *a, const char *b)
{
    while (*a == '_')
        a++;
    while (*b == '_')
        b++;
    size_t la = strlen(a), lb = strlen(b);
    const char *s = la < lb ? a : b, *l = la < lb ? b : a;
    size_t ls = la < lb ? la : lb;
    if (la == lb)
        return !strcasecmp(a, b);
    if (!ls || strncasecmp(l, s, ls))
        return 0;
    return !strcasecmp(l + ls, "lib") || l[ls] == '_';
}

/* the first Python frame outside the installed framework that allocated, or 0 when the
 * innermost frame is the program's or nothing lies outside (symbols/python.py framework_end) */
static int framework_end(const struct ct_pyd_frame *py, int n)
{
    if (py[0].kind == CT_PYO_PROGRAM)
        return 0;
    const char *fw = py[0].kind == CT_PYO_LIBRARY ? py[0].pkg : NULL;
    for (int i = 0; i < n; i++) {
        if (py[i].kind == CT_PYO_STDLIB)
            continue;
        if (py[i].kind == CT_PYO_LIBRARY && (!fw || one_framework(fw, py[i].pkg))) {
            fw = fw ? fw : py[i].pkg;
            continue;
        }
        return i;
    }
    return 0;
}

/* the site among the Python frames: past the framework, then up through the layers the
 * recorded stacks show */
static int python_site(const struct ct_pyd_frame *py, int n)
{
    int p = framework_end(py, n);
    uint64_t ident[PY_FRAMES];
    const char *where[PY_FRAMES];
    for (int k = p; k < n; k++) {
        ident[k - p] = py[k].ident;
        where[k - p] = py[k].where;
    }
    int k = p + ct_graph_py_cut(ident, where, n - p);
    return k >= n ? n - 1 : k; /* everything is allocator: the outermost frame asked */
}

static void python_line(const struct ct_pyd_frame *py, int pn, const struct nat *nf, int nn,
                        char *out, size_t cap)
{
    int site = python_site(py, pn), first = 1;
    if (owner_of_below(py, site))
        site--; /* the comprehension's own frame: its line */
    size_t o = add_py(out, 0, cap, &py[site], 1);
    int below = 0; /* the native frames of the call, up to the eval loop, glue left out */
    while (below < nn && !nf[below].eval)
        below++;
    for (int k = site - 1; k >= -below; k--) { /* outermost first: Python's, then native */
        const struct nat *f = k < 0 ? &nf[below + k] : NULL;
        if ((f && f->glue) || (!f && owner_of_below(py, k)))
            continue;
        o = add(out, o, cap, first ? " via " : " > ");
        o = f ? add_native(out, o, cap, f, 0) : add_py(out, o, cap, &py[k], 0);
        first = 0;
    }
    for (int k = site + 1, shown = 0; k < pn; k++) {
        if (owner_of_below(py, k))
            continue;
        o = add(out, o, cap, !shown++ ? ", called from " : " <- ");
        if (k > site + CALLERS_SHOWN) {
            add(out, o, cap, "...");
            break;
        }
        o = add_py(out, o, cap, &py[k], 1);
    }
}

/* the process runs Python but its frames are not read here: say so, and give the native
 * frames up to the interpreter as the raw location (never as the site) */
static void unread_line(const char *why, const struct nat *nf, int nn, char *out, size_t cap)
{
    size_t o = add(out, 0, cap, "Python code whose frames the shim could not read (");
    o = add(out, o, cap, why ? why : "the interpreter's data (_PyRuntime) was not found");
    o = add(out, o, cap, "); raw native location, not the site: ");
    for (int k = 0; k < nn; k++) {
        if (k)
            o = add(out, o, cap, " <- ");
        o = add_native(out, o, cap, &nf[k], !k);
        if (nf[k].eval)
            break;
    }
}

int ct_pydeny_describe(const uintptr_t *ips, int n, char *out, size_t cap)
{
    struct ct_pyd_frame *py = malloc(PY_FRAMES * sizeof *py); /* cold path: large */
    struct nat *nf = malloc(NAT_FRAMES * sizeof *nf);
    const char *why = NULL;
    int done = 0;
    if (py && nf) {
        int pn = ct_py_deny_frames(py, PY_FRAMES, &why);
        int nn = read_native(ips, n, nf), shows = 0;
        for (int k = 0; k < nn && !shows; k++)
            shows = nf[k].eval || (nf[k].glue && strncmp(nf[k].module, "libffi", 6));
        if (pn > 0) {
            python_line(py, pn, nf, nn, out, cap);
            done = 1;
        } else if (shows) { /* the interpreter is on the stack, its frames are not read */
            unread_line(why, nf, nn, out, cap);
            done = 1;
        }
    }
    free(py);
    free(nf);
    return done;
}
