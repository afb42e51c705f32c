/* pylayouts.h - where CPython keeps what the shim reads to name a thread's Python frames.
 *
 * One table per supported CPython minor version, taken from that version's own headers
 * (Include/internal/pycore_runtime.h, pycore_interp.h, pycore_frame.h, cpython/pystate.h,
 * cpython/code.h, cpython/unicodeobject.h) for a default (GIL, non-debug, 64-bit) build.
 * tests/progs/pylayout_check.c compiles each table against the installed headers of its
 * version and fails on any difference (tests/integration/test_pyframes.py runs it for every CPython here).
 * 3.13 publishes most of these in _Py_DebugOffsets at the start of _PyRuntime: the shim takes
 * them from there and checks them against this table's, which also holds the two 3.13 needs
 * that the debug offsets lack (the gilstate key, _co_firsttraceable).
 * At run time the shim checks the layout again against the live interpreter (the code type's
 * tp_basicsize is the offset of co_code_adaptive, str's is sizeof(PyUnicodeObject), ...) and
 * refuses, with a note in the trace, when anything disagrees.
 */
#ifndef CUDATRACE_PYLAYOUTS_H
#define CUDATRACE_PYLAYOUTS_H
#include <stdint.h>

#define CT_PY_NONE 0xffffffffu /* field absent in this version */

struct ct_pylayout {
    uint32_t minor; /* 11, 12, 13 */
    /* _PyRuntimeState */
    uint32_t rt_finalizing; /* PyThreadState * of the finalizing thread, or NULL */
    uint32_t rt_interp_head;
    uint32_t rt_interp_main;
    uint32_t rt_tss; /* Py_tss_t autoTSSkey (gilstate): {int init; pthread_key_t} */
    /* PyThreadState */
    uint32_t ts_interp;
    uint32_t ts_thread_id;     /* pthread_self() of its thread */
    uint32_t ts_cframe;        /* 3.11, 3.12: _PyCFrame *cframe */
    uint32_t cf_current_frame; /* 3.11, 3.12: in _PyCFrame */
    uint32_t ts_current_frame; /* 3.13 */
    /* _PyInterpreterFrame */
    uint32_t fr_code; /* f_code (3.11, 3.12), f_executable (3.13) */
    uint32_t fr_previous;
    uint32_t fr_instr;    /* prev_instr (3.11, 3.12), instr_ptr (3.13) */
    uint32_t fr_owner;    /* char */
    uint32_t fr_is_entry; /* 3.11: bool; 3.12+: entry frames are owned by the C stack */
    /* PyCodeObject */
    uint32_t co_filename;
    uint32_t co_qualname;
    uint32_t co_firstlineno; /* int */
    uint32_t co_linetable;
    uint32_t co_firsttraceable; /* int */
    uint32_t co_code_adaptive;  /* == PyCode_Type.tp_basicsize */
    /* str (compact forms only: what code objects hold) */
    uint32_t u_length;
    uint32_t u_state;
    uint32_t u_ascii_size;   /* sizeof(PyASCIIObject): compact ASCII data follows */
    uint32_t u_compact_size; /* sizeof(PyCompactUnicodeObject) */
    uint32_t u_basicsize;    /* sizeof(PyUnicodeObject) == PyUnicode_Type.tp_basicsize */
};

/* _PyInterpreterFrame.owner */
#define CT_PY_OWNED_BY_THREAD 0
#define CT_PY_OWNED_BY_GENERATOR 1
#define CT_PY_OWNED_BY_FRAME_OBJECT 2
#define CT_PY_OWNED_BY_CSTACK 3 /* 3.12+: the entry frame of an eval-loop call */

/* fields common to every supported version: PyObject / PyVarObject / PyTypeObject / bytes */
#define CT_PY_OB_TYPE 8
#define CT_PY_OB_SIZE 16
#define CT_PY_TP_BASICSIZE 32
#define CT_PY_BYTES_SVAL 32

static const struct ct_pylayout ct_pylayout_311 = {
    .minor = 11,
    .rt_finalizing = 24,
    .rt_interp_head = 40,
    .rt_interp_main = 48,
    .rt_tss = 592,
    .ts_interp = 16,
    .ts_thread_id = 152,
    .ts_cframe = 56,
    .cf_current_frame = 8,
    .ts_current_frame = CT_PY_NONE,
    .fr_code = 32,
    .fr_previous = 48,
    .fr_instr = 56,
    .fr_owner = 69,
    .fr_is_entry = 68,
    .co_filename = 112,
    .co_qualname = 128,
    .co_firstlineno = 72,
    .co_linetable = 136,
    .co_firsttraceable = 168,
    .co_code_adaptive = 184,
    .u_length = 16,
    .u_state = 32,
    .u_ascii_size = 48,
    .u_compact_size = 72,
    .u_basicsize = 80,
};

static const struct ct_pylayout ct_pylayout_312 = {
    .minor = 12,
    .rt_finalizing = 24,
    .rt_interp_head = 40,
    .rt_interp_main = 48,
    .rt_tss = 1544,
    .ts_interp = 16,
    .ts_thread_id = 136,
    .ts_cframe = 56,
    .cf_current_frame = 0,
    .ts_current_frame = CT_PY_NONE,
    .fr_code = 0,
    .fr_previous = 8,
    .fr_instr = 56,
    .fr_owner = 70,
    .fr_is_entry = CT_PY_NONE,
    .co_filename = 112,
    .co_qualname = 128,
    .co_firstlineno = 68,
    .co_linetable = 136,
    .co_firsttraceable = 176,
    .co_code_adaptive = 192,
    .u_length = 16,
    .u_state = 32,
    .u_ascii_size = 40,
    .u_compact_size = 56,
    .u_basicsize = 64,
};

static const struct ct_pylayout ct_pylayout_313 = {
    .minor = 13,
    .rt_finalizing = 608,
    .rt_interp_head = 632,
    .rt_interp_main = 640,
    .rt_tss = 2160,
    .ts_interp = 16,
    .ts_thread_id = 152,
    .ts_cframe = CT_PY_NONE,
    .cf_current_frame = CT_PY_NONE,
    .ts_current_frame = 72,
    .fr_code = 0,
    .fr_previous = 8,
    .fr_instr = 56,
    .fr_owner = 70,
    .fr_is_entry = CT_PY_NONE,
    .co_filename = 112,
    .co_qualname = 128,
    .co_firstlineno = 68,
    .co_linetable = 136,
    .co_firsttraceable = 184,
    .co_code_adaptive = 200,
    .u_length = 16,
    .u_state = 32,
    .u_ascii_size = 40,
    .u_compact_size = 56,
    .u_basicsize = 64,
};

/* The start of CPython 3.13's _Py_DebugOffsets (Include/internal/pycore_runtime.h of 3.13),
 * as far as the shim reads it. Later versions change this struct: they are refused. */
struct ct_py_debug_offsets_313 {
    char cookie[8];   /* "xdebugpy" */
    uint64_t version; /* PY_VERSION_HEX */
    uint64_t free_threaded;
    struct {
        uint64_t size, finalizing, interpreters_head;
    } runtime_state;
    struct {
        uint64_t size, id, next, threads_head, gc, imports_modules, sysdict, builtins, ceval_gil,
            gil_runtime_state, gil_runtime_state_enabled, gil_runtime_state_locked,
            gil_runtime_state_holder;
    } interpreter_state;
    struct {
        uint64_t size, prev, next, interp, current_frame, thread_id, native_thread_id,
            datastack_chunk, status;
    } thread_state;
    struct {
        uint64_t size, previous, executable, instr_ptr, localsplus, owner;
    } interpreter_frame;
    struct {
        uint64_t size, filename, name, qualname, linetable, firstlineno, argcount, localsplusnames,
            localspluskinds, co_code_adaptive;
    } code_object;
    struct {
        uint64_t size, ob_type;
    } pyobject;
    struct {
        uint64_t size, tp_name, tp_repr, tp_flags;
    } type_object;
    struct {
        uint64_t size, ob_item, ob_size;
    } tuple_object;
    struct {
        uint64_t size, ob_item, ob_size;
    } list_object;
    struct {
        uint64_t size, ma_keys, ma_values;
    } dict_object;
    struct {
        uint64_t size, ob_fval;
    } float_object;
    struct {
        uint64_t size, lv_tag, ob_digit;
    } long_object;
    struct {
        uint64_t size, ob_size, ob_sval;
    } bytes_object;
    struct {
        uint64_t size, state, length, asciiobject_size;
    } unicode_object;
};

#endif
