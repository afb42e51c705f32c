/* modules.c - the module map: every loaded ELF object's path, load bias, address range and
 * GNU build-id, written as MODULE records so a trace can be symbolized offline, elsewhere.
 * Objects loaded later (dlopen) are picked up the first time a new stack frame falls outside
 * every known module. Also: a cold-path symbol lookup for one-line messages (budget denials).
 */
#include "modules.h"

#include <pthread.h>

#include "demangle.h"
#include "trace_format.h"
#include "util.h"
#include "writer.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_MODULES 8192
#define MF_SHIM 1
#define MF_CUDA 2
#define MF_EXE 4 /* the program itself */

struct mod {
    uintptr_t start, end, base;
    int flags;
    uint32_t blen; /* GNU build-id, read while the loader vouches for the object */
    uint8_t bid[64];
    char path[256];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static void (*on_grow)(void); /* ct_modules_on_grow: the module above that wants to know */
static struct mod mods[MAX_MODULES];
static uint32_t nmods; /* published with release: readers need no lock */
static uintptr_t shim_start, shim_end;

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int is_cuda_name(const char *path)
{
    const char *b = base_name(path);
    return strncmp(b, "libcuda.so", 10) == 0 || strncmp(b, "libcudart.so", 12) == 0 ||
           strncmp(b, "libnvidia-ml.so", 15) == 0 || strncmp(b, "libcudatrace", 12) == 0;
}

static size_t build_id(struct dl_phdr_info *info, uint8_t *out, size_t cap)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE)
            continue;
        const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
        const uint8_t *end = p + ph->p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *n = (const ElfW(Nhdr) *)p;
            const uint8_t *name = p + sizeof *n;
            const uint8_t *desc = name + ((n->n_namesz + 3u) & ~3u);
            if (desc + n->n_descsz > end)
                break;
            if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && memcmp(name, "GNU", 4) == 0) {
                size_t len = n->n_descsz < cap ? n->n_descsz : cap;
                memcpy(out, desc, len);
                return len;
            }
            p = desc + ((n->n_descsz + 3u) & ~3u);
        }
    }
    return 0;
}

/* dl_iterate_phdr's callback runs under the loader's lock: it only notes new objects in
 * mods[], past the published count; their records are written after the walk (the writer may
 * open the trace, whose preamble asks the driver through dlopen: the loader's other lock) */
struct scan_ctx {
    uint32_t added;
};

static int scan_one(struct dl_phdr_info *info, size_t size, void *data)
{
    struct scan_ctx *ctx = data;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t s = info->dlpi_addr + ph->p_vaddr, e = s + ph->p_memsz;
        if (s < lo)
            lo = s;
        if (e > hi)
            hi = e;
    }
    if (hi == 0)
        return 0;
    uint32_t n = __atomic_load_n(&nmods, __ATOMIC_ACQUIRE) + ctx->added;
    for (uint32_t i = 0; i < n; i++)
        if (mods[i].start == lo && mods[i].base == info->dlpi_addr)
            return 0; /* already known */
    if (n >= MAX_MODULES)
        return 0;
    struct mod *m = &mods[n];
    m->start = lo;
    m->end = hi;
    m->base = info->dlpi_addr;
    m->flags = 0;
    const char *name = info->dlpi_name;
    char exe[256];
    if (!name || !name[0]) {
        ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[l > 0 ? l : 0] = 0;
        name = exe;
        m->flags |= MF_EXE;
    }
    ct_strlcpy(m->path, name, sizeof m->path);
    if (is_cuda_name(name))
        m->flags |= MF_CUDA;
    if (shim_start && lo <= shim_start && shim_start < hi)
        m->flags |= MF_SHIM | MF_CUDA;
    m->blen = (uint32_t)build_id(info, m->bid, sizeof m->bid);
    ctx->added++;
    return 0;
}

/* under mu, after the walk: write the new objects' records, then publish them */
static void emit_added(uint32_t from, uint32_t added)
{
    for (uint32_t i = from; i < from + added; i++) {
        const struct mod *m = &mods[i];
        size_t len = strlen(m->path);
        struct ct_rec_module rec = {ct_now_ns(), m->base, m->start, m->end, m->blen, (uint32_t)len};
        ct_rec_write(CT_REC_MODULE, &rec, sizeof rec, m->bid, m->blen, m->path, len + 1);
    }
    __atomic_store_n(&nmods, from + added, __ATOMIC_RELEASE);
}

void ct_modules_init(void)
{
    Dl_info di;
    if (dladdr((void *)&ct_modules_init, &di) && di.dli_fbase) {
        shim_start = (uintptr_t)&ct_modules_init;
        /* the whole object: find it among the loaded ones */
        struct scan_ctx ctx = {0};
        pthread_mutex_lock(&mu);
        dl_iterate_phdr(scan_one, &ctx);
        for (uint32_t i = 0; i < nmods + ctx.added; i++) {
            if (mods[i].flags & MF_SHIM) {
                shim_start = mods[i].start;
                shim_end = mods[i].end;
            }
        }
        nmods = 0; /* nothing written yet: the trace file gets them later */
        pthread_mutex_unlock(&mu);
    }
}

int ct_in_shim(uintptr_t ip) { return ip >= shim_start && ip < shim_end; }

static const struct mod *find(uintptr_t ip)
{
    uint32_t n = __atomic_load_n(&nmods, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n; i++)
        if (ip >= mods[i].start && ip < mods[i].end)
            return &mods[i];
    return NULL;
}

int ct_modules_covers(uintptr_t ip) { return find(ip) != NULL; }

void ct_modules_scan(void)
{
    struct scan_ctx ctx = {0};
    pthread_mutex_lock(&mu);
    uint32_t before = nmods;
    dl_iterate_phdr(scan_one, &ctx);
    emit_added(before, ctx.added);
    int grew = ctx.added != 0;
    pthread_mutex_unlock(&mu);
    void (*grown)(void) = __atomic_load_n(&on_grow, __ATOMIC_ACQUIRE);
    if (grew && grown)
        grown(); /* perhaps a libpython loaded by dlopen (pyframes, through shim.c) */
}

void ct_modules_on_grow(void (*fn)(void)) { __atomic_store_n(&on_grow, fn, __ATOMIC_RELEASE); }

void ct_modules_reset(void)
{
    pthread_mutex_init(&mu, NULL);
    __atomic_store_n(&nmods, 0, __ATOMIC_RELEASE);
}

/* ---- cold path: name the function that contains ip, from the module file's symbols ----- */

static size_t put(char *out, size_t o, size_t cap, const char *s, size_t n)
{
    while (n-- && *s && o + 1 < cap)
        out[o++] = *s++;
    out[o] = 0;
    return o;
}

/* the qualifiers a member function's parameter list may carry: " const", " &&" ... */
static size_t skip_quals(const char *s)
{
    static const char *const quals[] = {" const", " volatile", " &&", " &", " noexcept"};
    size_t i = 0;
    for (int again = 1; again;) {
        again = 0;
        for (size_t q = 0; q < sizeof quals / sizeof quals[0]; q++) {
            size_t l = strlen(quals[q]);
            if (!strncmp(s + i, quals[q], l)) {
                i += l;
                again = 1;
            }
        }
    }
    return i;
}

/* a lambda's closure as cudatrace/analyze/sites/names.py writes it: `{lambda#1}` and `$_0` ->
 * `{lambda}`, `{lambda#2}` and `$_1` -> `{lambda#2}`, its `::operator()` (or static invoker
 * `::_FUN`) dropped; rewritten from a copy into out (cap bytes) */
static size_t tidy_lambdas(char *out, size_t cap)
{
    char in[512];
    ct_strlcpy(in, out, sizeof in);
    size_t r = 0, o = 0;
    out[0] = 0;
    while (in[r]) {
        size_t l = 0;
        unsigned long n = 0;
        if (!strncmp(in + r, "{lambda#", 8)) {
            l = 8;
            while (in[r + l] >= '0' && in[r + l] <= '9')
                n = n * 10 + (unsigned long)(in[r + l++] - '0');
            l = in[r + l] == '}' ? l + 1 : 0;
        } else if (in[r] == '$' && in[r + 1] == '_' && in[r + 2] >= '0' && in[r + 2] <= '9') {
            l = 2;
            while (in[r + l] >= '0' && in[r + l] <= '9')
                n = n * 10 + (unsigned long)(in[r + l++] - '0');
            n++;
        }
        if (!l) {
            o = put(out, o, cap, in + r++, 1);
            continue;
        }
        if (n > 1) {
            char num[24];
            ct_fmt_u64(num, n);
            o = put(out, o, cap, "{lambda#", 8);
            o = put(out, o, cap, num, strlen(num));
            o = put(out, o, cap, "}", 1);
        } else
            o = put(out, o, cap, "{lambda}", 8);
        r += l;
        static const char *const calls[] = {"::operator()", "::_FUN"};
        for (int c = 0; c < 2; c++) {
            size_t cl = strlen(calls[c]);
            if (!strncmp(in + r, calls[c], cl) && (!in[r + cl] || !strncmp(in + r + cl, "::", 2)))
                r += cl;
        }
    }
    return o;
}

/* A demangled C++ name shortened as reports show it (cudatrace/analyze/sites/names.py): argument
 * lists and template arguments elided, the return type and ABI/clone tags dropped,
 * "(anonymous namespace)" as "(anon)", a lambda as `Enclosing::{lambda}`, a block as
 * `Enclosing::{block}`. A C name is copied as it is. Returns the length of the prefix that
 * names the function a lambda, block or local class is in (0 for any other function): the
 * boundary rule scopes the local entity by it (deny.c). */
/* out[0, o) without its trailing spaces and qualifiers (const, &&, noexcept ...): the new o */
static size_t cut_trailing_quals(char *out, size_t o)
{
    static const char *const quals[] = {" const", " volatile", " &&", " &", " noexcept"};
    for (;;) {
        while (o && out[o - 1] == ' ')
            out[--o] = 0;
        int cut = 0;
        for (size_t q = 0; q < sizeof quals / sizeof quals[0]; q++) {
            size_t l = strlen(quals[q]);
            if (o > l && strcmp(out + o - l, quals[q]) == 0) {
                o -= l;
                out[o] = 0;
                cut = 1;
            }
        }
        if (!cut)
            return o;
    }
}

size_t ct_shorten_name(const char *in, char *out, size_t cap)
{
    static const char anon[] = "(anonymous namespace)";
    static const char block[] = "invocation function for block in ";
    static const char opchars[] = "()[]<>=!+-*/%^&|~,";
    size_t o = 0, encl = 0;
    int angle = 0, paren = 0, square = 0;
    out[0] = 0;
    if (!strncmp(in, block, sizeof block - 1)) {
        ct_shorten_name(in + sizeof block - 1, out, cap);
        size_t l = strlen(out);
        if (l + 10 < cap)
            ct_strlcpy(out + l, "::{block}", cap - l);
        return l;
    }
    for (size_t i = 0; in[i]; i++) {
        int top = !angle && !paren && !square;
        if (strncmp(in + i, anon, sizeof anon - 1) == 0) {
            if (top)
                o = put(out, o, cap, "(anon)", 6);
            i += sizeof anon - 2;
            continue;
        }
        if (top && strncmp(in + i, "operator", 8) == 0 && !strchr(opchars, in[i + 8]) &&
            in[i + 8] != ' ') {
            /* an identifier that starts with "operator": ordinary text */
        } else if (top && strncmp(in + i, "operator", 8) == 0) {
            size_t j = i + 8;
            if (in[j] == '(' && in[j + 1] == ')')
                j += 2;
            else
                while (in[j] && strchr(opchars, in[j]) && in[j] != '(')
                    j++;
            o = put(out, o, cap, in + i, j - i);
            i = j - 1;
            continue;
        }
        char c = in[i];
        if (c == '[' && !angle && !paren) {
            square++;
            continue;
        }
        if (c == ']' && square) {
            square--;
            continue;
        }
        if (c == '<' && !paren && !square) {
            if (!angle)
                o = put(out, o, cap, "<...>", 5);
            angle++;
            continue;
        }
        if (c == '>' && angle && !paren) {
            angle--;
            continue;
        }
        if (c == '(' && !square) {
            paren++;
            continue;
        }
        if (c == ')' && paren) {
            if (--paren == 0 && !angle && !square) { /* a function's parameters end here */
                size_t q = skip_quals(in + i + 1);
                if (!strncmp(in + i + 1 + q, "::", 2)) { /* ... and a local entity follows */
                    if (!encl)
                        encl = o;
                    i += q;
                }
            }
            continue;
        }
        if (top)
            o = put(out, o, cap, &c, 1);
    }
    /* trailing qualifiers, then the return type before the name */
    o = cut_trailing_quals(out, o);
    if (strchr(out, '{') || strchr(out, '$'))
        o = tidy_lambdas(out, cap);
    /* the return type: the last top-level space before the name (none inside a lambda's
     * label, whose parameters are gone) */
    char *sp = strrchr(out, ' ');
    if (sp && sp[1]) {
        size_t cut = (size_t)(sp + 1 - out);
        memmove(out, sp + 1, strlen(sp + 1) + 1);
        encl = encl > cut ? encl - cut : 0;
    }
    return encl;
}

/* __cxa_demangle from a libstdc++ that is not in the global scope (loaded RTLD_LOCAL, as a
 * Python extension's dependency is): the cold path of a denial line only. */
struct find_loaded {
    const char *prefix;
    char path[512];
};

static int find_loaded_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct find_loaded *f = data;
    const char *n = info->dlpi_name, *b = n ? strrchr(n, '/') : NULL;
    b = b ? b + 1 : n;
    if (!b || strncmp(b, f->prefix, strlen(f->prefix)) != 0)
        return 0;
    ct_strlcpy(f->path, n, sizeof f->path);
    return 1;
}

void *ct_sym_in_loaded(const char *prefix, const char *name)
{
    /* the walk only copies the path: dlopen inside dl_iterate_phdr's callback would take the
     * loader's other lock while holding this one (a thread in dlopen holds them the other way
     * round) */
    struct find_loaded f = {prefix, {0}};
    dl_iterate_phdr(find_loaded_cb, &f);
    if (!f.path[0])
        return NULL;
    ct_dlsym_fn ds = ct_real_dlsym(); /* not the dlsym the shim exports */
    void *h = ds ? dlopen(f.path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    void *p = h ? ds(h, name) : NULL;
    if (h)
        ct_real_dlclose()(h); /* NOLOAD took a reference of its own: the object stays as it
                               * was; the real dlclose, not the shim's, which would flush every
                               * thread's unwind rules for an object that cannot go away */
    return p;
}

int ct_demangle_any(const char *mangled, char *out, size_t cap)
{
    typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);
    if (mangled[0] != '_' || mangled[1] != 'Z')
        return 0;
    if (ct_demangle(mangled, out, cap))
        return 1;                     /* our own: also without a C++ runtime to ask (demangle.c) */
    ct_dlsym_fn ds = ct_real_dlsym(); /* not the dlsym the shim exports */
    demangle_fn dm = ds ? (demangle_fn)ds(RTLD_DEFAULT, "__cxa_demangle") : NULL;
    if (!dm) /* libstdc++ loaded RTLD_LOCAL (Python extensions): look inside it */
        dm = (demangle_fn)ct_sym_in_loaded("libstdc++.so", "__cxa_demangle");
    int status = -1;
    char *d = dm ? dm(mangled, NULL, NULL, &status) : NULL;
    if (d && status == 0)
        ct_strlcpy(out, d, cap);
    void (*fr)(void *) = d && ds ? (void (*)(void *))ds(RTLD_DEFAULT, "free") : NULL;
    if (fr)
        fr(d);
    return d && status == 0;
}

static int lookup_symbol(const struct mod *m, uintptr_t ip, char *out, size_t outlen,
                         uintptr_t *sym_off)
{
    int f = open(m->path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return 0;
    struct stat st;
    int ok = 0;
    if (fstat(f, &st) == 0 && st.st_size > (off_t)sizeof(ElfW(Ehdr))) {
        uint8_t *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, f, 0);
        if (map != MAP_FAILED) {
            const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)map;
            uintptr_t want = ip - m->base;
            size_t best_val = 0;
            const char *best = NULL;
            if (memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_shoff &&
                eh->e_shoff + (size_t)eh->e_shnum * sizeof(ElfW(Shdr)) <= (size_t)st.st_size) {
                const ElfW(Shdr) *sh = (const ElfW(Shdr) *)(map + eh->e_shoff);
                for (int pass = 0; pass < 2 && !best; pass++) {
                    uint32_t type = pass == 0 ? SHT_SYMTAB : SHT_DYNSYM;
                    for (int i = 0; i < eh->e_shnum; i++) {
                        if (sh[i].sh_type != type || sh[i].sh_link >= eh->e_shnum)
                            continue;
                        const ElfW(Shdr) *strs = &sh[sh[i].sh_link];
                        if (sh[i].sh_offset + sh[i].sh_size > (size_t)st.st_size ||
                            strs->sh_offset + strs->sh_size > (size_t)st.st_size)
                            continue;
                        const ElfW(Sym) *sym = (const ElfW(Sym) *)(map + sh[i].sh_offset);
                        size_t ns = sh[i].sh_size / sizeof(ElfW(Sym));
                        for (size_t k = 0; k < ns; k++) {
                            if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || !sym[k].st_value)
                                continue;
                            if (want >= sym[k].st_value &&
                                want < sym[k].st_value + (sym[k].st_size ? sym[k].st_size : 1) &&
                                sym[k].st_value >= best_val && sym[k].st_name < strs->sh_size) {
                                best_val = sym[k].st_value;
                                best = (const char *)map + strs->sh_offset + sym[k].st_name;
                            }
                        }
                    }
                }
            }
            if (best) {
                if (!ct_demangle_any(best, out, outlen))
                    ct_strlcpy(out, best, outlen);
                *sym_off = want - best_val;
                ok = 1;
            }
            munmap(map, (size_t)st.st_size);
        }
    }
    close(f);
    return ok;
}

static int is_runtime_symbol(const char *s)
{
    /* the CUDA runtime linked statically into the program is not the caller to name */
    if (strncmp(s, "cuda", 4) == 0 || strstr(s, "cudart") != NULL)
        return 1;
    return s[0] == 'c' && s[1] == 'u' && s[2] >= 'A' && s[2] <= 'Z'; /* cuMemAlloc ... */
}

/* ---- cold path: the functions of many addresses at once (a denial's call graph) -------- */

struct at_off {
    uintptr_t off; /* ip - 1 - the module's bias */
    size_t idx;
};

static int by_off(const void *a, const void *b)
{
    uintptr_t x = ((const struct at_off *)a)->off, y = ((const struct at_off *)b)->off;
    return x < y ? -1 : x > y;
}

/* one module's addresses (sorted): their functions from one pass over its symbol table, each
 * as its identity (its module and its short name) */
static void module_starts(const struct mod *m, struct at_off *at, size_t n, uint64_t *starts)
{
    int f = open(m->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (f < 0)
        return;
    uintptr_t *best = calloc(n, sizeof *best);
    const char **names = calloc(n, sizeof *names);
    uint8_t *map = MAP_FAILED;
    size_t size = 0;
    if (best && names && fstat(f, &st) == 0 && st.st_size > (off_t)sizeof(ElfW(Ehdr))) {
        size = (size_t)st.st_size;
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, f, 0);
    }
    close(f);
    if (map == MAP_FAILED) {
        free(best);
        free(names);
        return;
    }
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)map;
    int ok = !memcmp(eh->e_ident, ELFMAG, SELFMAG) && eh->e_shoff &&
             eh->e_shoff + (size_t)eh->e_shnum * sizeof(ElfW(Shdr)) <= size;
    const ElfW(Shdr) *sh = ok ? (const ElfW(Shdr) *)(map + eh->e_shoff) : NULL;
    int found = 0;
    for (int pass = 0; ok && pass < 2 && !found; pass++) {
        uint32_t type = pass == 0 ? SHT_SYMTAB : SHT_DYNSYM;
        for (int i = 0; i < eh->e_shnum; i++) {
            if (sh[i].sh_type != type || sh[i].sh_link >= eh->e_shnum)
                continue;
            const ElfW(Shdr) *strs = &sh[sh[i].sh_link];
            if (sh[i].sh_offset + sh[i].sh_size > size || strs->sh_offset + strs->sh_size > size)
                continue;
            found = 1;
            const ElfW(Sym) *sym = (const ElfW(Sym) *)(map + sh[i].sh_offset);
            for (size_t k = 0; k < sh[i].sh_size / sizeof(ElfW(Sym)); k++) {
                uintptr_t v = sym[k].st_value, e = v + (sym[k].st_size ? sym[k].st_size : 1);
                if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || !v ||
                    sym[k].st_name >= strs->sh_size)
                    continue;
                size_t lo = 0, hi = n; /* the first address at or above v */
                while (lo < hi) {
                    size_t mid = (lo + hi) / 2;
                    if (at[mid].off < v)
                        lo = mid + 1;
                    else
                        hi = mid;
                }
                for (size_t a = lo; a < n && at[a].off < e; a++)
                    if (v >= best[a]) {
                        best[a] = v;
                        names[a] = (const char *)map + strs->sh_offset + sym[k].st_name;
                    }
            }
        }
    }
    uint64_t last = 0;
    for (size_t a = 0; a < n; a++) {
        if (!names[a])
            continue;
        if (is_runtime_symbol(names[a])) {
            starts[at[a].idx] = 1;
            continue;
        }
        if (a && names[a] != names[a - 1]) /* sorted: a function's addresses are together */
            last = 0;
        if (!last) {
            char full[1024], brief[512];
            const char *nm = ct_demangle_any(names[a], full, sizeof full) ? full : names[a];
            ct_shorten_name(nm, brief, sizeof brief);
            uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the module and the short name */
            for (const char *c = m->path; *c; c++)
                h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
            h = (h ^ 0xff) * 0x100000001b3ull;
            for (const char *c = brief[0] ? brief : nm; *c; c++)
                h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
            last = h | (1ull << 63); /* never 0 or 1: "unknown" and "CUDA's own" */
        }
        starts[at[a].idx] = last;
    }
    munmap(map, size);
    free(best);
    free(names);
}

void ct_function_idents(const uint64_t *ips, size_t n, uint64_t *starts)
{
    uint32_t nm = __atomic_load_n(&nmods, __ATOMIC_ACQUIRE);
    uint32_t *which = malloc(n * sizeof *which);
    struct at_off *at = malloc(n * sizeof *at);
    for (size_t i = 0; i < n; i++)
        starts[i] = 0;
    for (size_t i = 0; which && at && i < n; i++) {
        which[i] = nm;
        for (uint32_t k = 0; k < nm; k++)
            if (ips[i] >= mods[k].start && ips[i] < mods[k].end) {
                which[i] = k;
                break;
            }
    }
    for (uint32_t k = 0; which && at && k < nm; k++) {
        size_t c = 0;
        for (size_t i = 0; i < n; i++)
            if (which[i] == k) {
                if (mods[k].flags & MF_CUDA)
                    starts[i] = 1;
                else
                    at[c++] = (struct at_off){(uintptr_t)ips[i] - 1 - mods[k].base, i};
            }
        if (!c)
            continue;
        qsort(at, c, sizeof *at, by_off);
        module_starts(&mods[k], at, c, starts);
    }
    free(which);
    free(at);
}

void ct_describe_function(uintptr_t ip, char *out, size_t outlen)
{
    const struct mod *m = find(ip);
    char name[512], hex[24];
    uintptr_t off = 0;
    if (m && lookup_symbol(m, ip, name, sizeof name, &off)) {
        ct_shorten_name(name, out, outlen);
        if (out[0])
            return;
    }
    size_t l = 0;
    if (m) {
        l = ct_strlcpy(out, base_name(m->path), outlen);
        ip -= m->base;
        if (l < outlen)
            l += ct_strlcpy(out + l, "+", outlen - l);
    }
    ct_fmt_hex(hex, ip);
    if (l < outlen)
        ct_strlcpy(out + l, hex, outlen - l);
}

int ct_frame_info(uintptr_t ip, struct ct_frame_desc *d)
{
    const struct mod *m = find(ip);
    char full[512];
    uintptr_t off;
    d->name[0] = 0;
    d->encl = 0;
    d->exe = 0;
    d->module = "";
    d->offset = ip;
    d->build_id = NULL;
    d->build_id_len = 0;
    if (!m)
        return 0;
    d->module = base_name(m->path);
    d->offset = ip - m->base;
    d->exe = (m->flags & MF_EXE) != 0;
    d->build_id = m->bid;
    d->build_id_len = m->blen;
    if (m->flags & MF_CUDA)
        return 2;
    if (lookup_symbol(m, ip, full, sizeof full, &off)) {
        if (is_runtime_symbol(full))
            return 2;
        d->encl = ct_shorten_name(full, d->name, sizeof d->name);
    }
    return 1;
}

const char *ct_module_path(uintptr_t ip)
{
    const struct mod *m = find(ip);
    return m ? m->path : NULL;
}

int ct_is_cuda_frame(uintptr_t ip)
{
    const struct mod *m = find(ip);
    char name[512];
    uintptr_t off;
    if (m && (m->flags & MF_CUDA))
        return 1;
    return m && lookup_symbol(m, ip, name, sizeof name, &off) && is_runtime_symbol(name);
}

void ct_describe_address(uintptr_t ip, char *out, size_t outlen)
{
    const struct mod *m = find(ip);
    char name[512], hex[24];
    uintptr_t off = 0;
    out[0] = 0;
    if (!m) {
        ct_fmt_hex(hex, ip);
        ct_strlcpy(out, hex, outlen);
        return;
    }
    size_t l = 0;
    if (lookup_symbol(m, ip, name, sizeof name, &off)) {
        char shortn[512];
        ct_shorten_name(name, shortn, sizeof shortn);
        l += ct_strlcpy(out + l, shortn[0] ? shortn : name, outlen - l);
        if (l < outlen)
            l += ct_strlcpy(out + l, " (", outlen - l);
        if (l < outlen)
            l += ct_strlcpy(out + l, base_name(m->path), outlen - l);
        if (l < outlen)
            l += ct_strlcpy(out + l, "+", outlen - l);
        ct_fmt_hex(hex, ip - m->base);
        if (l < outlen)
            l += ct_strlcpy(out + l, hex, outlen - l);
        if (l < outlen)
            ct_strlcpy(out + l, ")", outlen - l);
    } else {
        l += ct_strlcpy(out + l, base_name(m->path), outlen - l);
        ct_fmt_hex(hex, ip - m->base);
        if (l < outlen)
            l += ct_strlcpy(out + l, "+", outlen - l);
        if (l < outlen)
            ct_strlcpy(out + l, hex, outlen - l);
    }
}

/* the first frame of ip[] that is the program's, not CUDA's (libraries or static runtime) */
uintptr_t ct_pick_caller(const uintptr_t *ips, int n)
{
    char name[512];
    for (int k = 0; k < n; k++) {
        const struct mod *m = find(ips[k]);
        if (m && (m->flags & MF_CUDA))
            continue;
        uintptr_t off;
        if (m && lookup_symbol(m, ips[k], name, sizeof name, &off) && is_runtime_symbol(name))
            continue;
        return ips[k];
    }
    return n > 0 ? ips[0] : 0;
}
