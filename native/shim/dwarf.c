/* dwarf.c - whether the compiler inlined code at an address of a module (dwarf.h).
 *
 * A denial's line names a frame by its symbol; where the compiler inlined a function into it
 * at that address, the reports (which read the DWARF) name the inlined function instead. The
 * launcher's hints carry those frames (record/hints.py); without them the line says "or a
 * function inlined into it" only where that is so: a DW_TAG_inlined_subroutine whose ranges
 * cover the address, in the compile unit that covers it. The module's own .debug_info, else
 * its separate debug file by build-id (/usr/lib/debug/.build-id), as the symbolizer finds it.
 * Read-only mapping, every read bounds-checked; compressed sections, a form or version not
 * read here, or too much to read give "cannot tell". Cold path: at a denial line. */
#include "dwarf.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dwline.h"
#include "util.h"

#define MAX_WORK (512ull << 20) /* bytes of DIEs read before giving up */
#define DW_TAG_compile_unit 0x11
#define DW_TAG_partial_unit 0x3c
#define DW_TAG_inlined_subroutine 0x1d
#define DW_AT_low_pc 0x11
#define DW_AT_high_pc 0x12
#define DW_AT_ranges 0x55
#define DW_AT_addr_base 0x73
#define DW_AT_rnglists_base 0x74
#define DW_AT_dwo_name 0x76
#define DW_AT_GNU_dwo_name 0x2130
#define DW_TAG_class_type 0x02
#define DW_TAG_structure_type 0x13
#define DW_TAG_union_type 0x17
#define DW_TAG_namespace 0x39
#define DW_AT_name 0x03
#define DW_AT_stmt_list 0x10
#define DW_AT_abstract_origin 0x31
#define DW_AT_specification 0x47
#define DW_AT_call_file 0x58
#define DW_AT_call_line 0x59
#define DW_AT_linkage_name 0x6e
#define DW_AT_str_offsets_base 0x72
#define DW_AT_MIPS_linkage_name 0x2007
#define MAX_CHAIN 32  /* inlined calls at one address */
#define MAX_DEPTH 256 /* nested DIEs */
#define DW_TAG_subprogram 0x2e

struct dw {
    struct ct_dwsect info, abbrev, ranges, rnglists, addr, line, line_str, str, str_offsets;
    int compressed, debuglink;
};

/* ---- the ELF file's sections ------------------------------------------------------------ */
static void find_sections(const uint8_t *map, size_t size, struct dw *d)
{
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)map;
    memset(d, 0, sizeof *d);
    if (size < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) ||
        eh->e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
        eh->e_shentsize != sizeof(ElfW(Shdr)) || !eh->e_shoff || eh->e_shoff > size ||
        (size - eh->e_shoff) / sizeof(ElfW(Shdr)) < eh->e_shnum || eh->e_shstrndx >= eh->e_shnum)
        return;
    const ElfW(Shdr) *sh = (const ElfW(Shdr) *)(map + eh->e_shoff);
    const ElfW(Shdr) *names = &sh[eh->e_shstrndx];
    if (names->sh_offset > size || size - names->sh_offset < names->sh_size)
        return;
    static const char *const want[] = {".debug_info",     ".debug_abbrev",   ".debug_ranges",
                                       ".debug_rnglists", ".debug_addr",     ".debug_line",
                                       ".debug_str",      ".debug_line_str", ".debug_str_offsets"};
    struct ct_dwsect *to[] = {&d->info, &d->abbrev, &d->ranges,   &d->rnglists,   &d->addr,
                              &d->line, &d->str,    &d->line_str, &d->str_offsets};
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_name >= names->sh_size)
            continue;
        const char *nm = (const char *)map + names->sh_offset + sh[i].sh_name;
        size_t room = names->sh_size - sh[i].sh_name;
        if (!memchr(nm, 0, room))
            continue;
        if (!strcmp(nm, ".gnu_debuglink"))
            d->debuglink = 1;
        if (!strncmp(nm, ".zdebug_", 8))
            d->compressed = 1;
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
            if (strcmp(nm, want[k]) || sh[i].sh_type == SHT_NOBITS)
                continue;
            if (sh[i].sh_flags & SHF_COMPRESSED)
                d->compressed = 1;
            else if (sh[i].sh_offset <= size && size - sh[i].sh_offset >= sh[i].sh_size)
                *to[k] = (struct ct_dwsect){map + sh[i].sh_offset, sh[i].sh_size};
        }
    }
}

/* ---- one compile unit ------------------------------------------------------------------- */
struct spec {
    uint32_t at, form;
    int64_t implicit;
};
struct abbrev {
    uint64_t code, tag;
    uint32_t first, n;
    int children;
};
struct abbrevs {
    struct abbrev *a;
    struct spec *s;
    uint32_t na, ns, cap_a, cap_s;
    uint64_t off; /* the table read (offset in .debug_abbrev); ~0: none */
};

/* room for one more of n entries of each bytes in *p, *cap of them allocated */
static int grow(void **p, uint32_t n, uint32_t *cap, size_t each)
{
    if (n < *cap)
        return 1;
    uint32_t c = *cap ? *cap * 2 : 64;
    void *q = c > *cap ? realloc(*p, (size_t)c * each) : NULL;
    if (!q)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

static int read_abbrevs(const struct dw *d, uint64_t off, struct abbrevs *t)
{
    if (t->off == off)
        return 1;
    t->na = t->ns = 0;
    t->off = ~0ull;
    if (off >= d->abbrev.size)
        return 0;
    struct ct_cur c = {d->abbrev.p + off, d->abbrev.p + d->abbrev.size, 0};
    for (;;) {
        uint64_t code = ct_cur_uleb(&c);
        if (!code || c.bad)
            break;
        if (!grow((void **)&t->a, t->na, &t->cap_a, sizeof *t->a))
            return 0;
        struct abbrev *a = &t->a[t->na++];
        a->code = code;
        a->tag = ct_cur_uleb(&c);
        a->children = (int)ct_cur_un(&c, 1);
        a->first = t->ns;
        for (;;) {
            uint64_t at = ct_cur_uleb(&c), form = ct_cur_uleb(&c);
            if (c.bad || (!at && !form))
                break;
            if (!grow((void **)&t->s, t->ns, &t->cap_s, sizeof *t->s))
                return 0;
            struct spec *s = &t->s[t->ns++];
            s->at = (uint32_t)at;
            s->form = (uint32_t)form;
            s->implicit = form == 0x21 ? ct_cur_sleb(&c) : 0;
        }
        a->n = t->ns - a->first;
    }
    if (c.bad)
        return 0;
    t->off = off;
    return 1;
}

static const struct abbrev *abbrev_of(const struct abbrevs *t, uint64_t code)
{
    if (code && code <= t->na && t->a[code - 1].code == code)
        return &t->a[code - 1]; /* the common case: numbered from 1 */
    for (uint32_t i = 0; i < t->na; i++)
        if (t->a[i].code == code)
            return &t->a[i];
    return NULL;
}

struct unit {
    int version, dwarf64, addr_size, split; /* split: its DIEs are in a .dwo file */
    uint64_t base, addr_base, rnglists_base, str_offsets_base, stmt_list, abbrev_off;
    int has_stmt;
    const uint8_t *start, *dies, *end; /* its header, its first DIE, its end in .debug_info */
};

/* one attribute's value (constants, addresses, offsets, indices); blocks skipped, an inline
 * string's start in *str (when str is not NULL) */
static uint64_t form_value(struct ct_cur *c, const struct unit *u, uint32_t form, int64_t implicit,
                           const char **str)
{
    unsigned off = u->dwarf64 ? 8 : 4;
    switch (form) {
    case 0x01: /* addr */
        return ct_cur_un(c, (unsigned)u->addr_size);
    case 0x03: /* block2 */
        ct_cur_skip(c, ct_cur_un(c, 2));
        return 0;
    case 0x04: /* block4 */
        ct_cur_skip(c, ct_cur_un(c, 4));
        return 0;
    case 0x09: /* block */
    case 0x18: /* exprloc */
        ct_cur_skip(c, ct_cur_uleb(c));
        return 0;
    case 0x0a: /* block1 */
        ct_cur_skip(c, ct_cur_un(c, 1));
        return 0;
    case 0x08: /* string */
        if (str)
            *str = ct_cur_str(c);
        else
            ct_cur_str(c);
        return 0;
    case 0x0b:
    case 0x0c:
    case 0x11:
    case 0x25:
    case 0x29: /* data1 flag ref1 strx1 addrx1 */
        return ct_cur_un(c, 1);
    case 0x05:
    case 0x12:
    case 0x26:
    case 0x2a: /* data2 ref2 strx2 addrx2 */
        return ct_cur_un(c, 2);
    case 0x27:
    case 0x2b: /* strx3 addrx3 */
        return ct_cur_un(c, 3);
    case 0x06:
    case 0x13:
    case 0x1c:
    case 0x28:
    case 0x2c: /* data4 ref4 ref_sup4 strx4 addrx4 */
        return ct_cur_un(c, 4);
    case 0x07:
    case 0x14:
    case 0x20:
    case 0x24: /* data8 ref8 ref_sig8 ref_sup8 */
        return ct_cur_un(c, 8);
    case 0x1e: /* data16 */
        ct_cur_skip(c, 16);
        return 0;
    case 0x0d: /* sdata */
        return (uint64_t)ct_cur_sleb(c);
    case 0x0f:
    case 0x15:
    case 0x1a:
    case 0x1b: /* udata ref_udata strx addrx */
    case 0x22:
    case 0x23:
    case 0x1f01:
    case 0x1f02: /* loclistx rnglistx GNU indices */
        return ct_cur_uleb(c);
    case 0x0e:
    case 0x17:
    case 0x1d:
    case 0x1f: /* strp sec_offset strp_sup line_strp */
    case 0x1f20:
    case 0x1f21: /* GNU_ref_alt GNU_strp_alt */
        return ct_cur_un(c, off);
    case 0x10: /* ref_addr */
        return ct_cur_un(c, u->version <= 2 ? (unsigned)u->addr_size : off);
    case 0x19: /* flag_present */
        return 1;
    case 0x21: /* implicit_const */
        return (uint64_t)implicit;
    case 0x16: /* indirect */
        return form_value(c, u, (uint32_t)ct_cur_uleb(c), 0, str);
    default:
        c->bad = 1;
        return 0;
    }
}

static int addrx_form(uint32_t f) { return f == 0x1b || (f >= 0x29 && f <= 0x2c) || f == 0x1f01; }

/* the address at index i of .debug_addr; 0 with c->bad on failure */
static uint64_t addr_at(const struct dw *d, const struct unit *u, uint64_t i, int *bad)
{
    uint64_t at = u->addr_base + i * (uint64_t)u->addr_size;
    struct ct_cur c = {d->addr.p, d->addr.p + d->addr.size, 0};
    if (!u->addr_base || at >= d->addr.size) {
        *bad = 1;
        return 0;
    }
    c.p += at;
    uint64_t v = ct_cur_un(&c, (unsigned)u->addr_size);
    *bad |= c.bad;
    return v;
}

/* what a DIE says of where its code lies */
struct where {
    uint64_t low, high, ranges;
    uint32_t low_form, high_form, ranges_form;
    int has_low, has_high, has_ranges;
};

/* 1: the ranges the DIE names cover vaddr, 0: not, -1: cannot tell */
static int covers_ranges(const struct dw *d, const struct unit *u, const struct where *w,
                         uint64_t vaddr)
{
    int bad = 0;
    uint64_t base = u->base, off = w->ranges;
    unsigned osz = u->dwarf64 ? 8 : 4, as = (unsigned)u->addr_size;
    if (u->version < 5) {
        if (off >= d->ranges.size)
            return -1;
        struct ct_cur c = {d->ranges.p + off, d->ranges.p + d->ranges.size, 0};
        uint64_t ones = as == 8 ? ~0ull : 0xffffffffull;
        for (;;) {
            uint64_t a = ct_cur_un(&c, as), b = ct_cur_un(&c, as);
            if (c.bad)
                return -1;
            if (!a && !b)
                return 0;
            if (a == ones)
                base = b;
            else if (vaddr >= base + a && vaddr < base + b)
                return 1;
        }
    }
    if (w->ranges_form == 0x23) { /* rnglistx: an index into the unit's offset table */
        struct ct_cur t = {d->rnglists.p, d->rnglists.p + d->rnglists.size, 0};
        if (!u->rnglists_base || u->rnglists_base + (off + 1) * osz > d->rnglists.size)
            return -1;
        t.p += u->rnglists_base + off * osz;
        off = u->rnglists_base + ct_cur_un(&t, osz);
    }
    if (off >= d->rnglists.size)
        return -1;
    struct ct_cur c = {d->rnglists.p + off, d->rnglists.p + d->rnglists.size, 0};
    for (;;) {
        uint64_t kind = ct_cur_un(&c, 1), a = 0, b = 0;
        switch (kind) {
        case 0: /* end_of_list */
            return c.bad ? -1 : 0;
        case 1: /* base_addressx */
            base = addr_at(d, u, ct_cur_uleb(&c), &bad);
            continue;
        case 2: /* startx_endx */
            a = addr_at(d, u, ct_cur_uleb(&c), &bad);
            b = addr_at(d, u, ct_cur_uleb(&c), &bad);
            break;
        case 3: /* startx_length */
            a = addr_at(d, u, ct_cur_uleb(&c), &bad);
            b = a + ct_cur_uleb(&c);
            break;
        case 4: /* offset_pair */
            a = base + ct_cur_uleb(&c);
            b = base + ct_cur_uleb(&c);
            break;
        case 5: /* base_address */
            base = ct_cur_un(&c, as);
            continue;
        case 6: /* start_end */
            a = ct_cur_un(&c, as);
            b = ct_cur_un(&c, as);
            break;
        case 7: /* start_length */
            a = ct_cur_un(&c, as);
            b = a + ct_cur_uleb(&c);
            break;
        default:
            return -1;
        }
        if (c.bad || bad)
            return -1;
        if (vaddr >= a && vaddr < b)
            return 1;
    }
}

static int covers(const struct dw *d, const struct unit *u, const struct where *w, uint64_t vaddr)
{
    if (w->has_ranges)
        return covers_ranges(d, u, w, vaddr);
    if (!w->has_low || !w->has_high)
        return 0; /* no code of its own */
    int bad = 0;
    uint64_t lo = addrx_form(w->low_form) ? addr_at(d, u, w->low, &bad) : w->low;
    uint64_t hi = w->high;
    if (w->high_form == 0x01 || addrx_form(w->high_form))
        hi = addrx_form(w->high_form) ? addr_at(d, u, w->high, &bad) : w->high;
    else
        hi = lo + w->high; /* a constant: the length */
    return bad ? -1 : vaddr >= lo && vaddr < hi;
}

/* an attribute as read: its value, its form (0: absent), an inline string's start */
struct attr {
    uint64_t v;
    uint32_t form;
    const char *s;
};

/* what the readers want of a DIE: where its code lies, an inlined call's origin and call site,
 * what names a function; for the unit's own DIE its bases and line program */
struct die {
    struct where w;
    struct attr origin, spec, link, name;
    uint64_t call_file, call_line;
};

static void keep(struct attr *a, uint64_t v, uint32_t form, const char *str)
{
    a->v = v;
    a->form = form;
    a->s = str;
}

static void unit_attr(struct unit *u, uint32_t at, uint64_t v)
{
    if (at == DW_AT_addr_base)
        u->addr_base = v;
    else if (at == DW_AT_rnglists_base)
        u->rnglists_base = v;
    else if (at == DW_AT_str_offsets_base)
        u->str_offsets_base = v;
    else if (at == DW_AT_stmt_list) {
        u->stmt_list = v;
        u->has_stmt = 1;
    }
}

/* one DIE's attributes (after its code) into *e */
static void read_die(struct ct_cur *c, struct unit *u, const struct abbrevs *t,
                     const struct abbrev *a, struct die *e)
{
    memset(e, 0, sizeof *e);
    int unit_die = a->tag == DW_TAG_compile_unit || a->tag == DW_TAG_partial_unit;
    for (uint32_t k = 0; k < a->n && !c->bad; k++) {
        const struct spec *s = &t->s[a->first + k];
        uint32_t form = s->form;
        if (form == 0x16) /* indirect: the form comes first */
            form = (uint32_t)ct_cur_uleb(c);
        const char *str = NULL;
        uint64_t v = form_value(c, u, form, s->implicit, &str);
        struct where *w = &e->w;
        switch (s->at) {
        case DW_AT_low_pc:
            w->low = v;
            w->low_form = form;
            w->has_low = 1;
            break;
        case DW_AT_high_pc:
            w->high = v;
            w->high_form = form;
            w->has_high = 1;
            break;
        case DW_AT_ranges:
            w->ranges = v;
            w->ranges_form = form;
            w->has_ranges = 1;
            break;
        case DW_AT_abstract_origin:
            keep(&e->origin, v, form, NULL);
            break;
        case DW_AT_specification:
            keep(&e->spec, v, form, NULL);
            break;
        case DW_AT_linkage_name:
        case DW_AT_MIPS_linkage_name:
            keep(&e->link, v, form, str);
            break;
        case DW_AT_name:
            keep(&e->name, v, form, str);
            break;
        case DW_AT_call_file:
            e->call_file = v;
            break;
        case DW_AT_call_line:
            e->call_line = v;
            break;
        case DW_AT_dwo_name:
        case DW_AT_GNU_dwo_name:
            u->split = 1;
            break;
        default:
            if (unit_die)
                unit_attr(u, s->at, v);
        }
    }
}

/* the unit's own DIE, from u->dies: its bases; 1 when it was read */
static int read_unit_die(const struct dw *d, struct unit *u, const struct abbrevs *t, struct die *e)
{
    struct ct_cur c = {u->dies, u->end, 0};
    const struct abbrev *a = abbrev_of(t, ct_cur_uleb(&c));
    if (!a || c.bad)
        return 0;
    read_die(&c, u, t, a, e);
    if (e->w.has_low && !addrx_form(e->w.low_form))
        u->base = e->w.low;
    else if (e->w.has_low) {
        int bad = 0;
        u->base = addr_at(d, u, e->w.low, &bad);
    }
    return !c.bad;
}

/* ---- names ------------------------------------------------------------------------------- */

/* a string attribute's text (inline, .debug_str, .debug_line_str, or through the unit's string
 * offsets); NULL when it cannot be read here */
static const char *attr_str(const struct dw *d, const struct unit *u, const struct attr *a)
{
    uint64_t off = a->v;
    const struct ct_dwsect *s = &d->str;
    if (a->form == 0x08)
        return a->s;
    if (a->form == 0x1f)
        s = &d->line_str;
    else if (a->form == 0x1a || (a->form >= 0x25 && a->form <= 0x28) || a->form == 0x1f02) {
        unsigned osz = u->dwarf64 ? 8 : 4; /* strx: an index into the unit's string offsets */
        uint64_t at = u->str_offsets_base + off * osz;
        if (!u->str_offsets_base || at > d->str_offsets.size || d->str_offsets.size - at < osz)
            return NULL;
        struct ct_cur c = {d->str_offsets.p + at, d->str_offsets.p + d->str_offsets.size, 0};
        off = ct_cur_un(&c, osz);
    } else if (a->form != 0x0e)
        return NULL;
    if (!s->p || off >= s->size || !memchr(s->p + off, 0, s->size - off))
        return NULL;
    return (const char *)s->p + off;
}

/* a unit's header at p (an offset of .debug_info) into *u; 1 when it is one read here (a
 * compile or partial unit of DWARF 2 to 5) */
static int read_unit(const struct dw *d, const uint8_t *p, struct unit *u, uint64_t *next)
{
    struct ct_cur c = {p, d->info.p + d->info.size, 0};
    memset(u, 0, sizeof *u);
    u->start = p;
    uint64_t len = ct_cur_un(&c, 4);
    if (len == 0xffffffffull) {
        u->dwarf64 = 1;
        len = ct_cur_un(&c, 8);
    } else if (len >= 0xfffffff0ull)
        c.bad = 1;
    if (c.bad || len > (uint64_t)(c.end - c.p)) {
        *next = d->info.size;
        return -1;
    }
    u->end = c.p + len;
    *next = (uint64_t)(u->end - d->info.p);
    c.end = u->end;
    u->version = (int)ct_cur_un(&c, 2);
    int unit_type = 1;
    if (u->version >= 2 && u->version <= 4) {
        u->abbrev_off = ct_cur_un(&c, u->dwarf64 ? 8 : 4);
        u->addr_size = (int)ct_cur_un(&c, 1);
    } else if (u->version == 5) {
        unit_type = (int)ct_cur_un(&c, 1);
        u->addr_size = (int)ct_cur_un(&c, 1);
        u->abbrev_off = ct_cur_un(&c, u->dwarf64 ? 8 : 4);
        if (unit_type == 4 || unit_type == 5) { /* skeleton, split compile: a dwo_id */
            ct_cur_skip(&c, 8);
            u->split = 1;
        }
    } else
        return -1; /* a version not read here */
    if (unit_type == 2 || unit_type == 6)
        return 0; /* type units hold no code */
    u->dies = c.p;
    return c.bad || (u->addr_size != 4 && u->addr_size != 8) ? -1 : 1;
}

/* the DIE a reference attribute points to, and the unit it lies in (*u, changed when the
 * reference leaves it); NULL when it points nowhere read here (another file, a type unit) */
static const uint8_t *ref_target(const struct dw *d, struct unit *u, const struct attr *a,
                                 struct abbrevs *t)
{
    const uint8_t *p;
    if (a->form >= 0x11 && a->form <= 0x15) /* ref1 ref2 ref4 ref8 ref_udata: in the unit */
        p = u->start + a->v;
    else if (a->form == 0x10 && a->v < d->info.size) /* ref_addr */
        p = d->info.p + a->v;
    else
        return NULL;
    if (p >= u->dies && p < u->end)
        return p;
    if (a->form != 0x10)
        return NULL;
    for (uint64_t off = 0, next; off < d->info.size; off = next) { /* the unit that holds it */
        struct unit v;
        int r = read_unit(d, d->info.p + off, &v, &next);
        if (r < 0)
            return NULL;
        if (r && p >= v.dies && p < v.end) {
            struct die e;
            if (!read_abbrevs(d, v.abbrev_off, t) || !read_unit_die(d, &v, t, &e))
                return NULL;
            *u = v;
            return p;
        }
    }
    return NULL;
}

static int scope_tag(uint64_t tag)
{
    return tag == DW_TAG_namespace || tag == DW_TAG_class_type || tag == DW_TAG_structure_type ||
           tag == DW_TAG_union_type;
}

/* the namespaces and classes a function's DIE at target is declared in, `a::(anonymous
 * namespace)::C::`, as the reports write a name without a linkage name (symbols/dwarf.py
 * scope_prefix): "" at the top, or inside a function */
static void scope_prefix(const struct dw *d, struct unit *u, const struct abbrevs *t,
                         const uint8_t *target, char *out, size_t cap, uint64_t *work)
{
    size_t len[64];
    int opaque[64], depth = 0;
    struct ct_cur c = {u->dies, u->end, 0};
    size_t o = 0;
    out[0] = 0;
    while (c.p < c.end && !c.bad && depth < 64) {
        const uint8_t *at = c.p;
        uint64_t code = ct_cur_uleb(&c);
        if (!code) {
            if (--depth <= 0)
                break;
            o = len[depth];
            out[o] = 0;
            continue;
        }
        const struct abbrev *a = abbrev_of(t, code);
        if (!a)
            break;
        int inside = depth > 0 && opaque[depth - 1];
        if (at == target) {
            if (inside)
                out[0] = 0;
            break;
        }
        struct die e;
        read_die(&c, u, t, a, &e);
        if (!a->children)
            continue;
        len[depth] = o;
        opaque[depth] = inside || (depth > 0 && !scope_tag(a->tag));
        if (!opaque[depth] && depth > 0) {
            const char *nm = e.name.form ? attr_str(d, u, &e.name) : NULL;
            if (nm && *nm)
                o += ct_strlcpy(out + o, nm, cap - o);
            else if (a->tag == DW_TAG_namespace)
                o += ct_strlcpy(out + o, "(anonymous namespace)", cap - o);
            if (o > len[depth])
                o += ct_strlcpy(out + o, "::", cap - o);
        }
        depth++;
    }
    *work += (uint64_t)(c.p - u->dies);
    if (c.p >= c.end || c.bad || depth >= 64)
        out[0] = 0;
}

/* the name of the function whose DIE is at p (in unit *u): its linkage name (mangled), else
 * the one its specification or abstract origin gives, else its own name after its scopes;
 * 1 when found (*mangled: a linkage name) */
static int die_name(const struct dw *d, struct unit u, struct abbrevs *t, const uint8_t *p,
                    int depth, char *out, size_t cap, uint64_t *work)
{
    if (!p || depth > 8 || !read_abbrevs(d, u.abbrev_off, t))
        return 0;
    struct ct_cur c = {p, u.end, 0};
    const struct abbrev *a = abbrev_of(t, ct_cur_uleb(&c));
    if (!a || c.bad)
        return 0;
    struct die e;
    read_die(&c, &u, t, a, &e);
    if (c.bad)
        return 0;
    const char *s = e.link.form ? attr_str(d, &u, &e.link) : NULL;
    if (s && *s) {
        ct_strlcpy(out, s, cap);
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        struct attr *r = k ? &e.origin : &e.spec;
        struct unit v = u;
        if (r->form && die_name(d, v, t, ref_target(d, &v, r, t), depth + 1, out, cap, work))
            return 1;
    }
    s = e.name.form ? attr_str(d, &u, &e.name) : NULL;
    if (!s || !*s || !read_abbrevs(d, u.abbrev_off, t))
        return 0;
    scope_prefix(d, &u, t, p, out, cap, work);
    size_t o = strlen(out);
    ct_strlcpy(out + o, s, cap - o);
    return 1;
}

/* ---- the unit that covers an address ----------------------------------------------------- */

/* an inlined call covering the address: what it calls, from where */
struct link {
    struct attr origin;
    uint64_t call_file, call_line;
};

struct found {
    struct unit unit; /* the unit that covers the address (has_unit) */
    int has_unit;
    struct link chain[MAX_CHAIN]; /* the inlined calls covering it, outermost first */
    int n;
};

/* whether a DIE's scope holds vaddr, given its parent's: a function or an inlined call only
 * where its ranges cover it (a declaration has none), a block where it has none or they do */
static int holds(const struct dw *d, const struct unit *u, const struct abbrev *a,
                 const struct die *e, int parent, uint64_t vaddr)
{
    int ranged = e->w.has_ranges || (e->w.has_low && e->w.has_high);
    if (!parent)
        return 0;
    if (a->tag == DW_TAG_subprogram || a->tag == DW_TAG_inlined_subroutine)
        return ranged ? covers(d, u, &e->w, vaddr) : 0;
    return ranged ? covers(d, u, &e->w, vaddr) != 0 : 1; /* cannot tell: looked inside */
}

/* the unit's first DIE: its bases, whether it covers vaddr (*mine); 0 when it does not */
static int unit_covers(const struct dw *d, struct unit *u, const struct die *e, uint64_t vaddr,
                       int *mine)
{
    if (e->w.has_low && !addrx_form(e->w.low_form))
        u->base = e->w.low;
    else if (e->w.has_low) {
        int bad = 0;
        u->base = addr_at(d, u, e->w.low, &bad);
    }
    if (e->w.has_ranges || (e->w.has_low && e->w.has_high)) {
        int r = covers(d, u, &e->w, vaddr);
        if (r == 0)
            return 0; /* another unit's code */
        *mine = r > 0;
    }
    return 1;
}

/* the unit's DIEs from c: 1 when an inlined subroutine covers vaddr (the chain of them in f,
 * each inside the function and the scopes that hold vaddr, as symbols/inlines.py reads them),
 * 0 when none does (or the unit does not cover it: *mine 0), -1 when it cannot be told */
static int walk_unit(const struct dw *d, struct ct_cur *c, struct unit *u, const struct abbrevs *t,
                     uint64_t vaddr, uint64_t *work, struct found *f, int *mine)
{
    const uint8_t *start = c->p;
    int live[MAX_DEPTH], depth = -1; /* live[k]: the scope open at depth k holds vaddr */
    *mine = 0;
    f->n = 0;
    while (c->p < c->end && !c->bad) {
        uint64_t code = ct_cur_uleb(c);
        if (!code) { /* the end of a DIE's children */
            if (--depth < 0)
                break;
            continue;
        }
        const struct abbrev *a = abbrev_of(t, code);
        if (!a)
            return -1;
        struct die e;
        read_die(c, u, t, a, &e);
        if (c->bad)
            return -1;
        int in = 1;
        if (depth < 0) { /* the unit's own DIE */
            if (!unit_covers(d, u, &e, vaddr, mine))
                break;
            if (u->split)
                return -1; /* its inlined subroutines are in a file not read here */
        } else {
            in = holds(d, u, a, &e, live[depth], vaddr);
            if (in < 0 && a->tag == DW_TAG_inlined_subroutine)
                return -1;
            in = in > 0;
            if (in && a->tag == DW_TAG_inlined_subroutine) {
                if (f->n >= MAX_CHAIN)
                    return -1;
                f->chain[f->n++] = (struct link){e.origin, e.call_file, e.call_line};
            }
        }
        if (a->children) {
            if (depth + 1 >= MAX_DEPTH)
                return -1;
            live[++depth] = in;
        }
    }
    *work += (uint64_t)(c->p - start);
    if (c->bad)
        return -1;
    if (f->n)
        *mine = 1;
    return f->n > 0;
}

/* the unit covering vaddr and the inlined calls there: 1 when some inlined code covers it, 0
 * when none does, -1 when it cannot be told */
static int scan_units(const struct dw *d, uint64_t vaddr, struct abbrevs *t, struct found *f,
                      uint64_t *work)
{
    int result = 0;
    struct found cur;
    f->has_unit = 0;
    f->n = 0;
    for (uint64_t off = 0, next; off < d->info.size && result != 1; off = next) {
        struct unit u;
        int r = read_unit(d, d->info.p + off, &u, &next);
        if (r < 0 || *work > MAX_WORK) {
            result = -1;
            if (*work > MAX_WORK || next >= d->info.size)
                break;
            continue;
        }
        if (!r)
            continue;
        if (!read_abbrevs(d, u.abbrev_off, t)) {
            result = -1;
            continue;
        }
        struct ct_cur uc = {u.dies, u.end, 0};
        int mine = 0;
        r = walk_unit(d, &uc, &u, t, vaddr, work, &cur, &mine);
        if (r)
            result = r;
        if (mine && (r == 1 || !f->has_unit)) {
            cur.unit = u;
            cur.has_unit = 1;
            *f = cur;
        }
    }
    return result;
}

/* ---- the file, or its separate debug file ----------------------------------------------- */

/* what one file tells of vaddr: the inline answer (1, 0, -1; -2 no DWARF in this file), and
 * with out the frames (*nframes of them) */
struct want {
    uint64_t vaddr;
    struct ct_dwarf_frame *out;
    int max, nframes, debuglink;
};

/* the frames of f, innermost first: each inlined call at the location of what it called, the
 * concrete function last; line-table and name failures leave a field empty */
static int frames_of(const struct dw *d, struct found *f, struct abbrevs *t, struct want *w,
                     uint64_t *work)
{
    struct unit *u = &f->unit;
    struct ct_lines l = {d->line, d->line_str, d->str, u->stmt_list, u->addr_size};
    uint64_t file = 0;
    uint32_t line = 0;
    int has = u->has_stmt && ct_lines_find(&l, w->vaddr, &file, &line) == 1;
    int n = 0, keep_inl = f->n < w->max ? f->n : w->max - 1;
    for (int i = f->n - 1; i >= 0 && w->max > 0; i--) {
        int shown = i >= f->n - keep_inl; /* the innermost ones, when there are too many */
        struct ct_dwarf_frame *o = shown ? &w->out[n++] : NULL;
        if (o) {
            memset(o, 0, sizeof *o);
            if (has && !ct_lines_file(&l, file, o->file, sizeof o->file))
                o->file[0] = 0;
            o->line = has && o->file[0] ? line : 0;
            struct unit v = *u;
            if (!die_name(d, v, t, ref_target(d, &v, &f->chain[i].origin, t), 0, o->name,
                          sizeof o->name, work))
                o->name[0] = 0;
        }
        file = f->chain[i].call_file; /* the caller's location: where this was called */
        line = f->chain[i].call_line > 0xffffffffull ? 0 : (uint32_t)f->chain[i].call_line;
        has = u->has_stmt && line;
    }
    if (n < w->max) {
        struct ct_dwarf_frame *o = &w->out[n++];
        memset(o, 0, sizeof *o);
        if (has && ct_lines_file(&l, file, o->file, sizeof o->file))
            o->line = line;
    }
    return n;
}

static int from_file(const char *path, struct want *w)
{
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return -2; /* no such file */
    struct stat st;
    int r = 0;
    if (fstat(f, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > (off_t)sizeof(ElfW(Ehdr))) {
        size_t size = (size_t)st.st_size;
        uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, f, 0);
        if (map != MAP_FAILED) {
            struct dw d;
            find_sections(map, size, &d);
            w->debuglink = d.debuglink;
            if (d.compressed)
                r = -1;
            else if (!d.info.size)
                r = -2; /* no DWARF here */
            else if (!d.abbrev.size)
                r = -1;
            else {
                struct abbrevs t = {NULL, NULL, 0, 0, 0, 0, ~0ull};
                struct found *fd = malloc(sizeof *fd);
                uint64_t work = 0;
                r = fd ? scan_units(&d, w->vaddr, &t, fd, &work) : -1;
                if (r >= 0 && w->out && fd->has_unit)
                    w->nframes = frames_of(&d, fd, &t, w, &work);
                free(fd);
                free(t.a);
                free(t.s);
            }
            munmap(map, size);
        }
    }
    close(f);
    return r;
}

/* the module's own file, else its debug file by build-id (the symbolizer's first place) */
static int lookup(const char *path, const uint8_t *bid, uint32_t blen, struct want *w)
{
    int r = path && path[0] ? from_file(path, w) : -1;
    if (r != -2)
        return r;
    int debuglink = w->debuglink;
    if (blen >= 2 && blen <= 64) {
        static const char hex[] = "0123456789abcdef";
        char dbg[200];
        size_t o = ct_strlcpy(dbg, "/usr/lib/debug/.build-id/", sizeof dbg);
        for (uint32_t i = 0; i < blen && o + 8 < sizeof dbg; i++) {
            dbg[o++] = hex[bid[i] >> 4];
            dbg[o++] = hex[bid[i] & 15];
            if (!i)
                dbg[o++] = '/';
        }
        ct_strlcpy(dbg + o, ".debug", sizeof dbg - o);
        r = from_file(dbg, w);
        if (r != -2)
            return r;
    }
    return debuglink ? -1 : 0; /* a debug file elsewhere: not known here; else no DWARF */
}

int ct_dwarf_inlined_at(const char *path, const uint8_t *bid, uint32_t blen, uint64_t vaddr)
{
    struct want w = {vaddr, NULL, 0, 0, 0};
    return lookup(path, bid, blen, &w);
}

int ct_dwarf_frames(const char *path, const uint8_t *bid, uint32_t blen, uint64_t vaddr,
                    struct ct_dwarf_frame *out, int max)
{
    struct want w = {vaddr, out, max, 0, 0};
    int r = lookup(path, bid, blen, &w);
    return r < 0 ? -1 : w.nframes;
}
