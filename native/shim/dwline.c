/* dwline.c - a unit's DWARF line program, read at a denial (dwline.h).
 *
 * The reports name a frame `function (file:line)`: the line-table row of its address, or the
 * line its inlined callee was called from (symbols/lines.py, symbolizer.py). The shim's denial
 * line says the same of the code it names: dwarf.c finds the unit and the inlined calls, this
 * runs the unit's line program (DWARF 2 to 5: the header, the standard, special and extended
 * opcodes, the file table with DWARF 5's entry formats) up to the row that covers the
 * address. No state is kept between calls; every read is bounds-checked (a damaged section
 * gives "cannot tell", never a read outside it); a program longer than MAX_PROGRAM is not
 * read. Cold path only. */
#include "dwline.h"

#include <string.h>

#include "util.h"

#define MAX_PROGRAM (64ull << 20) /* bytes of one unit's line program */
#define DW_LNCT_path 1

struct header {
    int version, dwarf64, addr_size;
    uint8_t min_inst, line_range, opcode_base;
    int8_t line_base;
    const uint8_t *std_lens; /* opcode_base - 1 operand counts */
    const uint8_t *tables;   /* the directory and file tables */
    const uint8_t *program, *end;
};

static int read_header(const struct ct_lines *l, struct header *h)
{
    memset(h, 0, sizeof *h);
    if (!l->line.p || l->off >= l->line.size)
        return 0;
    struct ct_cur c = {l->line.p + l->off, l->line.p + l->line.size, 0};
    uint64_t len = ct_cur_un(&c, 4);
    if (len == 0xffffffffull) {
        h->dwarf64 = 1;
        len = ct_cur_un(&c, 8);
    } else if (len >= 0xfffffff0ull)
        return 0;
    if (c.bad || len > (uint64_t)(c.end - c.p) || len > MAX_PROGRAM)
        return 0;
    c.end = h->end = c.p + len;
    h->version = (int)ct_cur_un(&c, 2);
    if (h->version < 2 || h->version > 5)
        return 0;
    h->addr_size = l->addr_size;
    if (h->version >= 5) {
        h->addr_size = (int)ct_cur_un(&c, 1);
        ct_cur_skip(&c, 1); /* segment selector size */
    }
    uint64_t hlen = ct_cur_un(&c, h->dwarf64 ? 8 : 4);
    if (c.bad || hlen > (uint64_t)(c.end - c.p))
        return 0;
    h->program = c.p + hlen;
    h->min_inst = (uint8_t)ct_cur_un(&c, 1);
    if (h->version >= 4)
        ct_cur_skip(&c, 1); /* maximum operations per instruction: VLIW, read as 1 */
    ct_cur_skip(&c, 1);     /* default_is_stmt */
    h->line_base = (int8_t)ct_cur_un(&c, 1);
    h->line_range = (uint8_t)ct_cur_un(&c, 1);
    h->opcode_base = (uint8_t)ct_cur_un(&c, 1);
    h->std_lens = c.p;
    if (h->opcode_base)
        ct_cur_skip(&c, h->opcode_base - 1u);
    h->tables = c.p;
    return !c.bad && h->line_range && h->opcode_base && c.p <= h->program &&
           (h->addr_size == 4 || h->addr_size == 8);
}

/* the program's state between rows (DWARF 5, 6.2.2) and what it found */
struct machine {
    uint64_t addr, file, pf, pa; /* pf, pa: the last row's file and address */
    int64_t line, pl;
    int rows, skip; /* rows of this sequence; skip: it starts at 0 (discarded code) */
    int found;
    uint64_t want, file_out;
    uint32_t line_out;
};

/* a row at m->addr: the previous row covers the addresses up to it */
static void row(struct machine *m)
{
    if (!m->rows && !m->addr)
        m->skip = 1; /* a sequence at address 0: code the linker discarded */
    if (m->rows && !m->skip && m->pa <= m->want && m->want < m->addr && !m->found) {
        m->found = 1;
        m->file_out = m->pf;
        m->line_out = m->pl > 0 && m->pl <= 0xffffffffll ? (uint32_t)m->pl : 0;
    }
    m->rows++;
    m->pf = m->file;
    m->pl = m->line;
    m->pa = m->addr;
}

static void end_sequence(struct machine *m)
{
    row(m);
    m->addr = m->pa = 0;
    m->file = 1;
    m->line = 1;
    m->rows = m->skip = 0;
}

/* one extended opcode (after its 0): end_sequence, set_address; the rest skipped */
static void extended(struct ct_cur *c, struct machine *m)
{
    uint64_t len = ct_cur_uleb(c);
    if (!len || !ct_cur_need(c, len))
        return;
    const uint8_t *next = c->p + len;
    uint8_t sub = *c->p++;
    if (sub == 1) {
        end_sequence(m);
    } else if (sub == 2) {
        struct ct_cur a = {c->p, next, 0};
        m->addr = ct_cur_un(&a, (unsigned)(len - 1 < 8 ? len - 1 : 8));
    }
    c->p = next;
}

/* one standard opcode; 1 when it appended a row */
static int standard(struct ct_cur *c, const struct header *h, struct machine *m, uint8_t op)
{
    switch (op) {
    case 1: /* copy */
        return 1;
    case 2: /* advance_pc */
        m->addr += ct_cur_uleb(c) * h->min_inst;
        return 0;
    case 3: /* advance_line */
        m->line += ct_cur_sleb(c);
        return 0;
    case 4: /* set_file */
        m->file = ct_cur_uleb(c);
        return 0;
    case 8: /* const_add_pc */
        m->addr += (uint64_t)((255u - h->opcode_base) / h->line_range) * h->min_inst;
        return 0;
    case 9: /* fixed_advance_pc */
        m->addr += ct_cur_un(c, 2);
        return 0;
    case 6:
    case 7:
    case 10:
    case 11: /* negate_stmt, set_basic_block, set_prologue_end, set_epilogue_begin */
        return 0;
    default: /* set_column, set_isa, an opcode of a later version: ULEB operands */
        for (unsigned k = 0; k < h->std_lens[op - 1] && !c->bad; k++)
            ct_cur_uleb(c);
        return 0;
    }
}

int ct_lines_find(const struct ct_lines *l, uint64_t vaddr, uint64_t *file, uint32_t *line)
{
    struct header h;
    if (!read_header(l, &h))
        return -1;
    struct ct_cur c = {h.program, h.end, 0};
    struct machine m = {0};
    m.file = 1;
    m.line = 1;
    m.want = vaddr;
    while (c.p < c.end && !c.bad && !m.found) {
        uint8_t op = *c.p++;
        if (op >= h.opcode_base) { /* special: advance both, append a row */
            unsigned adj = op - h.opcode_base;
            m.addr += (uint64_t)(adj / h.line_range) * h.min_inst;
            m.line += h.line_base + (int)(adj % h.line_range);
            row(&m);
        } else if (op == 0) {
            extended(&c, &m);
        } else if (standard(&c, &h, &m, op)) {
            row(&m);
        }
    }
    if (!m.found)
        return c.bad ? -1 : 0;
    *file = m.file_out;
    *line = m.line_out;
    return 1;
}

/* ---- the file table ---------------------------------------------------------------------- */

/* a string attribute of a DWARF 5 entry; NULL when its form is not read here */
static const char *entry_str(const struct ct_lines *l, const struct header *h, struct ct_cur *c,
                             uint64_t form)
{
    const struct ct_dwsect *s = form == 0x1f ? &l->line_str : form == 0x0e ? &l->str : NULL;
    if (form == 0x08) /* string */
        return ct_cur_str(c);
    if (!s)
        return NULL;
    uint64_t off = ct_cur_un(c, h->dwarf64 ? 8 : 4);
    if (c->bad || !s->p || off >= s->size || !memchr(s->p + off, 0, s->size - off))
        return NULL;
    return (const char *)s->p + off;
}

/* skip one DWARF 5 entry attribute of this form; 0 when the form is not read here */
static int skip_form(struct ct_cur *c, const struct header *h, uint64_t form)
{
    switch (form) {
    case 0x08: /* string */
        return ct_cur_str(c) != NULL;
    case 0x0e:
    case 0x1f: /* strp, line_strp */
        ct_cur_skip(c, h->dwarf64 ? 8 : 4);
        return !c->bad;
    case 0x0b:
    case 0x25: /* data1, strx1 */
        ct_cur_skip(c, 1);
        return !c->bad;
    case 0x05:
    case 0x26: /* data2, strx2 */
        ct_cur_skip(c, 2);
        return !c->bad;
    case 0x27: /* strx3 */
        ct_cur_skip(c, 3);
        return !c->bad;
    case 0x06:
    case 0x28: /* data4, strx4 */
        ct_cur_skip(c, 4);
        return !c->bad;
    case 0x07: /* data8 */
        ct_cur_skip(c, 8);
        return !c->bad;
    case 0x1e: /* data16 (an MD5) */
        ct_cur_skip(c, 16);
        return !c->bad;
    case 0x0f:
    case 0x1a: /* udata, strx */
        ct_cur_uleb(c);
        return !c->bad;
    case 0x09: /* block */
        ct_cur_skip(c, ct_cur_uleb(c));
        return !c->bad;
    default:
        return 0;
    }
}

/* DWARF 5: the directory table, then the path of file `want` (counted from 0) */
static const char *file_v5(const struct ct_lines *l, const struct header *h, uint64_t want)
{
    struct ct_cur c = {h->tables, h->program, 0};
    uint64_t fmt[16]; /* (content type, form) pairs of the table being read */
    for (int table = 0; table < 2; table++) {
        unsigned nf = (unsigned)ct_cur_un(&c, 1);
        if (nf > 8)
            return NULL;
        for (unsigned k = 0; k < nf; k++) {
            fmt[2 * k] = ct_cur_uleb(&c);
            fmt[2 * k + 1] = ct_cur_uleb(&c);
        }
        uint64_t count = ct_cur_uleb(&c);
        if (c.bad)
            return NULL;
        for (uint64_t i = 0; i < count && !c.bad; i++)
            for (unsigned k = 0; k < nf; k++) {
                uint64_t what = fmt[2 * k], form = fmt[2 * k + 1];
                if (table == 1 && i == want && what == DW_LNCT_path)
                    return entry_str(l, h, &c, form);
                if (!skip_form(&c, h, form))
                    return NULL;
            }
    }
    return NULL;
}

/* DWARF 2 to 4: include_directories, then file_names (counted from 1) */
static const char *file_v4(const struct header *h, uint64_t want)
{
    struct ct_cur c = {h->tables, h->program, 0};
    const char *s;
    while ((s = ct_cur_str(&c)) && *s)
        ;
    for (uint64_t i = 1; (s = ct_cur_str(&c)) && *s; i++) {
        if (i == want)
            return s;
        ct_cur_uleb(&c); /* directory, time, length */
        ct_cur_uleb(&c);
        ct_cur_uleb(&c);
    }
    return NULL;
}

int ct_lines_file(const struct ct_lines *l, uint64_t file, char *out, size_t cap)
{
    struct header h;
    out[0] = 0;
    if (!cap || !read_header(l, &h))
        return 0;
    const char *path = h.version >= 5 ? file_v5(l, &h, file) : file_v4(&h, file);
    if (!path || !*path)
        return 0;
    const char *base = strrchr(path, '/');
    ct_strlcpy(out, base ? base + 1 : path, cap);
    return out[0] != 0;
}
