/* frameworks.c - the frameworks in force and the launcher's hints, for the denial's rule
 * (frameworks.h; docs/attribution.md).
 *
 * The table is native/include/frameworks.def, compiled in; a user's file named by
 * CUDATRACE_FRAMEWORKS (the syntax of cudatrace/frameworks.py: `NAME modules=a,b
 * namespaces=c,d keep=e` or `NAME off`) adds, replaces or removes entries. The launcher's hints
 * file (CUDATRACE_HINTS, written by cudatrace/record/hints.py before exec) adds what only
 * reading the binaries tells:
 *
 *     cudatrace-hints 1
 *     join BASENAME FRAMEWORK              a library installed with a framework, linked by it
 *     module BASENAME BUILDID|-            the inline frames of one module follow
 *     inline LO HI DEPTH NAME              offsets [LO, HI) run code of NAME inlined DEPTH deep
 *
 * All of it is read once, at the first denial (cold path), into static storage; the hints
 * stay mapped. Nothing here runs on an allocation's path. */
#include "frameworks.h"

#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modules.h"
#include "util.h"

#define MAX_FW 32
#define MAX_TOK 24
#define MAX_JOIN 64
#define POOL_SIZE 16384
#define USER_FILE_MAX 16384

struct fw {
    const char *name; /* NULL: turned off */
    const char *mods[MAX_TOK], *nss[MAX_TOK], *keep[MAX_TOK];
    int nmods, nnss, nkeep;
};

static struct fw fws[MAX_FW];
static int nfw;
static char pool[POOL_SIZE];
static size_t pool_used;
static struct {
    const char *module;
    int fw;
} joins[MAX_JOIN];
static int njoin;
static const char *hints; /* the mapped hints file, NUL-free text; NULL without one */
static size_t hints_len;
static pthread_once_t loaded = PTHREAD_ONCE_INIT;

static const char *pool_copy(const char *s, size_t n)
{
    if (pool_used + n + 1 > sizeof pool)
        return NULL;
    char *p = pool + pool_used;
    memcpy(p, s, n);
    p[n] = 0;
    pool_used += n + 1;
    return p;
}

static int is_sep(char c) { return c == ' ' || c == ',' || c == '\t'; }

/* the tokens of s[0..n) (separated by spaces or commas), copied, into out[] */
static int tokens(const char *s, size_t n, const char **out)
{
    int k = 0;
    size_t i = 0;
    while (i < n && k < MAX_TOK) {
        while (i < n && is_sep(s[i]))
            i++;
        size_t j = i;
        while (j < n && !is_sep(s[j]))
            j++;
        if (j > i && (out[k] = pool_copy(s + i, j - i)))
            k++;
        i = j;
    }
    return k;
}

static int find_fw(const char *name, size_t n)
{
    for (int i = 0; i < nfw; i++)
        if (fws[i].name && strlen(fws[i].name) == n && !strncmp(fws[i].name, name, n))
            return i;
    return -1;
}

/* the entry named name (replaced if there is one), its fields left empty */
static struct fw *entry(const char *name, size_t n)
{
    int i = find_fw(name, n);
    if (i < 0) {
        if (nfw == MAX_FW)
            return NULL;
        i = nfw++;
    }
    struct fw *f = &fws[i];
    memset(f, 0, sizeof *f);
    f->name = pool_copy(name, n);
    return f->name ? f : NULL;
}

static void load_shipped(void)
{
    struct fw *f;
#define CT_FRAMEWORK(NAME, MODS, NSS, KEEP)                                                        \
    if ((f = entry(NAME, strlen(NAME)))) {                                                         \
        f->nmods = tokens(MODS, strlen(MODS), f->mods);                                            \
        f->nnss = tokens(NSS, strlen(NSS), f->nss);                                                \
        f->nkeep = tokens(KEEP, strlen(KEEP), f->keep);                                            \
    }
#include "frameworks.def"
#undef CT_FRAMEWORK
}

/* one line of the user's file: `NAME off` or `NAME key=v,v ...` */
static void user_line(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && is_sep(s[i]))
        i++;
    size_t name = i;
    while (i < n && !is_sep(s[i]))
        i++;
    size_t nl = i - name;
    while (i < n && is_sep(s[i]) && s[i] != ',')
        i++;
    if (!nl)
        return;
    if (n - i >= 3 && !strncmp(s + i, "off", 3) && (n - i == 3 || is_sep(s[i + 3]))) {
        int k = find_fw(s + name, nl);
        if (k >= 0)
            fws[k].name = NULL;
        return;
    }
    struct fw *f = entry(s + name, nl);
    while (f && i < n) {
        size_t w = i;
        while (i < n && s[i] != ' ' && s[i] != '\t')
            i++;
        const char *eq = memchr(s + w, '=', i - w);
        if (eq) {
            size_t kl = (size_t)(eq - (s + w)), vl = i - (size_t)(eq + 1 - s);
            if (kl == 7 && !strncmp(s + w, "modules", 7))
                f->nmods = tokens(eq + 1, vl, f->mods);
            else if (kl == 10 && !strncmp(s + w, "namespaces", 10))
                f->nnss = tokens(eq + 1, vl, f->nss);
            else if (kl == 4 && !strncmp(s + w, "keep", 4))
                f->nkeep = tokens(eq + 1, vl, f->keep);
        }
        while (i < n && (s[i] == ' ' || s[i] == '\t'))
            i++;
    }
}

static void load_user(const char *path)
{
    static char buf[USER_FILE_MAX];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    for (ssize_t a = 0; n > 0 && a < n;) {
        ssize_t b = a;
        while (b < n && buf[b] != '\n')
            b++;
        const char *hash = memchr(buf + a, '#', (size_t)(b - a));
        user_line(buf + a, (size_t)((hash ? hash - buf : b) - a));
        a = b + 1;
    }
}

/* the next line of the hints from *p: its start and length; 0 at the end */
static size_t next_line(size_t *p, const char **line)
{
    if (*p >= hints_len)
        return 0;
    const char *s = hints + *p, *nl = memchr(s, '\n', hints_len - *p);
    size_t n = nl ? (size_t)(nl - s) : hints_len - *p;
    *line = s;
    *p += n + 1;
    return n ? n : (size_t)-1; /* an empty line: not the end */
}

static void load_hints(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return;
    if (fstat(fd, &st) == 0 && st.st_size > 16 && S_ISREG(st.st_mode)) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED && !strncmp(m, "cudatrace-hints 1\n", 18)) {
            hints = m;
            hints_len = (size_t)st.st_size;
        } else if (m != MAP_FAILED)
            munmap(m, (size_t)st.st_size);
    }
    close(fd);
    size_t p = 0, n;
    const char *l;
    while (hints && (n = next_line(&p, &l)) && njoin < MAX_JOIN) {
        if (n == (size_t)-1 || n < 6 || strncmp(l, "join ", 5))
            continue;
        const char *sp = memchr(l + 5, ' ', n - 5);
        int k = sp ? find_fw(sp + 1, (size_t)(l + n - sp - 1)) : -1;
        if (k >= 0 && (joins[njoin].module = pool_copy(l + 5, (size_t)(sp - l - 5))))
            joins[njoin++].fw = k;
    }
}

static void load(void)
{
    load_shipped();
    const char *user = ct_setting(CT_SET_FRAMEWORKS);
    if (user && user[0])
        load_user(user);
    const char *h = ct_setting(CT_SET_HINTS);
    if (h && h[0])
        load_hints(h);
}

static int module_match(const char *module, const char *prefix)
{
    size_t l = strlen(prefix);
    if (strncmp(module, prefix, l))
        return 0;
    char c = module[l];
    return !c || c == '-' || c == '_' || c == '.' || (c >= '0' && c <= '9');
}

static int name_match(const struct fw *f, const char *rule, size_t len)
{
    const char *q = NULL;
    int depth = 0;
    for (size_t i = 0; i + 1 < len && !q; i++) {
        char c = rule[i];
        if (c == '<' || c == '(' || c == '{' || c == '[')
            depth++;
        else if ((c == '>' || c == ')' || c == '}' || c == ']') && depth)
            depth--;
        else if (!depth && c == ':' && rule[i + 1] == ':')
            q = rule + i;
    }
    for (int k = 0; k < f->nnss; k++) {
        const char *ns = f->nss[k];
        size_t l = strlen(ns);
        if (l && ns[l - 1] == '*') {
            if (!q && len >= l - 1 && !strncmp(rule, ns, l - 1))
                return 1;
        } else if (q && (size_t)(q - rule) == l && !strncmp(rule, ns, l))
            return 1;
    }
    return 0;
}

static int kept(const struct fw *f, const char *rule, size_t len)
{
    for (int k = 0; k < f->nkeep; k++) {
        size_t l = strlen(f->keep[k]);
        if (len >= l && !strncmp(rule, f->keep[k], l))
            return 1;
    }
    return 0;
}

unsigned ct_fw_of(const char *module, int exe, const char *rule, size_t len)
{
    pthread_once(&loaded, load);
    unsigned mask = 0;
    for (int i = 0; !exe && i < nfw; i++) {
        if (!fws[i].name)
            continue;
        for (int k = 0; k < fws[i].nmods && !(mask & (1u << i)); k++)
            if (module_match(module, fws[i].mods[k]))
                mask |= 1u << i;
    }
    for (int j = 0; !exe && j < njoin; j++)
        if (!strcmp(joins[j].module, module) && fws[joins[j].fw].name)
            mask |= 1u << joins[j].fw;
    for (int i = 0; !mask && len && i < nfw; i++)
        if (fws[i].name && name_match(&fws[i], rule, len))
            mask |= 1u << i;
    for (int i = 0; len && i < nfw; i++)
        if ((mask & (1u << i)) && kept(&fws[i], rule, len))
            mask &= ~(1u << i);
    return mask;
}

static uintptr_t hex(const char **s, const char *end)
{
    uintptr_t v = 0;
    for (; *s < end; (*s)++) {
        char c = **s;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            break;
        v = v * 16 + (uintptr_t)d;
    }
    while (*s < end && **s == ' ')
        (*s)++;
    return v;
}

/* `module BASENAME BUILDID|-` names this module (its build-id, when both know one) */
static int same_module(const char *l, size_t n, const char *module, const uint8_t *bid,
                       uint32_t blen)
{
    size_t ml = strlen(module);
    if (n < 7 + ml + 2 || strncmp(l + 7, module, ml) || l[7 + ml] != ' ')
        return 0;
    const char *id = l + 7 + ml + 1;
    size_t idl = n - 7 - ml - 1;
    if (idl == 1 && id[0] == '-')
        return 1;
    if (!blen || idl != 2 * (size_t)blen)
        return 1;
    static const char digits[] = "0123456789abcdef";
    for (uint32_t i = 0; i < blen; i++)
        if (id[2 * i] != digits[bid[i] >> 4] || id[2 * i + 1] != digits[bid[i] & 15])
            return 0;
    return 1;
}

int ct_fw_inlines(const char *module, const uint8_t *bid, uint32_t blen, uintptr_t off,
                  char (*names)[CT_INLINE_NAME], size_t *encl, int max)
{
    pthread_once(&loaded, load);
    if (!hints)
        return -1;
    size_t p = 0, n;
    const char *l;
    int in = 0, covered = 0, got = 0;
    int depth[16];
    while ((n = next_line(&p, &l))) {
        if (n == (size_t)-1)
            continue;
        if (n > 7 && !strncmp(l, "module ", 7)) {
            in = same_module(l, n, module, bid, blen);
            covered |= in;
            continue;
        }
        if (!in || n < 8 || strncmp(l, "inline ", 7))
            continue;
        const char *s = l + 7, *end = l + n;
        uintptr_t lo = hex(&s, end), hi = hex(&s, end);
        int d = (int)hex(&s, end), dup = 0;
        for (int k = 0; k < got; k++)
            dup |= depth[k] == d; /* one call a depth: a function of two ranges lists it twice */
        if (off < lo || off >= hi || got == max || got == 16 || dup)
            continue;
        char full[512];
        size_t fl = (size_t)(end - s) < sizeof full - 1 ? (size_t)(end - s) : sizeof full - 1;
        memcpy(full, s, fl);
        full[fl] = 0;
        int at = got++; /* innermost (deepest) first */
        while (at > 0 && depth[at - 1] < d) {
            depth[at] = depth[at - 1];
            memcpy(names[at], names[at - 1], CT_INLINE_NAME);
            encl[at] = encl[at - 1];
            at--;
        }
        depth[at] = d;
        encl[at] = ct_shorten_name(full, names[at], CT_INLINE_NAME);
    }
    return covered ? got : -1;
}
