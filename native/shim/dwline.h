/* dwline.h - a unit's DWARF line program (.debug_line, versions 2 to 5) read at a denial
 * (dwline.c): the file and line of an address, and a file's name by its index, for the line's
 * `(file:line)`. Also the bounds-checked little-endian cursor the shim's DWARF readers share
 * (dwarf.c): every read checks what is left, a short or damaged section sets bad. */
#ifndef CUDATRACE_DWLINE_H
#define CUDATRACE_DWLINE_H

#include <stddef.h>
#include <stdint.h>

struct ct_dwsect {
    const uint8_t *p;
    uint64_t size;
};

/* ---- the cursor -------------------------------------------------------------------------- */
struct ct_cur {
    const uint8_t *p, *end;
    int bad;
};

static inline int ct_cur_need(struct ct_cur *c, uint64_t n)
{
    if (c->bad || (uint64_t)(c->end - c->p) < n) {
        c->bad = 1;
        return 0;
    }
    return 1;
}

static inline uint64_t ct_cur_un(struct ct_cur *c, unsigned n) /* little-endian, n <= 8 */
{
    uint64_t v = 0;
    if (!ct_cur_need(c, n))
        return 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)c->p[i] << (8 * i);
    c->p += n;
    return v;
}

static inline uint64_t ct_cur_uleb(struct ct_cur *c)
{
    uint64_t v = 0;
    for (unsigned shift = 0; ct_cur_need(c, 1); shift += 7) {
        uint8_t b = *c->p++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    return 0;
}

static inline int64_t ct_cur_sleb(struct ct_cur *c)
{
    uint64_t v = 0;
    unsigned shift = 0;
    while (ct_cur_need(c, 1)) {
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

static inline void ct_cur_skip(struct ct_cur *c, uint64_t n)
{
    if (ct_cur_need(c, n))
        c->p += n;
}

/* a NUL-terminated string at the cursor (skipped); NULL when it runs past the end */
static inline const char *ct_cur_str(struct ct_cur *c)
{
    const uint8_t *s = c->p;
    while (ct_cur_need(c, 1) && *c->p++)
        ;
    return c->bad ? NULL : (const char *)s;
}

/* ---- the line program -------------------------------------------------------------------- */
struct ct_lines {
    struct ct_dwsect line, line_str, str; /* .debug_line, .debug_line_str, .debug_str */
    uint64_t off;                         /* the unit's DW_AT_stmt_list */
    int addr_size;                        /* the unit's */
};

/* the row covering vaddr (a link-time address of code): the last row at or below it in a
 * sequence that goes past it, as the reports' symbolizer reads it (symbols/lines.py). 1 with
 * *file (its index) and *line, 0 when no sequence covers vaddr, -1 when the program cannot be
 * read (damaged, a version not read here, too long) */
int ct_lines_find(const struct ct_lines *l, uint64_t vaddr, uint64_t *file, uint32_t *line);
/* the base name of the file at index `file` of the header's table (DWARF 5 counts from 0,
 * earlier versions from 1) into out[0..cap); 0 when there is none */
int ct_lines_file(const struct ct_lines *l, uint64_t file, char *out, size_t cap);

#endif
