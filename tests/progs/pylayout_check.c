/* pylayout_check.c - holds shim/pylayouts.h to CPython's own headers: compiled against the
 * installed headers of one version (tests/integration/test_pyframes.py), it prints each difference and
 * exits 1 on any. -I <include/python3.X> -I <include/python3.X/internal> -I shim */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#include "pylayouts.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define T ct_pylayout_311
#define TSS gilstate.autoTSSkey
#elif PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
#define T ct_pylayout_312
#define TSS autoTSSkey
#elif PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000
#define T ct_pylayout_313
#define TSS autoTSSkey
#else
#error "no table for this CPython version"
#endif
#include <stdio.h>
static int bad;
static void eq(unsigned long a, unsigned long b, const char *what)
{
    if (a != b) {
        printf("MISMATCH %s: %lu != %lu\n", what, a, b);
        bad = 1;
    }
}
#define EQ(a, b) eq((unsigned long)(a), (unsigned long)(b), #a " == " #b);

int main(void)
{

    EQ(T.minor, (PY_VERSION_HEX >> 16) & 0xff)
    EQ(T.rt_finalizing, offsetof(_PyRuntimeState, _finalizing))
    EQ(T.rt_interp_head, offsetof(_PyRuntimeState, interpreters.head))
    EQ(T.rt_interp_main, offsetof(_PyRuntimeState, interpreters.main))
    EQ(T.rt_tss, offsetof(_PyRuntimeState, TSS))
    EQ(offsetof(Py_tss_t, _is_initialized), 0)
    EQ(offsetof(Py_tss_t, _key), 4)
    EQ(T.ts_interp, offsetof(PyThreadState, interp))
    EQ(T.ts_thread_id, offsetof(PyThreadState, thread_id))
#if PY_VERSION_HEX < 0x030D0000
    EQ(T.ts_cframe, offsetof(PyThreadState, cframe))
    EQ(T.cf_current_frame, offsetof(_PyCFrame, current_frame))
    EQ(T.ts_current_frame, CT_PY_NONE)
    EQ(T.fr_code, offsetof(_PyInterpreterFrame, f_code))
    EQ(T.fr_instr, offsetof(_PyInterpreterFrame, prev_instr))
#else
    EQ(T.ts_cframe, CT_PY_NONE)
    EQ(T.ts_current_frame, offsetof(PyThreadState, current_frame))
    EQ(T.fr_code, offsetof(_PyInterpreterFrame, f_executable))
    EQ(T.fr_instr, offsetof(_PyInterpreterFrame, instr_ptr))
#endif
#if PY_VERSION_HEX < 0x030C0000
    EQ(T.fr_is_entry, offsetof(_PyInterpreterFrame, is_entry))
    EQ(sizeof(((_PyInterpreterFrame *)0)->is_entry), 1)
#else
    EQ(T.fr_is_entry, CT_PY_NONE)
    EQ(CT_PY_OWNED_BY_CSTACK, FRAME_OWNED_BY_CSTACK)
#endif
    EQ(CT_PY_OWNED_BY_THREAD, FRAME_OWNED_BY_THREAD)
    EQ(CT_PY_OWNED_BY_GENERATOR, FRAME_OWNED_BY_GENERATOR)
    EQ(CT_PY_OWNED_BY_FRAME_OBJECT, FRAME_OWNED_BY_FRAME_OBJECT)
    EQ(T.fr_previous, offsetof(_PyInterpreterFrame, previous))
    EQ(T.fr_owner, offsetof(_PyInterpreterFrame, owner))
    EQ(sizeof(((_PyInterpreterFrame *)0)->owner), 1)
    EQ(T.co_filename, offsetof(PyCodeObject, co_filename))
    EQ(T.co_qualname, offsetof(PyCodeObject, co_qualname))
    EQ(T.co_firstlineno, offsetof(PyCodeObject, co_firstlineno))
    EQ(T.co_linetable, offsetof(PyCodeObject, co_linetable))
    EQ(T.co_firsttraceable, offsetof(PyCodeObject, _co_firsttraceable))
    EQ(T.co_code_adaptive, offsetof(PyCodeObject, co_code_adaptive))
    EQ(sizeof(_Py_CODEUNIT), 2)
    EQ(T.u_length, offsetof(PyASCIIObject, length))
    EQ(T.u_state, offsetof(PyASCIIObject, state))
    EQ(T.u_ascii_size, sizeof(PyASCIIObject))
    EQ(T.u_compact_size, sizeof(PyCompactUnicodeObject))
    EQ(T.u_basicsize, sizeof(PyUnicodeObject))
    EQ(CT_PY_OB_TYPE, offsetof(PyObject, ob_type))
    EQ(CT_PY_OB_SIZE, offsetof(PyVarObject, ob_size))
    EQ(CT_PY_TP_BASICSIZE, offsetof(PyTypeObject, tp_basicsize))
    EQ(CT_PY_BYTES_SVAL, offsetof(PyBytesObject, ob_sval))
    EQ(CT_PY_OB_SIZE, offsetof(PyBytesObject, ob_base.ob_size))
    EQ(sizeof(unsigned long), 8)

#if PY_VERSION_HEX >= 0x030D0000
/* the debug offsets: where they sit, and the shim's reading of their struct */
    EQ(offsetof(_PyRuntimeState, debug_offsets), 0)
#define D(f) EQ(offsetof(struct ct_py_debug_offsets_313, f), offsetof(_Py_DebugOffsets, f))
    D(version); D(free_threaded); D(runtime_state.finalizing); D(runtime_state.interpreters_head);
    D(thread_state.interp); D(thread_state.current_frame); D(thread_state.thread_id);
    D(interpreter_frame.previous); D(interpreter_frame.executable);
    D(interpreter_frame.instr_ptr); D(interpreter_frame.owner);
    D(code_object.filename); D(code_object.qualname); D(code_object.linetable);
    D(code_object.firstlineno); D(code_object.co_code_adaptive); D(pyobject.ob_type);
    D(unicode_object.state); D(unicode_object.length); D(unicode_object.asciiobject_size);
    D(bytes_object.ob_size); D(bytes_object.ob_sval);
#endif

    printf("%s CPython %d.%d\n", bad ? "MISMATCH" : "OK", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    return bad;
}
