/* pyframes.c - the calling thread's Python stack, read as data (docs/python-frames.md).
 *
 * No libpython link, no Python headers, no interpreter call, no GIL, no reference count:
 *   - the interpreter is found at run time: the real dlsym of _PyRuntime, Py_Version (3.11+, data) and
 *     PyCode_Type; again after new modules appear (a program that dlopens libpython);
 *   - the layout is a checked per-version table (pylayouts.h), for 3.13 the interpreter's own
 *     _Py_DebugOffsets held to it, and a few facts of the live interpreter (type sizes);
 *   - the thread's PyThreadState comes from CPython's gilstate key (pthread_getspecific): it
 *     holds the thread's own state whether or not the thread holds the GIL, and CPython clears
 *     it when it deletes that state. So the state read is alive, it is this thread's, and its
 *     frame chain cannot change while this thread sits in our hook;
 *   - each code object is written once (PYCODE: file, qualified name, first line, line table),
 *     each distinct Python stack once (PYFRAME tree), and the event's native stack gets one link
 *     node naming its Python leaf, or why it has none. Lines are decoded offline.
 * A process without Python pays one pointer check per event.
 */
#include "pyframes.h"

#include "modules.h"
#include "trace_format.h"
#include "util.h"
#include "writer.h"
#include "pylayouts.h"

#include <dlfcn.h>
#include <pthread.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_PY_DEPTH 128
#define CODE_BITS 16
#define CODE_SIZE (1u << CODE_BITS)
#define PYNODE_BITS 20
#define PYNODE_SIZE (1u << PYNODE_BITS)
#define MAX_LINETABLE (256u << 10)

struct pyrt {
    uintptr_t runtime;   /* &_PyRuntime */
    uintptr_t code_type; /* &PyCode_Type */
    uintptr_t eval_start, eval_end;
    unsigned long version; /* Py_Version */
    struct ct_pylayout L;
    int why; /* 0 usable, else CT_PYWHY_UNSUPPORTED */
    char note[200];
};

static struct pyrt rt_storage;
struct pyrt *ct_py_rt;       /* published once found (or refused); pyframes.h */
int ct_py_modules_dirty = 1; /* a rescan found new modules: look for Python again */
int ct_py_state = 1; /* (ct_py_rt ? 2 : 0) | ct_py_modules_dirty, one word for the hot path */
static pthread_mutex_t detect_mu = PTHREAD_MUTEX_INITIALIZER;
static int info_written; /* the INFO records of this file */
static int disabled = -1;

/* code objects: address -> id, validated on every hit by what identifies the object */
struct codeent {
    uintptr_t addr, filename, qualname;
    int32_t firstlineno;
    uint32_t id;
    uint64_t ident; /* the function's identity (ct_py_ident): a denial's call graph */
};
/* Python stack tree nodes: (parent, code, lasti|flags) -> id */
struct pynode {
    uint32_t parent, code, lasti, flags, id, pad;
};
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct codeent *codes;
static uint32_t ncodes;
static struct pynode *nodes;
static uint32_t nnodes;
static uint32_t generation = 1;

/* per thread: the last Python stack (outermost first) and its node ids, for prefix reuse */
struct tframe {
    uintptr_t code, instr, filename, qualname;
    uint32_t lasti, flags, node, code_id;
};
/* per thread: nodes met before, (parent, frame) -> node, so that a few stacks alternating (an
 * alloc and a free a line apart) take no lock */
#define TNODES 256
struct tnode {
    uintptr_t code, instr, filename, qualname;
    uint32_t parent, flags, node, code_id;
};
struct tcache {
    uint32_t gen, n;
    struct tframe f[MAX_PY_DEPTH];
    struct tnode t[TNODES];
};
static CT_TLS struct tcache *tc;
static pthread_key_t tc_key; /* gives a thread's cache back when the thread ends */
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static int tc_key_ok;

static void tc_free(void *m)
{
    if (m == (void *)tc)
        tc = NULL; /* a later event of this thread (another destructor) */
    munmap(m, sizeof(struct tcache));
}

static void tc_key_init(void) { tc_key_ok = pthread_key_create(&tc_key, tc_free) == 0; }

static inline uintptr_t rd(uintptr_t a) { return *(const uintptr_t *)a; }
static inline int32_t rd32(uintptr_t a) { return *(const int32_t *)a; }
static inline uint8_t rd8(uintptr_t a) { return *(const uint8_t *)a; }

/* ---- finding and checking the interpreter ---------------------------------------------- */
static void *pysym(const char *name)
{
    ct_dlsym_fn ds = ct_real_dlsym(); /* not the dlsym the shim exports */
    void *p = ds ? ds(RTLD_DEFAULT, name) : NULL;
    if (!p) /* a libpython loaded RTLD_LOCAL by an embedder */
        p = ct_sym_in_loaded("libpython3", name);
    return p;
}

static void refuse(struct pyrt *p, const char *why)
{
    p->why = CT_PYWHY_UNSUPPORTED;
    ct_strlcpy(p->note, why, sizeof p->note);
}

static void check_debug_offsets(struct pyrt *p)
{
    const struct ct_py_debug_offsets_313 *d = (const void *)p->runtime;
    if (memcmp(d->cookie, "xdebugpy", 8) != 0) {
        refuse(p, "CPython 3.13: no _Py_DebugOffsets at the start of _PyRuntime");
        return;
    }
    if ((d->version >> 16) != (p->version >> 16)) {
        refuse(p, "CPython 3.13: _Py_DebugOffsets version differs from Py_Version");
        return;
    }
    if (d->free_threaded) {
        refuse(p, "free-threaded CPython (no GIL): not supported");
        return;
    }
    const struct ct_pylayout *T = &ct_pylayout_313;
    /* the interpreter's own offsets must be the ones the table was checked against */
    if (d->runtime_state.finalizing != T->rt_finalizing ||
        d->runtime_state.interpreters_head != T->rt_interp_head ||
        d->thread_state.interp != T->ts_interp || d->thread_state.thread_id != T->ts_thread_id ||
        d->thread_state.current_frame != T->ts_current_frame ||
        d->interpreter_frame.previous != T->fr_previous ||
        d->interpreter_frame.executable != T->fr_code ||
        d->interpreter_frame.instr_ptr != T->fr_instr ||
        d->interpreter_frame.owner != T->fr_owner || d->code_object.filename != T->co_filename ||
        d->code_object.qualname != T->co_qualname || d->code_object.linetable != T->co_linetable ||
        d->code_object.firstlineno != T->co_firstlineno ||
        d->code_object.co_code_adaptive != T->co_code_adaptive ||
        d->pyobject.ob_type != CT_PY_OB_TYPE || d->unicode_object.state != T->u_state ||
        d->unicode_object.length != T->u_length ||
        d->unicode_object.asciiobject_size != T->u_ascii_size ||
        d->bytes_object.ob_size != CT_PY_OB_SIZE || d->bytes_object.ob_sval != CT_PY_BYTES_SVAL) {
        refuse(p, "CPython 3.13: _Py_DebugOffsets differ from the layout checked for 3.13");
        return;
    }
}

/* with detect_mu held: look for the interpreter; 1 when the answer is final (found or refused) */
static int detect(struct pyrt *p)
{
    uintptr_t runtime = (uintptr_t)pysym("_PyRuntime");
    if (!runtime)
        return 0;
    memset(p, 0, sizeof *p);
    p->runtime = runtime;
    const unsigned long *ver = pysym("Py_Version");
    p->code_type = (uintptr_t)pysym("PyCode_Type");
    uintptr_t type_type = (uintptr_t)pysym("PyType_Type"),
              str_type = (uintptr_t)pysym("PyUnicode_Type");
    if (!ver) {
        refuse(p, "CPython older than 3.11 (no Py_Version): supported are 3.11, 3.12, 3.13");
        return 1;
    }
    p->version = *ver;
    unsigned major = (unsigned)(p->version >> 24) & 0xff,
             minor = (unsigned)(p->version >> 16) & 0xff;
    if (major != 3 || minor < 11 || minor > 13) {
        char num[24];
        size_t l = ct_strlcpy(p->note, "CPython ", sizeof p->note);
        ct_fmt_u64(num, major);
        l += ct_strlcpy(p->note + l, num, sizeof p->note - l);
        l += ct_strlcpy(p->note + l, ".", sizeof p->note - l);
        ct_fmt_u64(num, minor);
        l += ct_strlcpy(p->note + l, num, sizeof p->note - l);
        ct_strlcpy(p->note + l, ": layout not verified (supported are 3.11, 3.12, 3.13)",
                   sizeof p->note - l);
        p->why = CT_PYWHY_UNSUPPORTED;
        return 1;
    }
    p->L = minor == 11 ? ct_pylayout_311 : minor == 12 ? ct_pylayout_312 : ct_pylayout_313;
    if (minor == 13) {
        check_debug_offsets(p);
        if (p->why)
            return 1;
    }
    /* the live interpreter against the table: object header, code and str sizes */
    if (!p->code_type || !type_type || !str_type || rd(p->code_type + CT_PY_OB_TYPE) != type_type ||
        rd(str_type + CT_PY_OB_TYPE) != type_type ||
        (uint64_t)rd(p->code_type + CT_PY_TP_BASICSIZE) != p->L.co_code_adaptive ||
        (uint64_t)rd(str_type + CT_PY_TP_BASICSIZE) != p->L.u_basicsize) {
        refuse(p, "CPython build whose object layout differs from the default build's "
                  "(debug or trace-refs build?)");
        return 1;
    }
    /* the eval loop's address range, so offline merging needs no symbols of the interpreter */
    void *ev = pysym("_PyEval_EvalFrameDefault");
    Dl_info di;
    const ElfW(Sym) *sym = NULL;
    if (ev && dladdr1(ev, &di, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size) {
        p->eval_start = (uintptr_t)ev;
        p->eval_end = (uintptr_t)ev + sym->st_size;
    }
    return 1;
}

static void write_info(const char *key, const char *value)
{
    struct ct_rec_info r = {(uint16_t)strlen(key), (uint16_t)strlen(value), 0};
    ct_rec_write(CT_REC_INFO, &r, sizeof r, key, strlen(key) + 1, value, strlen(value) + 1);
}

static void write_infos(const struct pyrt *p)
{
    char v[64], num[24];
    size_t l = 0;
    ct_fmt_u64(num, (p->version >> 24) & 0xff);
    l += ct_strlcpy(v + l, num, sizeof v - l);
    l += ct_strlcpy(v + l, ".", sizeof v - l);
    ct_fmt_u64(num, (p->version >> 16) & 0xff);
    l += ct_strlcpy(v + l, num, sizeof v - l);
    l += ct_strlcpy(v + l, ".", sizeof v - l);
    ct_fmt_u64(num, (p->version >> 8) & 0xff);
    ct_strlcpy(v + l, num, sizeof v - l);
    write_info("python.version", p->version ? v : "unknown");
    write_info("python.status", p->why ? p->note : "ok");
    if (p->eval_start) {
        ct_fmt_hex(v, p->eval_start);
        l = strlen(v);
        v[l++] = '-';
        ct_fmt_hex(v + l, p->eval_end);
        write_info("python.eval_range", v);
    }
}

static struct pyrt *find_python(void)
{
    struct pyrt *p = __atomic_load_n(&ct_py_rt, __ATOMIC_ACQUIRE);
    if (p || !__atomic_load_n(&ct_py_modules_dirty, __ATOMIC_ACQUIRE))
        return p;
    /* never wait here: another thread may hold the loader lock and call into a hook */
    if (pthread_mutex_trylock(&detect_mu) != 0)
        return NULL;
    p = __atomic_load_n(&ct_py_rt, __ATOMIC_ACQUIRE);
    if (!p) {
        __atomic_store_n(&ct_py_modules_dirty, 0, __ATOMIC_RELEASE);
        if (detect(&rt_storage)) {
            p = &rt_storage;
            __atomic_store_n(&ct_py_rt, p, __ATOMIC_RELEASE);
            __atomic_or_fetch(&ct_py_state, 2, __ATOMIC_ACQ_REL);
        }
        /* not dirty now, unless a rescan said so again meanwhile (it sets both, the other way
         * round: either order leaves the bit as dirty is) */
        __atomic_and_fetch(&ct_py_state, ~1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&ct_py_modules_dirty, __ATOMIC_SEQ_CST))
            __atomic_or_fetch(&ct_py_state, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&detect_mu);
    return p;
}

/* At the shim's start (one thread, before the program's own threads race into the hooks):
 * find the interpreter now, so the first events of several threads all get their frames (a
 * thread that finds detection under way elsewhere never waits for it: it would get none). */
void ct_py_detect(void)
{
    if (disabled < 0)
        disabled = ct_setting_num(CT_SET_PYTHON) == 0;
    if (!disabled)
        (void)find_python();
    else /* native stacks only: never looked for (the cached stacks serve every event) */
        __atomic_store_n(&ct_py_state, 0, __ATOMIC_SEQ_CST);
}

void ct_py_modules_changed(void)
{
    if (!__atomic_load_n(&ct_py_rt, __ATOMIC_ACQUIRE) && disabled != 1) {
        __atomic_store_n(&ct_py_modules_dirty, 1, __ATOMIC_SEQ_CST);
        __atomic_or_fetch(&ct_py_state, 1, __ATOMIC_SEQ_CST);
    }
}

/* ---- whose code a Python file is, and a function's identity ------------------------------ */
static int ends_with(const char *s, size_t l, const char *suf)
{
    size_t k = strlen(suf);
    return l >= k && !memcmp(s + l - k, suf, k);
}

/* the last "/site-packages/" or "/dist-packages/" of path: what follows it; NULL when none */
static const char *installed_rel(const char *path)
{
    const char *rel = NULL;
    for (const char *c = strchr(path, '/'); c; c = strchr(c + 1, '/'))
        if (!strncmp(c + 1, "site-packages/", 14) || !strncmp(c + 1, "dist-packages/", 14))
            rel = c + 15;
    return rel;
}

/* the last "/lib/python3.N/" (lib64, a t after N): what follows it; NULL when none */
static const char *stdlib_rel(const char *path)
{
    const char *rel = NULL;
    for (const char *c = strchr(path, '/'); c; c = strchr(c + 1, '/')) {
        const char *q = c + 1;
        if (strncmp(q, "lib", 3))
            continue;
        q += 3;
        if (!strncmp(q, "64", 2))
            q += 2;
        if (strncmp(q, "/python3.", 9))
            continue;
        q += 9;
        if (*q < '0' || *q > '9')
            continue;
        while (*q >= '0' && *q <= '9')
            q++;
        if (*q == 't')
            q++;
        if (*q == '/')
            rel = q + 1;
    }
    return rel;
}

void ct_py_origin(const char *path, struct ct_py_origin *o)
{
    static const char *const sufs[] = {".py", ".pyc", ".so", ".pyd", ".egg", ".zip", ".whl"};
    o->kind = CT_PYO_PROGRAM;
    o->pkg = NULL;
    o->pkg_len = 0;
    if (!strncmp(path, "<frozen ", 8)) {
        o->kind = CT_PYO_STDLIB;
        o->where = path;
        return;
    }
    const char *rel = installed_rel(path);
    if (rel) {
        for (;;) { /* an egg or zip holds the package one level down */
            while (*rel == '/')
                rel++;
            const char *slash = strchr(rel, '/');
            size_t l = slash ? (size_t)(slash - rel) : 0;
            if (!slash || !(ends_with(rel, l, ".egg") || ends_with(rel, l, ".zip") ||
                            ends_with(rel, l, ".whl")))
                break;
            rel = slash + 1;
        }
        size_t top = strcspn(rel, "/");
        for (size_t i = 0; i < sizeof sufs / sizeof sufs[0]; i++)
            if (ends_with(rel, top, sufs[i])) {
                top = strcspn(rel, "."); /* the name up to its first dot */
                break;
            }
        o->kind = CT_PYO_LIBRARY;
        o->pkg = rel;
        o->pkg_len = top;
        o->where = rel;
        return;
    }
    rel = stdlib_rel(path);
    if (rel) {
        o->kind = CT_PYO_STDLIB;
        o->where = rel;
        return;
    }
    const char *base = strrchr(path, '/');
    o->where = base && base[1] ? base + 1 : path;
}

uint64_t ct_py_ident(const char *filename, const char *qualname)
{
    struct ct_py_origin o;
    ct_py_origin(filename, &o);
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over where, a separator, the qualified name */
    for (const char *c = o.where; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;
    for (const char *c = qualname; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    return h | (1ull << 63); /* never 0 or 1: the call graph's "unknown" and "CUDA" */
}

/* ---- code objects and the Python stack tree --------------------------------------------- */
static int ensure_tables(void)
{
    if (!codes) {
        void *m = mmap(NULL, sizeof(struct codeent) * CODE_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return 0;
        codes = m;
    }
    if (!nodes) {
        void *m = mmap(NULL, sizeof(struct pynode) * PYNODE_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return 0;
        nodes = m;
    }
    return 1;
}

/* a str as UTF-8 (compact forms, which is what code objects hold); length written */
static size_t read_str(const struct ct_pylayout *L, uintptr_t s, char *out, size_t cap)
{
    if (!s || cap < 4)
        return 0;
    uint32_t state = *(const volatile uint32_t *)(s + L->u_state);
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    uint64_t len = (uint64_t)rd(s + L->u_length);
    if (!compact || len > 4096)
        return 0;
    const uint8_t *data = (const uint8_t *)(s + (ascii ? L->u_ascii_size : L->u_compact_size));
    size_t o = 0;
    for (uint64_t i = 0; i < len; i++) {
        uint32_t c = kind == 1   ? data[i]
                     : kind == 2 ? ((const uint16_t *)data)[i]
                                 : ((const uint32_t *)data)[i];
        if (o + 5 >= cap)
            break;
        if (c < 0x80) {
            out[o++] = (char)c;
        } else if (c < 0x800) {
            out[o++] = (char)(0xC0 | (c >> 6));
            out[o++] = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            out[o++] = (char)(0xE0 | (c >> 12));
            out[o++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (c & 0x3F));
        } else {
            out[o++] = (char)(0xF0 | (c >> 18));
            out[o++] = (char)(0x80 | ((c >> 12) & 0x3F));
            out[o++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[o] = 0;
    return o;
}

/* with mu held: the id of the code object at addr (written the first time), 0 on failure */
static uint32_t code_id(const struct pyrt *p, uintptr_t code, uintptr_t filename,
                        uintptr_t qualname)
{
    const struct ct_pylayout *L = &p->L;
    int32_t first = rd32(code + L->co_firstlineno);
    uint32_t i = (uint32_t)((code >> 4) * 0x9E3779B97F4A7C15ull >> (64 - CODE_BITS));
    for (uint32_t probes = 0; probes < CODE_SIZE; probes++, i = (i + 1) & (CODE_SIZE - 1)) {
        struct codeent *e = &codes[i];
        if (e->addr == code) {
            if (e->filename == filename && e->qualname == qualname && e->firstlineno == first)
                return e->id;
            break; /* freed and reused: a new code object */
        }
        if (e->addr == 0)
            break;
    }
    if (ncodes >= CODE_SIZE - CODE_SIZE / 4)
        return 0;
    static char buf[2 * 4200]; /* under mu */
    size_t fl = read_str(L, filename, buf, 4200);
    size_t ql = read_str(L, qualname, buf + fl + 1, 4200);
    buf[fl] = 0;
    uintptr_t lt = rd(code + L->co_linetable);
    uint64_t ltlen = lt ? (uint64_t)rd(lt + CT_PY_OB_SIZE) : 0;
    if (ltlen > MAX_LINETABLE)
        ltlen = 0;
    struct ct_rec_pycode rec = {code,
                                code + L->co_code_adaptive,
                                ncodes + 1,
                                first,
                                (uint32_t)rd(code + CT_PY_OB_SIZE),
                                (uint32_t)ltlen,
                                (uint16_t)fl,
                                (uint16_t)ql,
                                0};
    if (!ct_rec_write(CT_REC_PYCODE, &rec, sizeof rec, buf, fl + ql + 2,
                      ltlen ? (const void *)(lt + CT_PY_BYTES_SVAL) : NULL, ltlen))
        return 0;
    ncodes++;
    codes[i] =
        (struct codeent){code, filename, qualname, first, ncodes, ct_py_ident(buf, buf + fl + 1)};
    return ncodes;
}

/* with mu held */
static uint32_t py_node(uint32_t parent, uint32_t code, uint32_t lasti, uint32_t flags)
{
    uint64_t h = ((uint64_t)parent * 0x9E3779B97F4A7C15ull) ^
                 ((uint64_t)code * 0xC2B2AE3D27D4EB4Full) ^
                 ((uint64_t)lasti << 32 | flags) * 0x165667B19E3779F9ull;
    uint32_t i = (uint32_t)(h >> (64 - PYNODE_BITS));
    for (;;) {
        struct pynode *n = &nodes[i];
        if (n->id == 0)
            break;
        if (n->parent == parent && n->code == code && n->lasti == lasti && n->flags == flags)
            return n->id;
        i = (i + 1) & (PYNODE_SIZE - 1);
    }
    if (nnodes >= PYNODE_SIZE - PYNODE_SIZE / 4)
        return 0;
    struct ct_rec_pyframe rec = {nnodes + 1, parent, code, lasti, flags, 0};
    if (!ct_rec_write(CT_REC_PYFRAME, &rec, sizeof rec, NULL, 0, NULL, 0))
        return 0;
    nnodes++;
    nodes[i] = (struct pynode){parent, code, lasti, flags, nnodes, 0};
    return nnodes;
}

static inline uint64_t link_why(int why)
{
    return CT_PYLINK_TAG | ((uint64_t)CT_PYLINK_WHY << 32) | (uint32_t)why;
}

/* ---- the hot path ---------------------------------------------------------------------- */
/* The frame chain from fr, innermost first, into code/instr/flags; the number of frames.
 * Inlined once per version with T a constant table, so every offset is an immediate. */
static inline __attribute__((always_inline)) int walk(uintptr_t fr, uintptr_t code_type,
                                                      const struct ct_pylayout *T, uintptr_t *code,
                                                      uintptr_t *instr, uint32_t *flags)
{
    const int cstack_entries = T->fr_is_entry == CT_PY_NONE;
    int n = 0;
    for (int guard = 0; fr && n < MAX_PY_DEPTH && guard < 4 * MAX_PY_DEPTH; guard++) {
        uint8_t owner = rd8(fr + T->fr_owner);
        uintptr_t prev = rd(fr + T->fr_previous);
        if (cstack_entries && owner == CT_PY_OWNED_BY_CSTACK) {
            if (n)
                flags[n - 1] |= CT_PYF_ENTRY; /* the frame this eval-loop call started with */
            fr = prev;
            continue;
        }
        uintptr_t co = rd(fr + T->fr_code);
        if (owner > CT_PY_OWNED_BY_CSTACK || !co || rd(co + CT_PY_OB_TYPE) != code_type) {
            fr = prev; /* 3.13: f_executable may be None */
            continue;
        }
        uintptr_t ip = rd(fr + T->fr_instr), start = co + T->co_code_adaptive;
        /* incomplete frames (not started yet) are skipped, as CPython's traceback does */
        if (owner != CT_PY_OWNED_BY_GENERATOR &&
            ip < start + 2 * (uintptr_t)(uint32_t)rd32(co + T->co_firsttraceable)) {
            fr = prev;
            continue;
        }
        uint32_t f = 0;
        if (!cstack_entries && rd8(fr + T->fr_is_entry))
            f |= CT_PYF_ENTRY;
        if (ip < start || ip >= start + 2 * (uintptr_t)rd(co + CT_PY_OB_SIZE))
            f |= CT_PYF_NO_OFFSET;
        code[n] = co;
        instr[n] = ip;
        flags[n] = f;
        n++;
        fr = prev;
    }
    return n;
}

/* The calling thread's innermost frame (into *fr), or why there is none (CT_PYWHY_*). */
static inline __attribute__((always_inline)) int current_frame(const struct pyrt *p, uintptr_t *fr)
{
    const struct ct_pylayout *L = &p->L;
    uintptr_t rt = p->runtime;
    /* the gilstate key: this thread's own PyThreadState, GIL held or not */
    if (!rd32(rt + L->rt_tss) || !rd(rt + L->rt_interp_main))
        return CT_PYWHY_NOT_INITIALIZED;
    pthread_key_t key = (pthread_key_t) * (const volatile uint32_t *)(rt + L->rt_tss + 4);
    uintptr_t ts = (uintptr_t)pthread_getspecific(key);
    if (!ts)
        return CT_PYWHY_NO_TSTATE;
    uintptr_t fin = rd(rt + L->rt_finalizing);
    if (fin && fin != ts) /* finalization deletes other threads' states */
        return CT_PYWHY_FINALIZING;
    if ((uintptr_t)rd(ts + L->ts_thread_id) != (uintptr_t)pthread_self() || !rd(ts + L->ts_interp))
        return CT_PYWHY_INCONSISTENT;
    if (L->ts_current_frame != CT_PY_NONE) {
        *fr = rd(ts + L->ts_current_frame);
    } else {
        uintptr_t cf = rd(ts + L->ts_cframe);
        *fr = cf ? rd(cf + L->cf_current_frame) : 0;
    }
    return 0;
}

/* innermost first; one copy of the walk per version, its offsets constants */
static inline __attribute__((always_inline)) int
walk_any(const struct pyrt *p, uintptr_t fr, uintptr_t *code, uintptr_t *instr, uint32_t *flags)
{
    switch (p->L.minor) {
    case 11:
        return walk(fr, p->code_type, &ct_pylayout_311, code, instr, flags);
    case 12:
        return walk(fr, p->code_type, &ct_pylayout_312, code, instr, flags);
    default:
        return walk(fr, p->code_type, &ct_pylayout_313, code, instr, flags);
    }
}

/* The link ip for this event: 0 without Python, else frames or the reason there are none. */
uint64_t ct_py_capture_now(void)
{
    struct pyrt *p = __atomic_load_n(&ct_py_rt, __ATOMIC_ACQUIRE);
    if (!p) {
        if (!__atomic_load_n(&ct_py_modules_dirty, __ATOMIC_RELAXED))
            return 0;
        if (disabled < 0) /* CUDATRACE_PYTHON=0: native stacks only */
            disabled = ct_setting_num(CT_SET_PYTHON) == 0;
        if (disabled || !(p = find_python()))
            return 0;
    }
    if (!__atomic_load_n(&info_written, __ATOMIC_ACQUIRE) &&
        !__atomic_exchange_n(&info_written, 1, __ATOMIC_ACQ_REL))
        write_infos(p);
    if (p->why)
        return link_why(p->why);
    const struct ct_pylayout *L = &p->L;
    uintptr_t fr = 0;
    int why = current_frame(p, &fr);
    if (why)
        return link_why(why);
    uintptr_t code[MAX_PY_DEPTH], instr[MAX_PY_DEPTH];
    uint32_t flags[MAX_PY_DEPTH];
    int n = walk_any(p, fr, code, instr, flags);
    if (n == 0)
        return link_why(CT_PYWHY_IDLE);
    if (!tc) {
        void *m = mmap(NULL, sizeof(struct tcache), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return 0;
        tc = m;
        pthread_once(&tc_once, tc_key_init);
        if (tc_key_ok)
            pthread_setspecific(tc_key, m);
    }
    uint32_t gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    if (tc->gen != gen) {
        tc->gen = gen;
        tc->n = 0;
        memset(tc->t, 0, sizeof tc->t);
    }
    /* the common prefix (outermost side) with this thread's last stack keeps its nodes */
    const uint32_t o_filename = L->co_filename, o_qualname = L->co_qualname;
    int k = 0;
    while (k < n && k < (int)tc->n) {
        const struct tframe *t = &tc->f[k];
        int j = n - 1 - k;
        if (t->code != code[j] || t->instr != instr[j] || t->flags != flags[j] ||
            t->filename != rd(code[j] + o_filename) || t->qualname != rd(code[j] + o_qualname))
            break;
        k++;
    }
    uint32_t leaf = k ? tc->f[k - 1].node : 0;
    int locked = 0;
    for (; k < n; k++) {
        int j = n - 1 - k;
        struct tframe *t = &tc->f[k];
        t->code = code[j];
        t->instr = instr[j];
        t->flags = flags[j];
        t->filename = rd(code[j] + L->co_filename);
        t->qualname = rd(code[j] + L->co_qualname);
        uint64_t h =
            (code[j] ^ (instr[j] << 7) ^ ((uint64_t)leaf << 32) ^ flags[j]) * 0x9E3779B97F4A7C15ull;
        struct tnode *tn = &tc->t[h >> 56];
        if (tn->node && tn->parent == leaf && tn->code == code[j] && tn->instr == instr[j] &&
            tn->flags == flags[j] && tn->filename == t->filename && tn->qualname == t->qualname) {
            t->code_id = tn->code_id;
            t->lasti = 0;
            t->node = leaf = tn->node;
            continue;
        }
        if (!locked) {
            pthread_mutex_lock(&mu);
            locked = 1;
            if (!ensure_tables())
                break;
        }
        t->code_id = code_id(p, code[j], t->filename, t->qualname);
        uintptr_t start = code[j] + L->co_code_adaptive;
        t->lasti = (flags[j] & CT_PYF_NO_OFFSET) ? 0 : (uint32_t)((instr[j] - start) / 2);
        uint32_t id = t->code_id ? py_node(leaf, t->code_id, t->lasti, t->flags) : 0;
        if (!id)
            break;
        *tn = (struct tnode){code[j], instr[j], t->filename, t->qualname,
                             leaf,    flags[j], id,          t->code_id};
        t->node = leaf = id;
    }
    if (locked)
        pthread_mutex_unlock(&mu);
    tc->n = (uint32_t)k;
    if (k < n)
        return leaf ? (CT_PYLINK_TAG | ((uint64_t)CT_PYLINK_FRAMES << 32) | leaf) : 0;
    return CT_PYLINK_TAG | ((uint64_t)CT_PYLINK_FRAMES << 32) | leaf;
}

/* ---- at a denial (cold path) ------------------------------------------------------------ */
static const char *why_text(int why)
{
    switch (why) {
    case CT_PYWHY_NO_TSTATE:
        return "the thread has no Python thread state";
    case CT_PYWHY_FINALIZING:
        return "the interpreter is finalizing";
    case CT_PYWHY_NOT_INITIALIZED:
        return "Python is not initialized";
    case CT_PYWHY_IDLE:
        return "the thread runs no Python frame";
    default:
        return "the thread state is not this thread's";
    }
}

/* the line of the instruction at code unit lasti (the 3.11+ location table, as
 * cudatrace/symbols/python.py line_ranges reads it); -1 when unknown */
static int line_of(const struct ct_pylayout *L, uintptr_t co, uint32_t lasti)
{
    uintptr_t lt = rd(co + L->co_linetable);
    uint64_t len = lt ? (uint64_t)rd(lt + CT_PY_OB_SIZE) : 0;
    if (!len || len > MAX_LINETABLE)
        return -1;
    const uint8_t *b = (const uint8_t *)(lt + CT_PY_BYTES_SVAL);
    int64_t line = rd32(co + L->co_firstlineno);
    uint64_t addr = 0, off = (uint64_t)lasti * 2, i = 0;
    while (i < len && (b[i] & 0x80)) {
        unsigned code = (b[i] >> 3) & 15;
        uint64_t length = (uint64_t)((b[i] & 7) + 1) * 2;
        int known = code != 15, varints = code == 14 ? 4 : code == 13 ? 1 : 0;
        i++;
        for (int v = 0; v < varints; v++) { /* the first is the line's delta, signed */
            uint64_t val = 0;
            unsigned shift = 0;
            do {
                if (i >= len || shift > 60)
                    return -1;
                val |= (uint64_t)(b[i] & 63) << shift;
                shift += 6;
            } while (b[i++] & 64);
            if (!v)
                line += (val & 1) ? -(int64_t)(val >> 1) : (int64_t)(val >> 1);
        }
        if (code >= 10 && code <= 12) {
            line += code - 10;
            i += 2;
        } else if (code < 10)
            i += 1;
        if (off >= addr && off < addr + length)
            return known && line > 0 && line < (1 << 30) ? (int)line : -1;
        addr += length;
    }
    return -1;
}

/* the calling thread's frames now, innermost first (code objects and instructions); 0 with
 * *why set when there are none to read, -1 when the process has no interpreter known */
static int frames_now(struct pyrt **pp, uintptr_t *code, uintptr_t *instr, uint32_t *flags,
                      const char **why)
{
    *why = NULL;
    if (disabled < 0)
        disabled = ct_setting_num(CT_SET_PYTHON) == 0;
    if (disabled) {
        *why = "Python frames are off: CUDATRACE_PYTHON=0";
        return -1;
    }
    struct pyrt *p = find_python();
    *pp = p;
    if (!p)
        return -1;
    if (p->why) {
        *why = p->note;
        return 0;
    }
    uintptr_t fr = 0;
    int w = current_frame(p, &fr);
    int n = w ? 0 : walk_any(p, fr, code, instr, flags);
    if (!n)
        *why = why_text(w ? w : CT_PYWHY_IDLE);
    return n;
}

int ct_py_deny_frames(struct ct_pyd_frame *out, int max, const char **why)
{
    struct pyrt *p = NULL;
    uintptr_t code[MAX_PY_DEPTH], instr[MAX_PY_DEPTH];
    uint32_t flags[MAX_PY_DEPTH];
    int n = frames_now(&p, code, instr, flags, why);
    if (n <= 0)
        return n;
    const struct ct_pylayout *L = &p->L;
    char *file = malloc(4200), *name = malloc(4200);
    int m = 0;
    for (int k = 0; file && name && k < n && m < max; k++) {
        struct ct_pyd_frame *f = &out[m++];
        read_str(L, rd(code[k] + L->co_filename), file, 4200);
        read_str(L, rd(code[k] + L->co_qualname), name, 4200);
        f->ident = ct_py_ident(file, name);
        struct ct_py_origin o;
        ct_py_origin(file, &o);
        f->kind = o.kind;
        ct_strlcpy(f->where, o.where, sizeof f->where);
        size_t pl = o.pkg_len < sizeof f->pkg - 1 ? o.pkg_len : sizeof f->pkg - 1;
        memcpy(f->pkg, o.pkg ? o.pkg : "", o.pkg ? pl : 0);
        f->pkg[o.pkg ? pl : 0] = 0;
        const char *base = strrchr(file, '/');
        ct_strlcpy(f->base, base && base[1] ? base + 1 : file, sizeof f->base);
        ct_strlcpy(f->name, name[0] ? name : "?", sizeof f->name);
        uintptr_t start = code[k] + L->co_code_adaptive;
        f->line = (flags[k] & CT_PYF_NO_OFFSET)
                      ? -1
                      : line_of(L, code[k], (uint32_t)((instr[k] - start) / 2));
    }
    free(file);
    free(name);
    if (!m)
        *why = "its frames could not be read (out of memory)";
    return m;
}

uint64_t ct_py_stack_key(void)
{
    struct pyrt *p = NULL;
    const char *why;
    uintptr_t code[MAX_PY_DEPTH], instr[MAX_PY_DEPTH];
    uint32_t flags[MAX_PY_DEPTH];
    int n = frames_now(&p, code, instr, flags, &why);
    uint64_t h = 0;
    for (int k = 0; k < n && k < 8; k++) /* the innermost frames: where the site is */
        h = (h ^ code[k] ^ (instr[k] << 17)) * 0x9E3779B97F4A7C15ull;
    return h;
}

uintptr_t ct_py_eval_start(void)
{
    struct pyrt *p = __atomic_load_n(&ct_py_rt, __ATOMIC_ACQUIRE);
    return p && !p->why ? p->eval_start : 0;
}

uint32_t ct_py_nodes_copy(uint32_t **parent, uint64_t **ident)
{
    *parent = NULL;
    *ident = NULL;
    pthread_mutex_lock(&mu);
    uint32_t n = nodes && codes ? nnodes : 0, nc = ncodes;
    uint32_t *par = n ? calloc((size_t)n + 1, sizeof *par) : NULL;
    uint64_t *id = n ? calloc((size_t)n + 1, sizeof *id) : NULL;
    uint64_t *cid = n ? calloc((size_t)nc + 1, sizeof *cid) : NULL;
    if (par && id && cid) {
        for (uint32_t i = 0; i < CODE_SIZE; i++)
            if (codes[i].id && codes[i].id <= nc)
                cid[codes[i].id] = codes[i].ident;
        for (uint32_t i = 0; i < PYNODE_SIZE; i++) {
            const struct pynode *e = &nodes[i];
            if (e->id && e->id <= n) {
                par[e->id] = e->parent <= n ? e->parent : 0;
                id[e->id] = e->code <= nc ? cid[e->code] : 0;
            }
        }
    } else
        n = 0;
    pthread_mutex_unlock(&mu);
    free(cid);
    if (!n) {
        free(par);
        free(id);
        return 0;
    }
    *parent = par;
    *ident = id;
    return n;
}

/* ---- fork ------------------------------------------------------------------------------- */
void ct_py_atfork_prepare(void) { pthread_mutex_lock(&mu); }
void ct_py_atfork_parent(void) { pthread_mutex_unlock(&mu); }

void ct_py_reset(void)
{
    /* the child writes a new file: every code object and node again */
    pthread_mutex_init(&mu, NULL);
    pthread_mutex_init(&detect_mu, NULL);
    if (codes)
        munmap(codes, sizeof(struct codeent) * CODE_SIZE);
    if (nodes)
        munmap(nodes, sizeof(struct pynode) * PYNODE_SIZE);
    codes = NULL;
    nodes = NULL;
    ncodes = nnodes = 0;
    info_written = 0;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
}
