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

struct sect {
    const uint8_t *p;
    uint64_t size;
};

struct dw {
    struct sect info, abbrev, ranges, rnglists, addr;
    int compressed, debuglink;
};

struct cur {
    const uint8_t *p, *end;
    int bad;
};

static int need(struct cur *c, uint64_t n)
{
    if (c->bad || (uint64_t)(c->end - c->p) < n) {
        c->bad = 1;
        return 0;
    }
    return 1;
}

static uint64_t un(struct cur *c, unsigned n) /* little-endian, n <= 8 */
{
    uint64_t v = 0;
    if (!need(c, n))
        return 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)c->p[i] << (8 * i);
    c->p += n;
    return v;
}

static uint64_t uleb(struct cur *c)
{
    uint64_t v = 0;
    for (unsigned shift = 0; need(c, 1); shift += 7) {
        uint8_t b = *c->p++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    return 0;
}

static int64_t sleb(struct cur *c)
{
    uint64_t v = 0;
    unsigned shift = 0;
    while (need(c, 1)) {
        uint8_t b = *c->p++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) {
            if (shift < 64 && (b & 0x40))
                v |= ~0ull << shift;
            break;
        }
    }
    return (int64_t)v;
}

static void skip(struct cur *c, uint64_t n)
{
    if (need(c, n))
        c->p += n;
}

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
    static const char *const want[] = {".debug_info", ".debug_abbrev", ".debug_ranges",
                                       ".debug_rnglists", ".debug_addr"};
    struct sect *to[] = {&d->info, &d->abbrev, &d->ranges, &d->rnglists, &d->addr};
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
                *to[k] = (struct sect){map + sh[i].sh_offset, sh[i].sh_size};
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
    struct cur c = {d->abbrev.p + off, d->abbrev.p + d->abbrev.size, 0};
    for (;;) {
        uint64_t code = uleb(&c);
        if (!code || c.bad)
            break;
        if (!grow((void **)&t->a, t->na, &t->cap_a, sizeof *t->a))
            return 0;
        struct abbrev *a = &t->a[t->na++];
        a->code = code;
        a->tag = uleb(&c);
        skip(&c, 1); /* has children: the walk reads the null entries instead */
        a->first = t->ns;
        for (;;) {
            uint64_t at = uleb(&c), form = uleb(&c);
            if (c.bad || (!at && !form))
                break;
            if (!grow((void **)&t->s, t->ns, &t->cap_s, sizeof *t->s))
                return 0;
            struct spec *s = &t->s[t->ns++];
            s->at = (uint32_t)at;
            s->form = (uint32_t)form;
            s->implicit = form == 0x21 ? sleb(&c) : 0;
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
    uint64_t base, addr_base, rnglists_base;
};

/* one attribute's value (constants, addresses, offsets, indices); blocks and strings skipped */
static uint64_t form_value(struct cur *c, const struct unit *u, uint32_t form, int64_t implicit)
{
    unsigned off = u->dwarf64 ? 8 : 4;
    switch (form) {
    case 0x01: /* addr */
        return un(c, (unsigned)u->addr_size);
    case 0x03: /* block2 */
        skip(c, un(c, 2));
        return 0;
    case 0x04: /* block4 */
        skip(c, un(c, 4));
        return 0;
    case 0x09: /* block */
    case 0x18: /* exprloc */
        skip(c, uleb(c));
        return 0;
    case 0x0a: /* block1 */
        skip(c, un(c, 1));
        return 0;
    case 0x08: /* string */
        while (need(c, 1) && *c->p++)
            ;
        return 0;
    case 0x0b:
    case 0x0c:
    case 0x11:
    case 0x25:
    case 0x29: /* data1 flag ref1 strx1 addrx1 */
        return un(c, 1);
    case 0x05:
    case 0x12:
    case 0x26:
    case 0x2a: /* data2 ref2 strx2 addrx2 */
        return un(c, 2);
    case 0x27:
    case 0x2b: /* strx3 addrx3 */
        return un(c, 3);
    case 0x06:
    case 0x13:
    case 0x1c:
    case 0x28:
    case 0x2c: /* data4 ref4 ref_sup4 strx4 addrx4 */
        return un(c, 4);
    case 0x07:
    case 0x14:
    case 0x20:
    case 0x24: /* data8 ref8 ref_sig8 ref_sup8 */
        return un(c, 8);
    case 0x1e: /* data16 */
        skip(c, 16);
        return 0;
    case 0x0d: /* sdata */
        return (uint64_t)sleb(c);
    case 0x0f:
    case 0x15:
    case 0x1a:
    case 0x1b: /* udata ref_udata strx addrx */
    case 0x22:
    case 0x23:
    case 0x1f01:
    case 0x1f02: /* loclistx rnglistx GNU indices */
        return uleb(c);
    case 0x0e:
    case 0x17:
    case 0x1d:
    case 0x1f: /* strp sec_offset strp_sup line_strp */
    case 0x1f20:
    case 0x1f21: /* GNU_ref_alt GNU_strp_alt */
        return un(c, off);
    case 0x10: /* ref_addr */
        return un(c, u->version <= 2 ? (unsigned)u->addr_size : off);
    case 0x19: /* flag_present */
        return 1;
    case 0x21: /* implicit_const */
        return (uint64_t)implicit;
    case 0x16: /* indirect */
        return form_value(c, u, (uint32_t)uleb(c), 0);
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
    struct cur c = {d->addr.p, d->addr.p + d->addr.size, 0};
    if (!u->addr_base || at >= d->addr.size) {
        *bad = 1;
        return 0;
    }
    c.p += at;
    uint64_t v = un(&c, (unsigned)u->addr_size);
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
        struct cur c = {d->ranges.p + off, d->ranges.p + d->ranges.size, 0};
        uint64_t ones = as == 8 ? ~0ull : 0xffffffffull;
        for (;;) {
            uint64_t a = un(&c, as), b = un(&c, as);
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
        struct cur t = {d->rnglists.p, d->rnglists.p + d->rnglists.size, 0};
        if (!u->rnglists_base || u->rnglists_base + (off + 1) * osz > d->rnglists.size)
            return -1;
        t.p += u->rnglists_base + off * osz;
        off = u->rnglists_base + un(&t, osz);
    }
    if (off >= d->rnglists.size)
        return -1;
    struct cur c = {d->rnglists.p + off, d->rnglists.p + d->rnglists.size, 0};
    for (;;) {
        uint64_t kind = un(&c, 1), a = 0, b = 0;
        switch (kind) {
        case 0: /* end_of_list */
            return c.bad ? -1 : 0;
        case 1: /* base_addressx */
            base = addr_at(d, u, uleb(&c), &bad);
            continue;
        case 2: /* startx_endx */
            a = addr_at(d, u, uleb(&c), &bad);
            b = addr_at(d, u, uleb(&c), &bad);
            break;
        case 3: /* startx_length */
            a = addr_at(d, u, uleb(&c), &bad);
            b = a + uleb(&c);
            break;
        case 4: /* offset_pair */
            a = base + uleb(&c);
            b = base + uleb(&c);
            break;
        case 5: /* base_address */
            base = un(&c, as);
            continue;
        case 6: /* start_end */
            a = un(&c, as);
            b = un(&c, as);
            break;
        case 7: /* start_length */
            a = un(&c, as);
            b = a + uleb(&c);
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

/* one DIE's attributes: where its code lies, and for the unit's own DIE its bases */
static void read_die(struct cur *c, struct unit *u, const struct abbrevs *t, const struct abbrev *a,
                     struct where *w)
{
    memset(w, 0, sizeof *w);
    for (uint32_t k = 0; k < a->n && !c->bad; k++) {
        const struct spec *s = &t->s[a->first + k];
        uint32_t form = s->form;
        if (form == 0x16) /* indirect: the form comes first */
            form = (uint32_t)uleb(c);
        uint64_t v = form_value(c, u, form, s->implicit);
        if (s->at == DW_AT_low_pc) {
            w->low = v;
            w->low_form = form;
            w->has_low = 1;
        } else if (s->at == DW_AT_high_pc) {
            w->high = v;
            w->high_form = form;
            w->has_high = 1;
        } else if (s->at == DW_AT_ranges) {
            w->ranges = v;
            w->ranges_form = form;
            w->has_ranges = 1;
        } else if (s->at == DW_AT_addr_base &&
                   (a->tag == DW_TAG_compile_unit || a->tag == DW_TAG_partial_unit)) {
            u->addr_base = v;
        } else if (s->at == DW_AT_rnglists_base &&
                   (a->tag == DW_TAG_compile_unit || a->tag == DW_TAG_partial_unit)) {
            u->rnglists_base = v;
        } else if (s->at == DW_AT_dwo_name || s->at == DW_AT_GNU_dwo_name) {
            u->split = 1;
        }
    }
}

/* the unit's DIEs from c: 1 when an inlined subroutine covers vaddr, 0 when none does (or the
 * unit does not cover it), -1 when it cannot be told */
static int walk_unit(const struct dw *d, struct cur *c, struct unit *u, const struct abbrevs *t,
                     uint64_t vaddr, uint64_t *work)
{
    const uint8_t *start = c->p;
    int first = 1;
    while (c->p < c->end && !c->bad) {
        uint64_t code = uleb(c);
        if (!code)
            continue; /* the end of a DIE's children */
        const struct abbrev *a = abbrev_of(t, code);
        if (!a)
            return -1;
        struct where w;
        read_die(c, u, t, a, &w);
        if (c->bad)
            return -1;
        if (first) {
            first = 0;
            if (w.has_low && !addrx_form(w.low_form))
                u->base = w.low;
            else if (w.has_low) {
                int bad = 0;
                u->base = addr_at(d, u, w.low, &bad);
            }
            if ((w.has_ranges || (w.has_low && w.has_high)) && covers(d, u, &w, vaddr) == 0)
                break; /* another unit's code */
            if (u->split)
                return -1; /* its inlined subroutines are in a file not read here */
            continue;
        }
        if (a->tag == DW_TAG_inlined_subroutine) {
            int r = covers(d, u, &w, vaddr);
            if (r)
                return r;
        }
    }
    *work += (uint64_t)(c->p - start);
    return c->bad ? -1 : 0;
}

static int scan_units(const struct dw *d, uint64_t vaddr)
{
    struct abbrevs t = {NULL, NULL, 0, 0, 0, 0, ~0ull};
    struct cur c = {d->info.p, d->info.p + d->info.size, 0};
    uint64_t work = 0;
    int result = 0;
    while (c.p < c.end && result != 1) {
        struct unit u = {0};
        uint64_t len = un(&c, 4);
        if (len == 0xffffffffull) {
            u.dwarf64 = 1;
            len = un(&c, 8);
        } else if (len >= 0xfffffff0ull)
            c.bad = 1;
        if (c.bad || len > (uint64_t)(c.end - c.p) || work > MAX_WORK) {
            result = -1;
            break;
        }
        struct cur uc = {c.p, c.p + len, 0};
        c.p += len;
        u.version = (int)un(&uc, 2);
        uint64_t abbrev_off;
        int unit_type = 1;
        if (u.version >= 2 && u.version <= 4) {
            abbrev_off = un(&uc, u.dwarf64 ? 8 : 4);
            u.addr_size = (int)un(&uc, 1);
        } else if (u.version == 5) {
            unit_type = (int)un(&uc, 1);
            u.addr_size = (int)un(&uc, 1);
            abbrev_off = un(&uc, u.dwarf64 ? 8 : 4);
            if (unit_type == 4 || unit_type == 5) { /* skeleton, split compile: a dwo_id */
                skip(&uc, 8);
                u.split = 1;
            }
        } else {
            result = -1; /* a version not read here */
            continue;
        }
        if (unit_type == 2 || unit_type == 6) /* type units hold no code */
            continue;
        if (uc.bad || (u.addr_size != 4 && u.addr_size != 8) || !read_abbrevs(d, abbrev_off, &t)) {
            result = -1;
            continue;
        }
        int r = walk_unit(d, &uc, &u, &t, vaddr, &work);
        if (r)
            result = r;
    }
    free(t.a);
    free(t.s);
    return result;
}

/* ---- the file, or its separate debug file ----------------------------------------------- */
static int from_file(const char *path, uint64_t vaddr, int *debuglink)
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
            *debuglink = d.debuglink;
            if (d.compressed)
                r = -1;
            else if (!d.info.size)
                r = -2; /* no DWARF here */
            else
                r = d.abbrev.size ? scan_units(&d, vaddr) : -1;
            munmap(map, size);
        }
    }
    close(f);
    return r;
}

int ct_dwarf_inlined_at(const char *path, const uint8_t *bid, uint32_t blen, uint64_t vaddr)
{
    int debuglink = 0;
    int r = path && path[0] ? from_file(path, vaddr, &debuglink) : -1;
    if (r != -2)
        return r;
    if (blen >= 2 && blen <= 64) { /* the symbolizer's first place: the build-id's debug file */
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
        int ignored = 0;
        r = from_file(dbg, vaddr, &ignored);
        if (r != -2)
            return r;
    }
    return debuglink ? -1 : 0; /* a debug file elsewhere: not known here; else no DWARF */
}
