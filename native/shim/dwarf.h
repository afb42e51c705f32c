/* dwarf.h - what a module's DWARF says of an address of its code (dwarf.c), read at a
 * denial: whether the compiler inlined code there, the calls it inlined and the file and line
 * of each, for the line's `function (file:line)` as the reports write it. */
#ifndef CUDATRACE_DWARF_H
#define CUDATRACE_DWARF_H

#include <stdint.h>

/* the ELF file at path (GNU build-id bid[0..blen), for its separate debug file), vaddr an
 * address of its code (link-time): 1 when an inlined subroutine covers it, 0 when none does or
 * the module has no DWARF, -1 when it cannot be told here (compressed or split DWARF, a debug
 * file elsewhere than /usr/lib/debug/.build-id, a form or version not read, too large) */
int ct_dwarf_inlined_at(const char *path, const uint8_t *bid, uint32_t blen, uint64_t vaddr);

#define CT_DWARF_NAME 1024
#define CT_DWARF_FILE 96
/* one frame of the code at an address */
struct ct_dwarf_frame {
    /* an inlined function's name as its DWARF gives it: a linkage name (mangled), else its
     * name after its namespaces and classes; "" for the concrete function (its symbol names
     * it) and where the name cannot be read */
    char name[CT_DWARF_NAME];
    char file[CT_DWARF_FILE]; /* the source file's base name; "" when unknown */
    uint32_t line;            /* 0 when unknown */
};
/* the frames of the code at vaddr, innermost first: each call the compiler inlined there,
 * then the function it lies in (the last); at most max (past it, the outermost inlined calls
 * are left out). How many: 0 when no DWARF covers vaddr, -1 when it cannot be told (as
 * ct_dwarf_inlined_at). Each inlined call is at the location of the code it called, the
 * function at the line its outermost inlined call was made from, as the reports name them. */
int ct_dwarf_frames(const char *path, const uint8_t *bid, uint32_t blen, uint64_t vaddr,
                    struct ct_dwarf_frame *out, int max);

#endif
