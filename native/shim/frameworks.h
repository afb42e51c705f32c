/* frameworks.h - what the denial's rule knows beyond one stack (frameworks.c): the frameworks
 * in force (native/include/frameworks.def, a user's CUDATRACE_FRAMEWORKS file) and the hints
 * the launcher computed before exec (CUDATRACE_HINTS: libraries the binaries join to a
 * framework, the inline frames of the program's code). Cold path: loaded at the first denial. */
#ifndef CUDATRACE_FRAMEWORKS_H
#define CUDATRACE_FRAMEWORKS_H

#include <stddef.h>
#include <stdint.h>

#define CT_INLINE_NAME 200

/* the frameworks a frame belongs to, one bit each (0: none): by its library's file name (the
 * table's prefixes, or a library the hints join), else by the first qualifier of its rule
 * name (rule: the name, or the function a lambda is in: len bytes of it); never a name the
 * framework keeps. exe: the module is the program's own executable, no framework's library
 * whatever its file is named (a program called libtorch_kv): its frames go by name only */
unsigned ct_fw_of(const char *module, int exe, const char *rule, size_t len);

/* the frames inlined at offset off of module (basename, build-id), innermost first: their
 * short names (and the length of their enclosing-function prefix) into names[]/encl[], at most
 * max; returns how many, or -1 when the hints do not cover the module */
int ct_fw_inlines(const char *module, const uint8_t *bid, uint32_t blen, uintptr_t off,
                  char (*names)[CT_INLINE_NAME], size_t *encl, int max);

#endif
