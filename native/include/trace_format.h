/* trace_format.h - the cudatrace trace file format (version 1).
 *
 * This header is the single definition of the on-disk layout. The shim compiles it; the Python
 * reader (cudatrace/native.py) feeds the part between the CFFI markers to cffi.cdef(), so the
 * two sides cannot drift. Keep that part to plain structs of fixed-width integers and integer
 * #defines (no expressions), which is what cffi accepts.
 *
 * File layout (one file per process image, little-endian, native to the traced machine):
 *
 *   struct ct_file_header                    at offset 0, CT_HEADER_SIZE bytes
 *   records...                               each 8-byte aligned, starting at CT_HEADER_SIZE
 *
 * The file is written through a shared memory mapping that grows in chunks of CT_CHUNK_SIZE
 * bytes; a record never crosses a chunk boundary (the rest of a chunk is filled by a PAD record,
 * or left zero when fewer than 8 bytes remain). Every record starts with struct ct_rec_hdr:
 *
 *   magic (u16 = CT_REC_MAGIC) | type (u16) | size (u32, whole record, multiple of 8)
 *
 * A writer reserves space, writes the body, then publishes the 8-byte header with one release
 * store. A process killed at any moment therefore leaves every completed record readable; a
 * record that was reserved but not published reads as zeros. Readers stop at zeros unless a
 * valid header follows further on (another thread's later record), in which case they skip the
 * hole and report it. A clean exit appends CT_REC_END; a file without it is reported as
 * truncated (killed, crashed, or still running). The tail after the last record is zeros.
 *
 * Record bodies (after the 8-byte header):
 *   PROCESS  struct ct_rec_process, then NUL-separated strings: exe, host, cwd, argv[0..argc-1]
 *   API      struct ct_rec_api, then the API's name (NUL-terminated). The trace names its own
 *            API ids, so readers keep no copy of the hook list.
 *   MODULE   struct ct_rec_module, then build-id bytes (build_id_len), then path (NUL-terminated)
 *   STACK    struct ct_rec_stack: one node of the call-stack tree (node id, parent id, return
 *            address). A stack is the path from a node to the root (id 0); each distinct stack
 *            is stored once (as heaptrack's trace tree does). Node ids are dense, from 1.
 *   EVENT    struct ct_event: one hooked call (alloc, free, map, meminfo, denial, ...)
 *   INFO     struct ct_rec_info then "key\0value\0" (driver version, budget, options ...)
 *   PAD      nothing: skip size bytes
 *   END      struct ct_rec_end: clean exit
 *
 * Times are CLOCK_MONOTONIC nanoseconds (comparable across processes of one boot); the header
 * also holds CLOCK_REALTIME at start to convert them to wall time.
 */
#ifndef CUDATRACE_TRACE_FORMAT_H
#define CUDATRACE_TRACE_FORMAT_H
#include <stdint.h>

/* CFFI-BEGIN */
#define CT_FORMAT_VERSION 1
#define CT_HEADER_SIZE 256
#define CT_CHUNK_SIZE 2097152
#define CT_REC_MAGIC 51107

/* record types */
#define CT_REC_PAD 1
#define CT_REC_PROCESS 2
#define CT_REC_API 3
#define CT_REC_MODULE 4
#define CT_REC_STACK 5
#define CT_REC_EVENT 6
#define CT_REC_INFO 7
#define CT_REC_END 8

/* event operations (ct_event.op) */
#define CT_OP_ALLOC 1
#define CT_OP_FREE 2
#define CT_OP_MAP 3
#define CT_OP_UNMAP 4
#define CT_OP_IMPORT 5
#define CT_OP_UNIMPORT 6
#define CT_OP_MEMINFO 7
#define CT_OP_DENY 8
#define CT_OP_NONE 9

/* memory kinds (what an allocation is) */
#define CT_KIND_NONE 0
#define CT_KIND_DEVICE 1
#define CT_KIND_PITCH 2
#define CT_KIND_MANAGED 3
#define CT_KIND_ASYNC 4
#define CT_KIND_HOST 5
#define CT_KIND_VMM 6
#define CT_KIND_ARRAY 7
#define CT_KIND_GRAPH 8
#define CT_KIND_IMPORT 9

/* address spaces: a free matches the live allocation of the same space and address */
#define CT_SPACE_NONE 0
#define CT_SPACE_DEVPTR 1
#define CT_SPACE_HOSTPTR 2
#define CT_SPACE_ARRAY 3
#define CT_SPACE_MIPMAP 4
#define CT_SPACE_VMM 5
#define CT_SPACE_EXTMEM 6

/* ct_event.flags */
#define CT_EF_RUNTIME_KNOWN 1
#define CT_EF_SIZE_ESTIMATED 2
#define CT_EF_VIRTUALIZED 4
#define CT_EF_BUDGET_WARN 8
#define CT_EF_PTSZ 16

/* ct_rec_api.layer */
#define CT_LAYER_DRIVER 1
#define CT_LAYER_RUNTIME 2
#define CT_LAYER_NVML 3

struct ct_file_header {
    char magic[8];         /* "CUDATRC\0" */
    uint32_t version;      /* CT_FORMAT_VERSION */
    uint32_t header_size;  /* CT_HEADER_SIZE */
    uint32_t chunk_size;   /* CT_CHUNK_SIZE */
    uint32_t pointer_size; /* 8 */
    int32_t pid;
    int32_t ppid;
    uint32_t exec_index;  /* n in <pid>.<n>.ctrace: images exec'd by this pid before */
    uint32_t stack_depth; /* frames kept per event (0: stacks off) */
    uint64_t start_monotonic_ns;
    uint64_t start_realtime_ns;
    uint64_t process_start_ticks; /* /proc/self/stat field 22: with pid, names a process */
    char arch[16];                /* "x86_64", "aarch64" */
    char shim_version[16];
    /* A full disk: when the file cannot grow the shim stops writing at once (the process runs
     * on untraced) and notes it here, in the header's own block, which is always allocated. */
    uint64_t stopped_ns;   /* 0, or CLOCK_MONOTONIC when writing stopped: later events are lost */
    int32_t stopped_errno; /* why (ENOSPC, EDQUOT, ...) */
    int32_t stopped_exit;  /* exit status if the process exited cleanly after stopping, else -1 */
    uint8_t reserved[136];
};

struct ct_rec_hdr {
    uint16_t magic;
    uint16_t type;
    uint32_t size;
};

struct ct_rec_process {
    int32_t pid;
    int32_t ppid;
    uint32_t nstrings; /* exe, host, cwd, then argc strings */
    uint32_t argc;
};

struct ct_rec_api {
    uint16_t id;
    uint8_t layer;     /* CT_LAYER_* */
    uint8_t op;        /* CT_OP_* */
    uint8_t kind;      /* CT_KIND_* */
    uint8_t space;     /* CT_SPACE_* */
    uint16_t name_len; /* bytes of name, without the NUL */
};

struct ct_rec_module {
    uint64_t ts_ns;
    uint64_t base;  /* load bias: runtime address = file vaddr + base */
    uint64_t start; /* lowest mapped address of its PT_LOAD segments */
    uint64_t end;   /* one past the highest */
    uint32_t build_id_len;
    uint32_t path_len; /* without the NUL */
};

struct ct_rec_stack {
    uint32_t id;
    uint32_t parent;
    uint64_t ip; /* return address */
};

struct ct_event {
    uint64_t ts_ns;
    uint64_t size; /* bytes (alloc, free when known, map); total for MEMINFO */
    uint64_t addr; /* pointer or handle; free bytes for MEMINFO */
    uint64_t aux;  /* stream, pool or mapped handle; real free for MEMINFO */
    uint64_t aux2; /* API flags; real total for MEMINFO; in-use for DENY */
    uint32_t tid;
    int32_t device;  /* -1: unknown */
    int32_t result;  /* CUresult returned to the caller */
    uint32_t stack;  /* leaf stack node id, 0: none */
    uint16_t api;    /* driver API id (ct_rec_api) */
    uint16_t rt_api; /* runtime API in progress on this thread, 0: none */
    uint8_t op;      /* CT_OP_* */
    uint8_t kind;    /* CT_KIND_* */
    uint8_t space;   /* CT_SPACE_* */
    uint8_t flags;   /* CT_EF_* */
    uint32_t reserved;
};

struct ct_rec_info {
    uint16_t key_len;
    uint16_t value_len;
    uint32_t reserved;
};

struct ct_rec_end {
    uint64_t ts_ns;
    int32_t exit_code; /* -1 when unknown */
    uint32_t dropped;  /* events lost (trace could not grow) */
    uint64_t nodes;
    uint64_t events;
};
/* CFFI-END */

#endif
