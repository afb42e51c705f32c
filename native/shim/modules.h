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
 * symbol) and how much of it names the function a lambda or local class is in (encl, 0: none),
 * its module's basename, the offset of ip in it, whether that is the program itself, the
 * module's GNU build-id */
struct ct_frame_desc {
    char name[200];
    size_t encl;
    const char *module; /* "" when unknown */
    uintptr_t offset;   /* ip - the module's load bias */
    int exe;
    const uint8_t *build_id;
    uint32_t build_id_len;
};
/* 0 when ip lies in no known module, 2 for a CUDA library's frame (or the static runtime's):
 * one symbol lookup */
int ct_frame_info(uintptr_t ip, struct ct_frame_desc *d);
/* a mangled C++ name demangled into out: the shim's own demangler (demangle.c), else the C++
 * runtime's __cxa_demangle where one is loaded; 0 when neither reads it */
int ct_demangle_any(const char *mangled, char *out, size_t cap);
/* a demangled name shortened as reports show it (names.py); returns the length of the prefix
 * naming the function a lambda, block or local class is in (0: none) */
size_t ct_shorten_name(const char *in, char *out, size_t cap);
/* the file of the module holding ip, as the loader names it; NULL when unknown */
const char *ct_module_path(uintptr_t ip);
/* a symbol of a loaded object whose file name starts with prefix (loaded RTLD_LOCAL, so
 * RTLD_DEFAULT misses it); NULL when none is loaded */
void *ct_sym_in_loaded(const char *prefix, const char *name);
uintptr_t ct_pick_caller(const uintptr_t *ips, int n);
/* the function holding each return address ips[i], as one identity: its module and its short
 * name (ct_shorten_name), so a template's instantiations and a function's overloads are one
 * function, as the reports' call graph reads them (cudatrace/analyze/sites/stacks.py identity); one
 * pass over each module's symbol table (cold path: a denial's call graph); 0 where unknown, 1
 * for a CUDA library's frame or the static runtime's */
void ct_function_idents(const uint64_t *ips, size_t n, uint64_t *idents);

#endif
