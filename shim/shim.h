/* shim.h - internals shared by the files of the preload library. */
#ifndef CUDATRACE_SHIM_H
#define CUDATRACE_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <pthread.h>
#include "cuda_abi.h"
#include "layout.h"

#define CT_EXPORT __attribute__((visibility("default")))
#define CT_TLS __thread __attribute__((tls_model("initial-exec")))
#define CT_SHIM_VERSION "0.1.0"
#define CT_MAX_DEPTH 256

/* ---- process-wide settings, read once from the environment at load -------------------- */
struct ct_config {
    int active;              /* 1: CUDATRACE_DIR set and usable; 0: pure pass-through */
    int eager;               /* create the trace file at load (the root process of a run) */
    int stack_depth;
    int on_exceed;           /* CT_EXCEED_* */
    int count_host;          /* 1 forced, 0 auto (integrated devices), -1 never */
    int virtualize;
    int launcher_pid;
    char dir[1024];
    char ledger_path[1024];
};
#define CT_EXCEED_FAIL 0
#define CT_EXCEED_WARN 1
#define CT_EXCEED_ABORT 2
extern struct ct_config ct_cfg;

uint64_t ct_now_ns(void);
uint32_t ct_gettid(void);

/* ---- writer.c: the trace file, an mmap'd append-only sink ------------------------------ */
typedef struct {
    uint8_t *p;              /* record start (header) */
    uint32_t size;
    uint32_t chunk;
} ct_slot;
/* Reserve size bytes (a multiple of 8, header included). 0: no trace (disabled or full). */
int ct_rec_begin(ct_slot *s, uint32_t size);
/* Publish the header: the record becomes visible to readers in one store. */
void ct_rec_commit(ct_slot *s, uint16_t type);
/* Write a whole record whose body is given in up to three parts. */
int ct_rec_write(uint16_t type, const void *a, size_t na, const void *b, size_t nb,
                 const void *c, size_t nc);
void ct_writer_close(int exit_code);
void ct_writer_atfork_prepare(void);
void ct_writer_atfork_parent(void);
void ct_writer_atfork_child(void);
void ct_writer_open_now(void);
extern uint64_t ct_events_written;
/* hook: called (under the writer lock) right after a new file is opened, to write its
 * opening records (process, API table, info). Defined in shim.c. */
void ct_write_preamble(void);

/* ---- stacks.c: the call-stack tree ---------------------------------------------------- */
void ct_stacks_init(void);
/* wrapper_cfa: __builtin_dwarf_cfa() of the wrapper (0 if unknown) */
uint32_t ct_stack_capture(uintptr_t wrapper_cfa);
#if defined(__GNUC__) && !defined(__clang__)
#define CT_CFA() ((uintptr_t)__builtin_dwarf_cfa())
#else
#define CT_CFA() ((uintptr_t)0)
#endif
void ct_stacks_atfork_prepare(void);
void ct_stacks_atfork_parent(void);
void ct_stacks_reset(void);          /* new file: forget every node (child after fork) */
/* first frame outside the shim and the CUDA libraries, for messages */
uintptr_t ct_stack_first_user_frame(void);   /* of this thread's last captured stack */

/* ---- modules.c: the module map --------------------------------------------------------- */
void ct_modules_init(void);
int ct_modules_covers(uintptr_t ip);   /* 1 if ip lies in a module already written */
void ct_modules_scan(void);            /* write records for modules not yet written */
void ct_modules_reset(void);
int ct_in_shim(uintptr_t ip);
/* best-effort symbol for messages: name of the function containing ip, from the module's
 * .symtab or .dynsym (read from its file); module basename and offset always. */
void ct_describe_address(uintptr_t ip, char *out, size_t outlen);
uintptr_t ct_pick_caller(const uintptr_t *ips, int n);

/* ---- pyframes.c: the Python stack of the calling thread ------------------------------ */
/* The link node's ip for this event (layout.h CT_PYLINK_*), 0 when the process has no Python */
uint64_t ct_py_capture(void);
void ct_py_modules_changed(void);     /* new modules mapped: look for the interpreter again */
void ct_py_atfork_prepare(void);
void ct_py_atfork_parent(void);
void ct_py_reset(void);               /* child after fork */

/* ---- small helpers: no stdio inside the target -------------------------------------- */
size_t ct_strlcpy(char *dst, const char *src, size_t n);
void ct_fmt_u64(char *out, uint64_t v);
void ct_fmt_hex(char *out, uint64_t v);
void ct_fmt_bytes(char *out, uint64_t v);
void ct_log(const char *a, const char *b, const char *c, const char *d);

#endif
