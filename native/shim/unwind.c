/* unwind.c - cached CFI rules: the stack a full DWARF unwind gives, for call sites seen before.
 *
 * A full unwind (libgcc's _Unwind_Backtrace) finds, for every frame, the FDE of its return
 * address in .eh_frame (through PT_GNU_EH_FRAME's sorted table), runs the CFA program up to that
 * address and applies the resulting rules: CFA = reg + offset, each saved register at CFA + n.
 * Those rules depend on the return address alone (the code does not change while its object
 * stays loaded), so this file computes them once per address, with the same reading of the
 * same bytes, and keeps them in a per-thread table. A later unwind whose every frame has a rule
 * there walks the stack with those rules: the register values it reads (SP = the callee's CFA,
 * the frame pointer, the return address) are the ones libgcc would read, from the same memory,
 * so the stack is the same, frame by frame. Whatever is not one of the plain shapes below is
 * remembered as "not plain", and an unwind meeting it is handed to libgcc:
 *
 *   CFA = SP + n or CFA = FP + n (x86-64: rsp/rbp; aarch64: sp/x29)
 *   return address saved at CFA + n, or undefined (the outermost frame)
 *   FP unchanged, undefined (libgcc keeps it unchanged) or saved at CFA + n
 *   SP not described (SP = CFA); aarch64: return address signed or not (negate_ra_state)
 *   CIE augmentations z, R, P, L only (no signal frames 'S', no B-key 'B'); an FDE found
 *   through the object's .eh_frame_hdr table (the table libgcc itself searches)
 *
 * On top of the rules, a per-thread memo of the last walks (see struct ct_uw_memo) makes a repeated
 * call site cost one comparison per word the walk reads (two per frame at most).
 *
 * The table is flushed when a module may have been unloaded (dlclose, interposed below,
 * bumps a generation before and after the real call). CUDATRACE_STACK_VERIFY=1 makes every
 * cached unwind be checked against a full one (stacks.c counts the comparisons).
 */
#include "unwind.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#include "modules.h"
#include "util.h"

#if defined(__x86_64__)
#define R_FP 6
#define R_SP 7
#define R_RA 16
#elif defined(__aarch64__)
#define R_FP 29
#define R_SP 31
#define R_RA 30
#define R_RA_STATE 34
#endif

#if defined(R_RA)

/* ---- registers of the caller at a call site, from a leaf written in assembly ----------------
 * out[0] = return address into the caller, out[1] = the caller's SP at the call (our CFA),
 * out[2] = its frame pointer. */
__attribute__((visibility("hidden"))) void ct_uw_regs(uintptr_t *out);
#if defined(__x86_64__)
__asm__(".text\n"
        ".p2align 4\n"
        ".type ct_uw_regs,@function\n"
        ".hidden ct_uw_regs\n"
        ".globl ct_uw_regs\n"
        "ct_uw_regs:\n"
        "  endbr64\n"
        "  movq (%rsp), %rax\n"
        "  movq %rax, (%rdi)\n"
        "  leaq 8(%rsp), %rax\n"
        "  movq %rax, 8(%rdi)\n"
        "  movq %rbp, 16(%rdi)\n"
        "  ret\n"
        ".size ct_uw_regs, .-ct_uw_regs\n");
#else
__asm__(".text\n"
        ".p2align 2\n"
        ".type ct_uw_regs,%function\n"
        ".hidden ct_uw_regs\n"
        ".globl ct_uw_regs\n"
        "ct_uw_regs:\n"
        "  hint #34\n" /* bti c: a no-op where BTI is off */
        "  mov x1, sp\n"
        "  stp x30, x1, [x0]\n"
        "  str x29, [x0, #16]\n"
        "  ret\n"
        ".size ct_uw_regs, .-ct_uw_regs\n");
#endif

/* ---- the per-thread rule table ---------------------------------------------------------- */
#define RF_PLAIN 1    /* usable rule */
#define RF_CFA_FP 2   /* CFA = FP + cfa_off (else SP + cfa_off) */
#define RF_FP_SAVED 4 /* caller's FP at CFA + fp_off */
#define RF_RA_UNDEF 8 /* outermost frame: the unwind ends after it */
#define RF_RA_SIGNED 16

struct rule {
    uintptr_t pc; /* the return address; 0: empty slot */
    int32_t cfa_off, fp_off, ra_off;
    uint8_t flags; /* 0 with pc set: known not plain */
};

#define RULE_BITS 12
#define RULE_SLOTS (1u << RULE_BITS)
#define RULE_MAX (RULE_SLOTS / 2)

/* the thread's table: its memos (unwind.h: the inline recall reads them) and its rules */
struct uw_thread {
    struct ct_uw_memos m; /* first: ct_uw_thread points at it and at the table alike */
    uint32_t used;
    struct rule r[RULE_SLOTS];
};

CT_TLS struct ct_uw_memos *ct_uw_thread;
static const uintptr_t ct_uw_never; /* 0: a memo's last read, which expects 1 */
uint32_t ct_uw_generation = 1;

static pthread_key_t uw_key;
static int uw_key_ok;

static void uw_thread_free(void *p)
{
    if (p) {
        if (p == (void *)ct_uw_thread)
            ct_uw_thread = NULL;
        munmap(p, sizeof(struct uw_thread));
    }
}

void ct_uw_init(void)
{
    if (!uw_key_ok && pthread_key_create(&uw_key, uw_thread_free) == 0)
        uw_key_ok = 1;
}

void ct_uw_invalidate(void) { __atomic_add_fetch(&ct_uw_generation, 1, __ATOMIC_ACQ_REL); }

static struct uw_thread *thread_table(void)
{
    struct uw_thread *t = (struct uw_thread *)ct_uw_thread; /* m is its first member */
    uint32_t gen = __atomic_load_n(&ct_uw_generation, __ATOMIC_ACQUIRE);
    if (!t) {
        void *m = mmap(NULL, sizeof(struct uw_thread), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        t = m;
        ct_uw_thread = &t->m;
        t->m.gen = gen;
        for (int w = 0; w < CT_UW_MEMO_WAYS; w++)
            t->m.memo[w].n = t->m.memo[w].key = -1;
        if (uw_key_ok)
            pthread_setspecific(uw_key, t);
    }
    if (t->m.gen != gen) {
        memset(t->r, 0, sizeof t->r);
        t->used = 0;
        t->m.gen = gen;
        for (int w = 0; w < CT_UW_MEMO_WAYS; w++)
            t->m.memo[w].n = t->m.memo[w].key = -1;
    }
    return t;
}

static inline uint32_t rhash(uintptr_t pc)
{
    uint64_t h = (uint64_t)pc * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> (64 - RULE_BITS));
}

static inline const struct rule *rule_find(const struct uw_thread *t, uintptr_t pc)
{
    uint32_t i = rhash(pc);
    for (;;) {
        const struct rule *r = &t->r[i];
        if (r->pc == pc)
            return r;
        if (r->pc == 0)
            return NULL;
        i = (i + 1) & (RULE_SLOTS - 1);
    }
}

static void rule_put(struct uw_thread *t, const struct rule *nr)
{
    if (t->used >= RULE_MAX) { /* full: start over rather than probe long */
        memset(t->r, 0, sizeof t->r);
        t->used = 0;
    }
    uint32_t i = rhash(nr->pc);
    while (t->r[i].pc != 0 && t->r[i].pc != nr->pc)
        i = (i + 1) & (RULE_SLOTS - 1);
    if (t->r[i].pc == 0)
        t->used++;
    t->r[i] = *nr;
}

/* ---- reading .eh_frame ------------------------------------------------------------------ */
struct rd {
    const uint8_t *p, *end;
    int bad;
};

static uint64_t uleb(struct rd *r)
{
    uint64_t v = 0;
    unsigned shift = 0;
    for (;;) {
        if (r->p >= r->end) {
            r->bad = 1;
            return 0;
        }
        uint8_t b = *r->p++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80))
            return v;
    }
}

static int64_t sleb(struct rd *r)
{
    int64_t v = 0;
    unsigned shift = 0;
    uint8_t b;
    do {
        if (r->p >= r->end) {
            r->bad = 1;
            return 0;
        }
        b = *r->p++;
        if (shift < 64)
            v |= (int64_t)((uint64_t)(b & 0x7f) << shift);
        shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40))
        v |= -((int64_t)1 << shift);
    return v;
}

static uint64_t fixed(struct rd *r, unsigned n)
{
    if ((size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, r->p, n); /* little-endian targets only (x86-64, aarch64) */
    r->p += n;
    return v;
}

/* a pointer in DW_EH_PE encoding enc; pcrel and absolute only (what GNU toolchains emit) */
static int enc_ptr(struct rd *r, uint8_t enc, uintptr_t *out)
{
    if (enc == 0xff) {
        r->bad = 1;
        return 0;
    }
    const uint8_t *at = r->p;
    uint64_t v;
    switch (enc & 0x0f) {
    case 0x00:
        v = fixed(r, 8);
        break;
    case 0x01:
        v = uleb(r);
        break;
    case 0x02:
        v = fixed(r, 2);
        break;
    case 0x03:
        v = fixed(r, 4);
        break;
    case 0x04:
        v = fixed(r, 8);
        break;
    case 0x09:
        v = (uint64_t)sleb(r);
        break;
    case 0x0a:
        v = (uint64_t)(int64_t)(int16_t)fixed(r, 2);
        break;
    case 0x0b:
        v = (uint64_t)(int64_t)(int32_t)fixed(r, 4);
        break;
    case 0x0c:
        v = fixed(r, 8);
        break;
    default:
        r->bad = 1;
        return 0;
    }
    switch (enc & 0x70) {
    case 0x00:
        break;
    case 0x10:
        v += (uintptr_t)at;
        break;
    default:
        r->bad = 1;
        return 0; /* textrel, datarel, funcrel: not here */
    }
    if (enc & 0x80) {
        r->bad = 1;
        return 0;
    } /* indirect */
    *out = (uintptr_t)v;
    return !r->bad;
}

struct find_ctx {
    uintptr_t pc;
    const uint8_t *hdr;
    int found;
};

static int find_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct find_ctx *c = data;
    const ElfW(Phdr) *eh = NULL;
    int in = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD) {
            uintptr_t s = info->dlpi_addr + ph->p_vaddr;
            if (c->pc >= s && c->pc < s + ph->p_memsz)
                in = 1;
        } else if (ph->p_type == PT_GNU_EH_FRAME) {
            eh = ph;
        }
    }
    if (!in)
        return 0;
    c->found = 1;
    c->hdr = eh ? (const uint8_t *)(info->dlpi_addr + eh->p_vaddr) : NULL;
    return 1;
}

/* the FDE covering pc, from the object's sorted table; NULL when there is none */
static const uint8_t *find_fde(uintptr_t pc, const uint8_t **fde_end)
{
    struct find_ctx c = {pc, NULL, 0};
    dl_iterate_phdr(find_cb, &c);
    if (!c.found || !c.hdr)
        return NULL;
    const uint8_t *h = c.hdr;
    if (h[0] != 1 || h[3] != 0x3b) /* version 1, table: datarel sdata4 */
        return NULL;
    struct rd r = {h + 4, h + 4 + 16, 0};
    uintptr_t eh_frame, count;
    if (!enc_ptr(&r, h[1], &eh_frame))
        return NULL;
    if (h[2] == 0x03)
        count = (uintptr_t)fixed(&r, 4);
    else if (!enc_ptr(&r, h[2], &count))
        return NULL;
    const int32_t *tab = (const int32_t *)(const void *)r.p;
    if (r.bad || count == 0)
        return NULL;
    size_t lo = 0, hi = count; /* last entry with start <= pc */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)(h + tab[2 * mid]) <= pc)
            lo = mid;
        else
            hi = mid;
    }
    if ((uintptr_t)(h + tab[2 * lo]) > pc)
        return NULL;
    const uint8_t *fde = h + tab[2 * lo + 1];
    uint32_t len32;
    memcpy(&len32, fde, 4);
    if (len32 == 0 || len32 == 0xffffffffu)
        return NULL;
    *fde_end = fde + 4 + len32;
    return fde;
}

/* the rule state the CFA program builds, for the registers an unwind here needs */
#define H_UNSAVED 0
#define H_OFFSET 1
#define H_UNDEF 2
#define H_OTHER 3
struct regrule {
    uint8_t how;
    int64_t off;
};
struct cfstate {
    uint8_t cfa_expr; /* CFA given by an expression */
    uint64_t cfa_reg;
    int64_t cfa_off;
    struct regrule fp, ra, sp;
    uint8_t ra_state; /* aarch64: return address signed */
    uint8_t ra_state_other;
};

struct cie {
    uint64_t code_align;
    int64_t data_align;
    uint8_t fde_enc;
    uint8_t has_z;
    const uint8_t *insn, *end;
};

static int parse_cie(const uint8_t *p, struct cie *c)
{
    uint32_t len32;
    memcpy(&len32, p, 4);
    if (len32 == 0 || len32 == 0xffffffffu)
        return 0;
    struct rd r = {p + 4, p + 4 + len32, 0};
    if (fixed(&r, 4) != 0) /* CIE id */
        return 0;
    unsigned ver = (unsigned)fixed(&r, 1);
    if (ver != 1 && ver != 3 && ver != 4)
        return 0;
    const char *aug = (const char *)r.p;
    size_t alen = strnlen(aug, (size_t)(r.end - r.p));
    if (aug + alen >= (const char *)r.end)
        return 0;
    r.p += alen + 1;
    if (ver == 4) {
        if (fixed(&r, 1) != sizeof(void *) || fixed(&r, 1) != 0)
            return 0;
    }
    c->code_align = uleb(&r);
    c->data_align = sleb(&r);
    uint64_t ra = ver == 1 ? fixed(&r, 1) : uleb(&r);
    if (ra != R_RA)
        return 0;
    c->fde_enc = 0;
    c->has_z = 0;
    const uint8_t *aug_end = NULL;
    for (const char *a = aug; *a; a++) {
        if (a == aug && *a == 'z') {
            uint64_t l = uleb(&r);
            if (r.bad || l > (uint64_t)(r.end - r.p))
                return 0;
            aug_end = r.p + l;
            c->has_z = 1;
        } else if (*a == 'R') {
            c->fde_enc = (uint8_t)fixed(&r, 1);
        } else if (*a == 'L') {
            fixed(&r, 1);
        } else if (*a == 'P') {
            uint8_t e = (uint8_t)fixed(&r, 1);
            uintptr_t dummy;
            if ((e & 0x70) == 0x10 || (e & 0x70) == 0)
                enc_ptr(&r, e & 0x7f, &dummy); /* indirect is fine: we skip it */
            else
                return 0;
        } else {
            return 0; /* 'S' signal frame, 'B' b-key, unknown */
        }
        if (r.bad)
            return 0;
    }
    if (!c->has_z)
        return 0;
    c->insn = aug_end;
    c->end = r.end;
    return 1;
}

#define MAX_REMEMBER 8

static void set_rule(struct cfstate *s, uint64_t reg, uint8_t how, int64_t off)
{
    struct regrule *rr = reg == R_FP ? &s->fp : reg == R_RA ? &s->ra : reg == R_SP ? &s->sp : NULL;
#if defined(R_RA_STATE)
    if (reg == R_RA_STATE && how != H_UNSAVED)
        s->ra_state_other = 1;
#endif
    if (rr) {
        rr->how = how;
        rr->off = off;
    }
}

/* DW_CFA_restore: libgcc makes the register "unsaved" (not the CIE's initial rule): so here */
static void restore_rule(struct cfstate *s, uint64_t reg)
{
    struct regrule *rr = reg == R_FP ? &s->fp : reg == R_RA ? &s->ra : reg == R_SP ? &s->sp : NULL;
    if (rr) {
        rr->how = H_UNSAVED;
        rr->off = 0;
    }
}

/* run a CFA program while the location is below pc (libgcc: fs->pc < context->ra) */
static int run_cfa(const uint8_t *p, const uint8_t *end, const struct cie *c, uintptr_t loc,
                   uintptr_t pc, struct cfstate *s)
{
    struct cfstate stack[MAX_REMEMBER];
    int depth = 0;
    struct rd r = {p, end, 0};
    while (r.p < r.end && loc < pc) {
        uint8_t op = *r.p++;
        uint8_t hi = op & 0xc0, lo = op & 0x3f;
        if (hi == 0x40) {
            loc += lo * c->code_align;
            continue;
        }
        if (hi == 0x80) {
            set_rule(s, lo, H_OFFSET, (int64_t)uleb(&r) * c->data_align);
            goto next;
        }
        if (hi == 0xc0) {
            restore_rule(s, lo);
            goto next;
        }
        switch (op) {
        case 0x00:
            break; /* nop */
        case 0x01: {
            uintptr_t a;
            if (!enc_ptr(&r, c->fde_enc, &a))
                return 0;
            loc = a;
            break;
        }
        case 0x02:
            loc += fixed(&r, 1) * c->code_align;
            break;
        case 0x03:
            loc += fixed(&r, 2) * c->code_align;
            break;
        case 0x04:
            loc += fixed(&r, 4) * c->code_align;
            break;
        case 0x05: {
            uint64_t reg = uleb(&r);
            set_rule(s, reg, H_OFFSET, (int64_t)uleb(&r) * c->data_align);
            break;
        }
        case 0x06:
            restore_rule(s, uleb(&r));
            break;
        case 0x07:
            set_rule(s, uleb(&r), H_UNDEF, 0);
            break; /* undefined */
        case 0x08:
            set_rule(s, uleb(&r), H_UNSAVED, 0);
            break; /* same_value */
        case 0x09: {
            uint64_t reg = uleb(&r);
            uleb(&r);
            set_rule(s, reg, H_OTHER, 0);
            break;
        }
        case 0x0a:
            if (depth >= MAX_REMEMBER)
                return 0;
            stack[depth++] = *s;
            break;
        case 0x0b:
            if (depth == 0)
                return 0;
            *s = stack[--depth];
            break;
        case 0x0c:
            s->cfa_reg = uleb(&r);
            s->cfa_off = (int64_t)uleb(&r);
            s->cfa_expr = 0;
            break;
        case 0x0d:
            s->cfa_reg = uleb(&r);
            s->cfa_expr = 0;
            break;
        case 0x0e:
            s->cfa_off = (int64_t)uleb(&r);
            break;
        case 0x0f: {
            uint64_t l = uleb(&r);
            if (l > (uint64_t)(r.end - r.p))
                return 0;
            r.p += l;
            s->cfa_expr = 1;
            break;
        }
        case 0x10:
        case 0x16: { /* expression, val_expression */
            uint64_t reg = uleb(&r), l = uleb(&r);
            if (l > (uint64_t)(r.end - r.p))
                return 0;
            r.p += l;
            set_rule(s, reg, H_OTHER, 0);
            break;
        }
        case 0x11: {
            uint64_t reg = uleb(&r);
            set_rule(s, reg, H_OFFSET, sleb(&r) * c->data_align);
            break;
        }
        case 0x12:
            s->cfa_reg = uleb(&r);
            s->cfa_off = sleb(&r) * c->data_align;
            s->cfa_expr = 0;
            break;
        case 0x13:
            s->cfa_off = sleb(&r) * c->data_align;
            break;
        case 0x14: {
            uint64_t reg = uleb(&r);
            uleb(&r);
            set_rule(s, reg, H_OTHER, 0);
            break;
        }
        case 0x15: {
            uint64_t reg = uleb(&r);
            sleb(&r);
            set_rule(s, reg, H_OTHER, 0);
            break;
        }
        case 0x2e:
            uleb(&r);
            break; /* GNU_args_size */
        case 0x2f: {
            uint64_t reg = uleb(&r);
            set_rule(s, reg, H_OFFSET, -(int64_t)uleb(&r) * c->data_align);
            break;
        }
#if defined(__aarch64__)
        case 0x2d:
            s->ra_state ^= 1;
            break; /* AARCH64_negate_ra_state */
#endif
        default:
            return 0; /* anything else: not plain */
        }
    next:
        if (r.bad)
            return 0;
    }
    return !r.bad;
}

/* the rule for the frame whose return address is ra; flags 0 when it is not plain */
static void compute_rule(uintptr_t ra, struct rule *out)
{
    memset(out, 0, sizeof *out);
    out->pc = ra;
    uintptr_t pc = ra - 1; /* inside the call, as libgcc looks it up */
    const uint8_t *fde_end;
    const uint8_t *fde = find_fde(pc, &fde_end);
    if (!fde)
        return;
    int32_t cie_off;
    memcpy(&cie_off, fde + 4, 4);
    if (cie_off <= 0)
        return;
    struct cie c;
    if (!parse_cie(fde + 4 - cie_off, &c))
        return;
    struct rd r = {fde + 8, fde_end, 0};
    uintptr_t begin, range;
    if (!enc_ptr(&r, c.fde_enc, &begin) || !enc_ptr(&r, c.fde_enc & 0x0f, &range))
        return;
    if (pc < begin || pc - begin >= range)
        return;
    uint64_t alen = uleb(&r);
    if (r.bad || alen > (uint64_t)(r.end - r.p))
        return;
    r.p += alen;
    struct cfstate s;
    memset(&s, 0, sizeof s);
    s.cfa_expr = 1; /* no CFA until the CIE says */
    if (!run_cfa(c.insn, c.end, &c, begin, (uintptr_t)-1, &s))
        return;
    if (!run_cfa(r.p, r.end, &c, begin, ra, &s))
        return;
    if (s.cfa_expr || (s.cfa_reg != R_SP && s.cfa_reg != R_FP) || s.sp.how != H_UNSAVED ||
        s.ra_state_other || s.cfa_off < INT32_MIN || s.cfa_off > INT32_MAX)
        return;
    uint8_t f = RF_PLAIN;
    if (s.cfa_reg == R_FP)
        f |= RF_CFA_FP;
    out->cfa_off = (int32_t)s.cfa_off;
    if (s.fp.how == H_OFFSET) {
        if (s.fp.off < INT32_MIN || s.fp.off > INT32_MAX)
            return;
        f |= RF_FP_SAVED;
        out->fp_off = (int32_t)s.fp.off;
    } else if (s.fp.how != H_UNSAVED && s.fp.how != H_UNDEF) {
        return;
    }
    if (s.ra.how == H_UNDEF) {
        f |= RF_RA_UNDEF;
    } else if (s.ra.how == H_OFFSET) {
        if (s.ra.off < INT32_MIN || s.ra.off > INT32_MAX)
            return;
        out->ra_off = (int32_t)s.ra.off;
    } else {
        return;
    }
    if (s.ra_state)
        f |= RF_RA_SIGNED;
    out->flags = f;
}

/* ---- the walk ------------------------------------------------------------------------- */
#define MAX_SHIM_FRAMES 32
#define STACK_SPAN (256u << 20) /* a frame's CFA further than this above the start: give up */

__attribute__((noinline)) int ct_uw_walk(const uintptr_t *start, uintptr_t *ips, int max,
                                         int *learned, const uintptr_t **out, uint64_t **tag)
{
    *learned = 0;
    struct uw_thread *t = thread_table();
    if (!t)
        return -1;
    uintptr_t regs[3];
    if (start) {
        regs[0] = ct_uw_strip_pac(start[0]);
        regs[1] = start[1];
        regs[2] = start[2];
    } else
        ct_uw_regs(regs);
    uintptr_t ra = regs[0], sp = regs[1], fp = regs[2], sp0 = regs[1];
    const struct ct_uw_memo *hit = ct_uw_memo_find(&t->m, ra, sp, fp, max);
    if (hit) {
        *out = hit->ips;
        *tag = (uint64_t *)&hit->tag;
        return hit->n;
    }
    unsigned way = t->m.next++ % CT_UW_MEMO_WAYS;
    struct ct_uw_memo *m = &t->m.memo[way];
    t->m.hint[ct_uw_hint_of(ra)] = m; /* tried first the next time */
    m->n = -1;
    m->key = -1;
    m->ra0 = ra;
    m->sp0 = sp;
    m->fp0 = fp;
    m->fp0_used = 0;
    m->tag = 0;
    m->max = max;
    m->gen = t->m.gen;
    m->nreads = 0;
    /* where the current FP came from: -1 the start, -2 not a read worth keeping yet, else the
     * stack word (fp_addr) whose value it is, appended to the reads once a CFA uses it */
    int fp_src = -1;
    uintptr_t fp_addr = 0;
    int n = 0, skipped = 0, started = 0, frames = 0;
    for (;;) {
        if (ra == 0)
            break; /* libgcc: END_OF_STACK */
        if (!started && ct_in_shim(ra)) {
            if (++skipped > MAX_SHIM_FRAMES)
                return -1;
        } else {
            started = 1;
            ips[n++] = ra;
            if (n >= max)
                break;
        }
        if (++frames > CT_UW_MEMO_FRAMES)
            return -1;
        const struct rule *r = rule_find(t, ra);
        struct rule fresh;
        if (!r) {
            compute_rule(ra, &fresh);
            *learned = 1;
            rule_put(t, &fresh);
            r = &fresh;
        }
        uint8_t f = r->flags;
        if (!(f & RF_PLAIN))
            return -1;
        if (f & RF_RA_UNDEF)
            break;           /* outermost: libgcc sets ra = 0 and stops */
        if (f & RF_CFA_FP) { /* this FP steers the walk: the memo must check it */
            if (fp_src == -1)
                m->fp0_used = 1;
            else if (fp_src == 0) {
                m->rd[m->nreads].addr = fp_addr;
                m->rd[m->nreads++].val = fp;
            }
            fp_src = 1; /* kept (or the start's): no second copy */
        }
        uintptr_t cfa = ((f & RF_CFA_FP) ? fp : sp) + (intptr_t)r->cfa_off;
        if (cfa <= sp || cfa - sp0 > STACK_SPAN || (cfa & 7))
            return -1; /* not a plain stack: let libgcc judge */
        if (f & RF_FP_SAVED) {
            fp_addr = cfa + (intptr_t)r->fp_off;
            fp = *(const uintptr_t *)fp_addr;
            fp_src = 0;
        }
        uintptr_t a = cfa + (intptr_t)r->ra_off;
        uintptr_t raw = *(const uintptr_t *)a;
        m->rd[m->nreads].addr = a;
        m->rd[m->nreads++].val = raw;
        ra = (f & RF_RA_SIGNED) ? ct_uw_strip_pac(raw) : raw;
        sp = cfa;
    }
    m->rd[m->nreads].addr = (uintptr_t)&ct_uw_never; /* the end of the reads */
    m->rd[m->nreads].val = 1;
    m->rd_end = &m->rd[m->nreads];
    m->key = 2 * max + m->fp0_used;
    memcpy(m->ips, ips, sizeof(uintptr_t) * (size_t)n);
    m->n = n;
    *out = m->ips;
    *tag = &m->tag;
    return n;
}

/* Modules only leave through dlclose (glibc's own gconv/NSS unloads never hold a CUDA call
 * site): every rule learned before it may describe code that is gone. */
CT_EXPORT int dlclose(void *handle)
{
    ct_dlclose_fn f = ct_real_dlclose();
    ct_uw_invalidate();
    int r = f(handle);
    ct_uw_invalidate();
    return r;
}

#else /* other architectures: no cached rules, every unwind is a full one */
void ct_uw_init(void) {}
void ct_uw_invalidate(void) {}
int ct_uw_walk(const uintptr_t *start, uintptr_t *ips, int max, int *learned, const uintptr_t **out,
               uint64_t **tag)
{
    (void)start;
    (void)ips;
    (void)max;
    *out = NULL;
    *tag = NULL;
    *learned = 1;
    return -1;
}
#endif
