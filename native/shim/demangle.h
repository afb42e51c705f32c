/* demangle.h - a small Itanium C++ ABI demangler in plain C (demangle.c), for the denial line
 * of programs whose C++ runtime is linked statically (no __cxa_demangle to find). It covers
 * what allocation paths are made of: nested names, anonymous namespaces, constructors and
 * destructors, templates (type and integer arguments), substitutions and template parameters,
 * builtin, qualified, pointer and reference types, operators, lambdas and local names, ABI
 * tags and clone suffixes. Output is c++filt's spelling. No allocation, no lock: usable on any
 * path of the shim. */
#ifndef CUDATRACE_DEMANGLE_H
#define CUDATRACE_DEMANGLE_H

#include <stddef.h>

/* Demangle `mangled` into out (cap bytes, NUL-terminated). 1 on success; 0 when the name is
 * not a mangled C++ name or uses what this demangler does not read (out is then unspecified:
 * print the mangled name). */
int ct_demangle(const char *mangled, char *out, size_t cap);

#endif
