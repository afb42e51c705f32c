/* modules.h - the module map (modules.c): MODULE records for offline symbolization. */
#ifndef CUDATRACE_MODULES_H
#define CUDATRACE_MODULES_H

#include <stddef.h>
#include <stdint.h>

void ct_modules_init(void);
int ct_modules_covers(uintptr_t ip); /* 1 if ip lies in a module already written */
void ct_modules_scan(void);          /* write records for modules not yet written */
void ct_modules_reset(void);
/* fn runs (outside the map's lock) after a scan found new modules: the module map sits below
 * the Python-frames reader, which registers through shim.c rather than being called by name */
void ct_modules_on_grow(void (*fn)(void));
int ct_in_shim(uintptr_t ip);
/* best-effort symbol for messages: name of the function containing ip, from the module's
 * .symtab or .dynsym (read from its file); module basename and offset always. */
void ct_describe_address(uintptr_t ip, char *out, size_t outlen);
/* the function's name alone, shortened (no arguments, no template arguments), demangled;
 * module+offset when unknown */
void ct_describe_function(uintptr_t ip, char *out, size_t outlen);
int ct_is_cuda_frame(uintptr_t ip); /* a CUDA library's frame, or the static runtime's */
/* what the denial's rule reads of a frame (deny.c): its function's short name ("" without a
 * symbol), its module's basename (*module), whether that is the program itself (*exe);
 * 0 when ip lies in no known module, 2 for a CUDA library's frame (or the static runtime's):
 * one symbol lookup */
int ct_frame_info(uintptr_t ip, char *name, size_t cap, const char **module, int *exe);
/* a symbol of a loaded object whose file name starts with prefix (loaded RTLD_LOCAL, so
 * RTLD_DEFAULT misses it); NULL when none is loaded */
void *ct_sym_in_loaded(const char *prefix, const char *name);
uintptr_t ct_pick_caller(const uintptr_t *ips, int n);

#endif
