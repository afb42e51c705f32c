/* dwarf.h - whether the compiler inlined code at an address of a module (dwarf.c): read from
 * its DWARF at a denial, for the line's "or a function inlined into it". */
#ifndef CUDATRACE_DWARF_H
#define CUDATRACE_DWARF_H

#include <stdint.h>

/* the ELF file at path (GNU build-id bid[0..blen), for its separate debug file), vaddr an
 * address of its code (link-time): 1 when an inlined subroutine covers it, 0 when none does or
 * the module has no DWARF, -1 when it cannot be told here (compressed or split DWARF, a debug
 * file elsewhere than /usr/lib/debug/.build-id, a form or version not read, too large) */
int ct_dwarf_inlined_at(const char *path, const uint8_t *bid, uint32_t blen, uint64_t vaddr);

#endif
