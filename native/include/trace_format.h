/* trace_format.h - the cudatrace trace file format (version 4).
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
 *   CEVENT   the same event, compact: varint differences from the thread's previous event
 *            (cevent.h holds the encoding, for the shim and the reader). Version 2 writes
 *            every event so; version 1 files hold EVENT records only, and are still read.
 *   CEBLOCK  struct ct_rec_ceblock, then compact events of ONE thread back to back, without
 *            the thread number and seq each CEVENT carries (version 3 writes every event so):
 *            a thread fills its own block, and publishes each event by one release store of
 *            `used`; the header is published when the block is taken, the rest reads as zeros.
 *            In version 4 the launcher's sealer writes them in place of RAWBLOCKs.
 *   RAWBLOCK struct ct_rec_rawblock, then ONE thread's raw events back to back: fixed-size
 *            records (rawevent.h), published as CEBLOCK's are. Version 4 writes every event so.
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
#define CT_FORMAT_VERSION 4
/* the oldest version readers still accept */
#define CT_FORMAT_VERSION_MIN 1
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
#define CT_REC_PYCODE 9
#define CT_REC_PYFRAME 10

/* Python frames (docs/python-frames.md). An event of a process running CPython ends its native
 * stack with one link node whose ip is CT_PYLINK_TAG | kind << 32 | value: kind FRAMES, value
 * = the leaf of the Python stack tree (PYFRAME records); kind WHY, value = CT_PYWHY_*, why the
 * event has no Python frames. Processes without Python have no link node. */
#define CT_PYLINK_TAG 0x7079000000000000
#define CT_PYLINK_MASK 0xffff000000000000
#define CT_PYLINK_FRAMES 1
#define CT_PYLINK_WHY 2
#define CT_PYWHY_NO_TSTATE 1
#define CT_PYWHY_FINALIZING 2
#define CT_PYWHY_UNSUPPORTED 3
#define CT_PYWHY_NOT_INITIALIZED 4
#define CT_PYWHY_IDLE 5
#define CT_PYWHY_INCONSISTENT 6
/* ct_rec_pyframe.flags */
#define CT_PYF_ENTRY 1
#define CT_PYF_NO_OFFSET 2
/* one event, compact (native/include/cevent.h); version 2 */
#define CT_REC_CEVENT 16
/* --aggregate: a place for snapshots, rewritten in place (struct ct_snap_head) */
#define CT_REC_SNAPSLOT 17
/* a block of one thread's compact events (struct ct_rec_ceblock, then the events); version 3 */
#define CT_REC_CEBLOCK 18
/* a block of one thread's raw events (struct ct_rec_rawblock, then the records); version 4 */
#define CT_REC_RAWBLOCK 19
/* ct_rec_rawblock.flags: the thread's context starts anew here (its first block in the file,
 * or in a chunk) */
#define CT_RAWB_START 1
/* ct_event.reserved (version 4): the event's stack came from the unwinder's cache (the trace
 * counts these instead of a header counter written at each event) */
#define CT_EV_STACK_CACHED 1

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
/* hooks.def only, never an event: a call that makes or names a memory pool (the shim notes
 * where the pool's allocations live) */
#define CT_OP_POOL 10
/* hooks.def only, never an event: a call that may end a context, whose handle the driver may
 * then give to a new context of another device (the shim forgets what it knew of contexts) */
#define CT_OP_CTX_END 11
/* hooks.def only, never an event: cuInit, refused when fencing was asked for and cannot be set
 * up (budget.c, CUDATRACE_ON_FENCE_ERROR=refuse) */
#define CT_OP_INIT 12
/* hooks.def only, never an event: a call that ends a pool (the shim forgets where its
 * allocations live before the call: the driver may give the handle to the next pool made) */
#define CT_OP_POOL_END 13

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
    /* updated in place while the process runs (crash-safe): how each event's stack was taken */
    uint64_t stack_unwinds_full; /* a full unwind (libgcc), or a walk that had to learn rules */
    uint64_t stack_cache_hits;   /* the cached CFI rules alone (unwind.c); version 4: only
                                    --aggregate's (a written event says it: CT_EV_STACK_CACHED) */
    uint64_t stack_verified;     /* CUDATRACE_STACK_VERIFY=1: cached walks checked against libgcc */
    uint64_t stack_mismatches;   /* ... that differed from it (never, or the cache is wrong) */
    /* A full disk: when the file cannot grow the shim stops writing at once (the process runs
     * on untraced) and notes it here, in the header's own block, which is always allocated. */
    uint64_t stopped_ns;   /* 0, or CLOCK_MONOTONIC when writing stopped: later events are lost */
    int32_t stopped_errno; /* why (ENOSPC, EDQUOT, ...) */
    int32_t stopped_exit;  /* exit status if the process exited cleanly after stopping, else -1 */
    /* chunks below this one are sealed: unmapped by the writer, never written again (the
     * launcher may compress them: docs/format.md, "Sealed chunks"); updated in place */
    uint32_t sealed_chunks;
    uint32_t flags; /* CT_FH_* */
    uint8_t reserved[96];
};
/* ct_file_header.flags. CT_FH_LIVE_LOCK: the writer holds an OFD read lock on byte 0 of the
 * file while it lives, so a reader tells a live writer by F_OFD_GETLK, in any pid namespace (a
 * killed process's lock is gone with it). */
#define CT_FH_LIVE_LOCK 1
#define CT_SC_FULL 0
#define CT_SC_HIT 1
#define CT_SC_VERIFIED 2
#define CT_SC_MISMATCH 3

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

struct ct_rec_ceblock {
    uint32_t used;   /* bytes of events after this struct: each event is published by a release
                        store of the new value (a reader decodes up to it) */
    uint32_t thread; /* the writer's number for the thread (as in CEVENT) */
    uint32_t seq;    /* the thread's events before this block (its context's seq, modulo 256,
                        must equal it modulo 256, or an earlier block is missing) */
    uint32_t cached; /* version 4 (a sealed RAWBLOCK): its events whose reserved says
                        CT_EV_STACK_CACHED; 0 in version 3 */
};

struct ct_rec_rawblock {
    uint32_t used;   /* bytes of records after this struct, published as CEBLOCK's */
    uint32_t thread; /* the writer's number for the thread (as in CEBLOCK) */
    uint32_t seq;    /* the thread's events since its context started (its last START) */
    uint32_t flags;  /* CT_RAWB_* */
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
    int32_t device;    /* -1: unknown */
    int32_t result;    /* CUresult returned to the caller */
    uint32_t stack;    /* leaf stack node id, 0: none */
    uint16_t api;      /* driver API id (ct_rec_api) */
    uint16_t rt_api;   /* runtime API in progress on this thread, 0: none */
    uint8_t op;        /* CT_OP_* */
    uint8_t kind;      /* CT_KIND_* */
    uint8_t space;     /* CT_SPACE_* */
    uint8_t flags;     /* CT_EF_* */
    uint32_t reserved; /* version 4: CT_EV_STACK_CACHED; 0 before */
};

/* One code object, written once per process the first time a frame runs it; followed by the
 * file name (NUL-terminated), the qualified name (NUL-terminated) and co_linetable's bytes. */
struct ct_rec_pycode {
    uint64_t address;    /* the code object (a new record if it is freed and reused) */
    uint64_t code_start; /* its first instruction (co_code_adaptive) */
    uint32_t id;         /* dense from 1 */
    int32_t firstlineno;
    uint32_t code_units;    /* instructions and caches, 2 bytes each */
    uint32_t linetable_len; /* 0: not recorded (too large or unreadable) */
    uint16_t filename_len;  /* bytes, without the NUL */
    uint16_t qualname_len;
    uint32_t reserved;
};

/* One node of the Python stack tree: (parent, code, instruction index), stored once. */
struct ct_rec_pyframe {
    uint32_t id; /* dense from 1; 0 is the root */
    uint32_t parent;
    uint32_t code;  /* ct_rec_pycode.id */
    uint32_t lasti; /* index of the instruction running (2-byte units) */
    uint32_t flags; /* CT_PYF_*: ENTRY = first frame an eval-loop call ran */
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
/* ---- --aggregate: snapshots ----
 * An aggregate trace writes no ALLOC/FREE events. The shim keeps, per key (a site: stack, API,
 * runtime API, kind, space, device, and the size), totals and what is live now, at the process's
 * peak and at the peak of the key's group (its device, or pinned host memory), and writes it
 * all as a snapshot into one of two SNAPSLOT records, in turn. The slot's body is a
 * struct ct_snap_head, CT_SNAP_GROUPS struct ct_snap_group and nkeys struct ct_snap_key. The
 * writer zeroes seq (release), writes the rest, then stores seq (release): a reader takes the
 * slot with the highest seq whose checksum holds, so a kill while writing one leaves the other.
 */
/* device -1 (0), devices 0..7 (1..8), pinned host (9) */
#define CT_SNAP_GROUPS 10
#define CT_SNAP_HOST_GROUP 9
/* head.reason: at exit */
#define CT_SNAP_EXIT 1
/* a peak grew by 1% and 1 MiB since the last snapshot */
#define CT_SNAP_PEAK 2
/* something changed and the interval passed */
#define CT_SNAP_TIMER 3
/* key.flags: allocations of several sizes (key table full) */
#define CT_SNAP_KEY_MIXED 1

struct ct_snap_head {
    uint64_t seq;      /* 1, 2, ...; 0: empty or being written */
    uint64_t checksum; /* FNV-1a 64 of the body_bytes after this head */
    uint64_t body_bytes;
    uint64_t ts_ns;  /* when it was taken */
    uint32_t reason; /* CT_SNAP_* */
    uint32_t nkeys;
    uint64_t cur_bytes;  /* device memory live now, all devices of this process */
    uint64_t peak_bytes; /* its highest */
    uint64_t peak_ts;
    uint64_t allocs; /* successful allocations (every kind) */
    uint64_t frees;  /* frees that ended one */
    uint64_t unmatched_frees;
    uint64_t failed;             /* allocations that returned an error (each also an event) */
    uint64_t denied;             /* budget refusals (each also an event) */
    uint64_t meminfo;            /* memory queries */
    uint64_t events_not_written; /* failures, denials, queries over the caps (counted only) */
    uint64_t other;              /* maps, unmaps, imports: counted, not kept */
    uint64_t untracked;          /* allocations not kept: the live table could not grow */
    uint64_t first_ts;           /* first and last event seen */
    uint64_t last_ts;
    uint64_t snapshots; /* written so far, this one included */
};

struct ct_snap_group {
    int32_t device;     /* -1: unknown; for CT_SNAP_HOST_GROUP the device is -1 */
    uint32_t allocs_hi; /* reserved */
    uint64_t cur_bytes;
    uint64_t peak_bytes;
    uint64_t peak_ts;
    uint64_t allocs;
};

struct ct_snap_key {
    uint64_t size; /* bytes of each allocation (flags CT_SNAP_KEY_MIXED: of several) */
    uint32_t stack;
    uint16_t api;
    uint16_t rt_api;
    int32_t device;
    uint8_t kind;
    uint8_t space;
    uint8_t group;   /* index into the groups */
    uint8_t flags;   /* CT_SNAP_KEY_* */
    uint64_t allocs; /* over the run */
    uint64_t alloc_bytes;
    uint64_t frees;
    uint64_t freed_bytes;
    uint64_t cur_count; /* live now */
    uint64_t cur_bytes;
    uint64_t peak_count; /* live at the process's peak (device kinds) */
    uint64_t peak_bytes;
    uint64_t gpeak_count; /* live at its group's peak */
    uint64_t gpeak_bytes;
    uint64_t first_ts; /* first and last allocation */
    uint64_t last_ts;
};
/* CFFI-END */

#endif
