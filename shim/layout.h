/* layout.h - the cudatrace trace file format (version 1) and the budget ledger layout.
 *
 * This header is the single definition of the on-disk layout. The shim compiles it; the Python
 * reader (cudatrace/trace.py) feeds the part between the CFFI markers to cffi.cdef(), so the
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
#ifndef CUDATRACE_LAYOUT_H
#define CUDATRACE_LAYOUT_H
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
#define CT_REC_PYCODE 9
#define CT_REC_PYFRAME 10
#define CT_REC_LAST 10

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
    char magic[8];                 /* "CUDATRC\0" */
    uint32_t version;              /* CT_FORMAT_VERSION */
    uint32_t header_size;          /* CT_HEADER_SIZE */
    uint32_t chunk_size;           /* CT_CHUNK_SIZE */
    uint32_t pointer_size;         /* 8 */
    int32_t pid;
    int32_t ppid;
    uint32_t exec_index;           /* n in <pid>.<n>.ctrace: images exec'd by this pid before */
    uint32_t stack_depth;          /* frames kept per event (0: stacks off) */
    uint64_t start_monotonic_ns;
    uint64_t start_realtime_ns;
    uint64_t process_start_ticks;  /* /proc/self/stat field 22: with pid, names a process */
    char arch[16];                 /* "x86_64", "aarch64" */
    char shim_version[16];
    uint8_t reserved[152];
};

struct ct_rec_hdr {
    uint16_t magic;
    uint16_t type;
    uint32_t size;
};

struct ct_rec_process {
    int32_t pid;
    int32_t ppid;
    uint32_t nstrings;             /* exe, host, cwd, then argc strings */
    uint32_t argc;
};

struct ct_rec_api {
    uint16_t id;
    uint8_t layer;                 /* CT_LAYER_* */
    uint8_t op;                    /* CT_OP_* */
    uint8_t kind;                  /* CT_KIND_* */
    uint8_t space;                 /* CT_SPACE_* */
    uint16_t name_len;             /* bytes of name, without the NUL */
};

struct ct_rec_module {
    uint64_t ts_ns;
    uint64_t base;                 /* load bias: runtime address = file vaddr + base */
    uint64_t start;                /* lowest mapped address of its PT_LOAD segments */
    uint64_t end;                  /* one past the highest */
    uint32_t build_id_len;
    uint32_t path_len;             /* without the NUL */
};

struct ct_rec_stack {
    uint32_t id;
    uint32_t parent;
    uint64_t ip;                   /* return address */
};

struct ct_event {
    uint64_t ts_ns;
    uint64_t size;                 /* bytes (alloc, free when known, map); total for MEMINFO */
    uint64_t addr;                 /* pointer or handle; free bytes for MEMINFO */
    uint64_t aux;                  /* stream, pool or mapped handle; real free for MEMINFO */
    uint64_t aux2;                 /* API flags; real total for MEMINFO; in-use for DENY */
    uint32_t tid;
    int32_t device;                /* -1: unknown */
    int32_t result;                /* CUresult returned to the caller */
    uint32_t stack;                /* leaf stack node id, 0: none */
    uint16_t api;                  /* driver API id (ct_rec_api) */
    uint16_t rt_api;               /* runtime API in progress on this thread, 0: none */
    uint8_t op;                    /* CT_OP_* */
    uint8_t kind;                  /* CT_KIND_* */
    uint8_t space;                 /* CT_SPACE_* */
    uint8_t flags;                 /* CT_EF_* */
    uint32_t reserved;
};

/* One code object, written once per process the first time a frame runs it; followed by the
 * file name (NUL-terminated), the qualified name (NUL-terminated) and co_linetable's bytes. */
struct ct_rec_pycode {
    uint64_t address;              /* the code object (a new record if it is freed and reused) */
    uint64_t code_start;           /* its first instruction (co_code_adaptive) */
    uint32_t id;                   /* dense from 1 */
    int32_t firstlineno;
    uint32_t code_units;           /* instructions and caches, 2 bytes each */
    uint32_t linetable_len;        /* 0: not recorded (too large or unreadable) */
    uint16_t filename_len;         /* bytes, without the NUL */
    uint16_t qualname_len;
    uint32_t reserved;
};

/* One node of the Python stack tree: (parent, code, instruction index), stored once. */
struct ct_rec_pyframe {
    uint32_t id;                   /* dense from 1; 0 is the root */
    uint32_t parent;
    uint32_t code;                 /* ct_rec_pycode.id */
    uint32_t lasti;                /* index of the instruction running (2-byte units) */
    uint32_t flags;                /* CT_PYF_*: ENTRY = first frame an eval-loop call ran */
    uint32_t reserved;
};

struct ct_rec_info {
    uint16_t key_len;
    uint16_t value_len;
    uint32_t reserved;
};

struct ct_rec_end {
    uint64_t ts_ns;
    int32_t exit_code;             /* -1 when unknown */
    uint32_t dropped;              /* events lost (trace could not grow) */
    uint64_t nodes;
    uint64_t events;
};
/* The trace scanner (shim/tools.c), the C half of the Python reader: one pass over a file's
 * records that copies events into an array and notes where every other record starts. */
#define CT_SCAN_CLEAN 0
#define CT_SCAN_TRUNCATED 1
#define CT_SCAN_BAD_HEADER 2
struct ct_scan_result {
    uint64_t n_events;
    uint64_t n_other;
    uint64_t stop_offset;          /* where reading ended */
    uint64_t end_offset;           /* offset of the END record, 0 if none */
    uint32_t status;               /* CT_SCAN_* */
    uint32_t gaps;                 /* unpublished holes skipped */
    uint64_t gap_bytes;
};
/* Pass events=NULL / others=NULL to count only. Returns 0, or -1 on bad arguments. */
int ct_scan(const uint8_t *buf, uint64_t len, struct ct_event *events, uint64_t max_events,
            uint64_t *others, uint64_t max_others, struct ct_scan_result *res);

/* LEDGER-BEGIN (budget ledger: layout and C API, see shim/ledger.c) */
/* A budget ledger is one file of CT_LEDGER_FILE_SIZE bytes, mapped MAP_SHARED by every process
 * of a budget group (the shim in each traced process, and `cudatrace status`):
 *
 *   struct ct_ledger_header                      at offset 0, CT_LEDGER_HEADER_SIZE bytes
 *   struct ct_ledger_member[CT_LEDGER_MAX_MEMBERS]  one slot per live member process
 *
 * There is no lock anywhere. Every field the ledger changes after creation is accessed with
 * sequentially consistent atomics (ledger.c); a member adds to its own held[dev] and then sums
 * held[dev] over all ACTIVE slots, withdrawing if the sum passes the limit, so concurrent
 * reservers in any number of threads and processes can never together exceed it. A member's
 * slot state word packs (pid << 32) | (generation << 8) | state, so a claim publishes its pid
 * and a reclaim cannot hit a slot that was freed and claimed again in the meantime.
 * Everything else (reading, snapshots) goes through the functions below: Python reads the
 * ledger with the same C code as the shim. Limits are bytes; 0 means no limit. */
#define CT_LEDGER_VERSION 1
#define CT_LEDGER_MAGIC 3553981414494721091
#define CT_LEDGER_MAX_DEVICES 16
#define CT_LEDGER_MAX_MEMBERS 256
#define CT_LEDGER_GROUP_MAX 64
#define CT_LEDGER_HEADER_SIZE 4096
#define CT_LEDGER_MEMBER_SIZE 640
#define CT_LEDGER_FILE_SIZE 167936

/* slot states (low 8 bits of ct_ledger_member.state) */
#define CT_LEDGER_FREE 0
#define CT_LEDGER_CLAIMING 1
#define CT_LEDGER_ACTIVE 2

/* ct_ledger_header.on_exceed: what the shim does with an allocation over the limit */
#define CT_LEDGER_DENY 0
#define CT_LEDGER_WARN 1

/* ct_ledger_header.flags */
#define CT_LEDGER_F_COUNT_HOST 1

/* return codes. reserve / force / release: 1 = fine (granted, within the limit, released),
 * 0 = not (denied, now over the limit, clamped at 0); other calls: CT_LEDGER_OK. < 0: errors. */
#define CT_LEDGER_OK 0
#define CT_LEDGER_GRANTED 1
#define CT_LEDGER_DENIED 0
#define CT_LEDGER_EINVAL -1
#define CT_LEDGER_ENOTMEMBER -2
#define CT_LEDGER_EFULL -3
#define CT_LEDGER_ENODEV -4
#define CT_LEDGER_ENOENT -5
#define CT_LEDGER_EACCESS -6
#define CT_LEDGER_ESYS -7

/* ct_ledger_member_view.alive */
#define CT_LEDGER_DEAD 0
#define CT_LEDGER_ALIVE 1
#define CT_LEDGER_UNKNOWN 2

struct ct_ledger_header {
    uint64_t magic;                /* CT_LEDGER_MAGIC, stored last when the file is created */
    uint32_t version;              /* CT_LEDGER_VERSION */
    uint32_t header_size;          /* CT_LEDGER_HEADER_SIZE */
    uint32_t member_size;          /* CT_LEDGER_MEMBER_SIZE */
    uint32_t max_devices;          /* CT_LEDGER_MAX_DEVICES */
    uint32_t max_members;          /* CT_LEDGER_MAX_MEMBERS */
    uint32_t on_exceed;            /* atomic: CT_LEDGER_DENY / CT_LEDGER_WARN */
    uint32_t flags;                /* atomic: CT_LEDGER_F_* */
    uint32_t uid;                  /* creator */
    uint64_t created_ns;           /* CLOCK_REALTIME */
    uint32_t members_hwm;          /* atomic: 1 + highest slot ever claimed (bounds every scan) */
    uint32_t reserved0;
    uint64_t last_reclaim_ns;      /* atomic: CLOCK_MONOTONIC of the last periodic reclaim */
    uint64_t reclaimed;            /* atomic: dead members reclaimed so far */
    uint64_t last_deny_reclaim_ns; /* atomic: CLOCK_MONOTONIC of the last reclaim before a denial */
    char group[80];                /* NUL-terminated group name ("" for a private ledger) */
    uint64_t reserved2[12];
    uint64_t limit[CT_LEDGER_MAX_DEVICES];    /* atomic: bytes, 0 = no limit */
    uint64_t peak[CT_LEDGER_MAX_DEVICES];     /* atomic: highest total seen by a granted reserve */
    uint64_t denials[CT_LEDGER_MAX_DEVICES];  /* atomic: reservations denied */
    uint64_t over[CT_LEDGER_MAX_DEVICES];     /* atomic: forced (warn mode) past the limit */
    uint8_t reserved3[3328];
};

struct ct_ledger_member {
    uint64_t state;                /* atomic: (pid << 32) | (generation << 8) | CT_LEDGER_FREE.. */
    int32_t pid;                   /* copy of the pid in state, for readers */
    uint32_t reserved0;
    uint64_t start_ticks;          /* /proc/<pid>/stat field 22; 0 = unknown (no reuse check) */
    uint64_t pidns;                /* inode of /proc/self/ns/pid; 0 = unknown */
    uint64_t joined_ns;            /* CLOCK_REALTIME */
    uint64_t reserved1[3];
    uint64_t held[CT_LEDGER_MAX_DEVICES];     /* atomic: bytes this member holds */
    uint64_t peak[CT_LEDGER_MAX_DEVICES];     /* atomic: its highest held */
    uint64_t denials[CT_LEDGER_MAX_DEVICES];  /* atomic */
    uint64_t over[CT_LEDGER_MAX_DEVICES];     /* atomic */
    uint64_t reserved2[8];
};

/* What ct_ledger_open writes into a ledger it creates. */
struct ct_ledger_config {
    uint64_t limit[CT_LEDGER_MAX_DEVICES];    /* bytes, 0 = no limit */
    uint32_t on_exceed;                       /* CT_LEDGER_DENY / CT_LEDGER_WARN */
    uint32_t flags;                           /* CT_LEDGER_F_* */
    char group[80];                           /* "" : taken from the file name */
};

struct ct_ledger_member_view {
    int32_t slot;
    int32_t pid;
    uint32_t alive;                /* CT_LEDGER_ALIVE, _DEAD (not reclaimed yet), _UNKNOWN */
    uint32_t reserved;
    uint64_t start_ticks;
    uint64_t joined_ns;
    uint64_t held[CT_LEDGER_MAX_DEVICES];
    uint64_t peak[CT_LEDGER_MAX_DEVICES];
    uint64_t denials[CT_LEDGER_MAX_DEVICES];
    uint64_t over[CT_LEDGER_MAX_DEVICES];
};

/* A consistent-enough copy for status displays (each field is one atomic load). */
struct ct_ledger_view {
    uint32_t version;
    uint32_t on_exceed;
    uint32_t flags;
    uint32_t uid;
    uint64_t created_ns;
    uint32_t nmembers;             /* ACTIVE slots copied into members[] */
    uint32_t members_hwm;
    uint64_t reclaimed;
    char group[80];
    uint64_t limit[CT_LEDGER_MAX_DEVICES];
    uint64_t in_use[CT_LEDGER_MAX_DEVICES];   /* held by members alive (or of unknown state) */
    uint64_t dead_held[CT_LEDGER_MAX_DEVICES];/* held by dead members not reclaimed yet */
    uint64_t peak[CT_LEDGER_MAX_DEVICES];
    uint64_t denials[CT_LEDGER_MAX_DEVICES];
    uint64_t over[CT_LEDGER_MAX_DEVICES];
    struct ct_ledger_member_view members[CT_LEDGER_MAX_MEMBERS];
};

/* A process's handle on an open ledger (process-local, opaque). */
struct ct_ledger;
typedef struct ct_ledger ct_ledger;

/* Open the ledger file at path; NULL on failure with a message in err. Refuses a symlink, a
 * file of another uid or with group/other permission bits, a file that is not a ledger of this
 * version. create != 0: create it (0600, no limits) when it does not exist. */
ct_ledger *ct_ledger_open(const char *path, int32_t create, char *err, uint64_t errlen);
/* Open, or create initialized from cfg (NULL: no limits) when it does not exist; *created (may
 * be NULL) says which. An existing ledger keeps its own settings (see ct_ledger_set_limit). */
ct_ledger *ct_ledger_create(const char *path, const struct ct_ledger_config *cfg, int32_t *created,
                            char *err, uint64_t errlen);
/* Unmap and free the handle. Does not leave: call ct_ledger_leave first to give bytes back. */
void ct_ledger_close(ct_ledger *l);

/* Make the process (pid, start_ticks) a member; start_ticks 0: read /proc/<pid>/stat. Returns
 * the slot (>= 0), CT_LEDGER_EFULL or CT_LEDGER_EINVAL. Evicts an older slot of the same process
 * (an image before exec). A slot inherited over fork is left to the parent. No allocation, no
 * lock, only async-signal-safe calls: fine in a pthread_atfork child handler. */
int32_t ct_ledger_join(ct_ledger *l, int32_t pid, uint64_t start_ticks);
/* Give the slot back (its bytes with it). CT_LEDGER_OK, or CT_LEDGER_ENOTMEMBER. */
int32_t ct_ledger_leave(ct_ledger *l);
int32_t ct_ledger_slot(const ct_ledger *l);

/* The hot path: no lock, no allocation, no system call except when a limit is hit (then a
 * yield and a reclaim) or when the periodic reclaim is due (once a second per ledger).
 * reserve: 1 granted (counted), 0 denied (not counted), < 0 error (not counted: not a member,
 *          bad device). *in_use / *limit (either may be NULL): the device's total as this call
 *          saw it (with the request when granted, without it when denied) and its limit.
 * force:   counts without checking (warn mode, or an allocation larger than reserved): 1 within
 *          the limit, 0 the total is now over it, < 0 error.
 * release: 1 released, 0 clamped at zero (released more than held), < 0 error. */
int32_t ct_ledger_reserve(ct_ledger *l, int32_t dev, uint64_t bytes, uint64_t *in_use, uint64_t *limit);
int32_t ct_ledger_force(ct_ledger *l, int32_t dev, uint64_t bytes);
int32_t ct_ledger_release(ct_ledger *l, int32_t dev, uint64_t bytes);
/* Free the slots of dead members now; returns how many. */
int32_t ct_ledger_reclaim(ct_ledger *l);

/* Queries (0 for a bad handle or device). in_use: total held by live members (dead members are
 * reclaimed at most a second after they die, by the next call that runs the periodic reclaim). */
uint64_t ct_ledger_limit(ct_ledger *l, int32_t dev);
uint64_t ct_ledger_in_use(ct_ledger *l, int32_t dev);
uint64_t ct_ledger_held(ct_ledger *l, int32_t dev);
int32_t ct_ledger_set_limit(ct_ledger *l, int32_t dev, uint64_t bytes);
int32_t ct_ledger_on_exceed(ct_ledger *l);
int32_t ct_ledger_set_on_exceed(ct_ledger *l, int32_t mode);
int32_t ct_ledger_flags(ct_ledger *l);
int32_t ct_ledger_set_flags(ct_ledger *l, int32_t flags);
int32_t ct_ledger_snapshot(ct_ledger *l, struct ct_ledger_view *out);

/* /proc/<pid>/stat field 22 (0 when unreadable). */
uint64_t ct_ledger_proc_start_ticks(int32_t pid);
/* The directory of group ledgers: $CUDATRACE_LEDGER_DIR, else /dev/shm/cudatrace-<uid>, else
 * $XDG_RUNTIME_DIR/cudatrace, else /tmp/cudatrace-<uid>. create != 0: make it (0700). Refuses a
 * symlink, another owner, group/other permissions. CT_LEDGER_ENOENT (path still in buf) when it
 * does not exist and create == 0. */
int32_t ct_ledger_dir(char *buf, uint64_t len, int32_t create, char *err, uint64_t errlen);
/* <dir>/<group>.ledger; group names are [A-Za-z0-9_.-]{1,64}. Returns as ct_ledger_dir. */
int32_t ct_ledger_group_path(const char *group, char *buf, uint64_t len, int32_t create_dir,
                             char *err, uint64_t errlen);
int32_t ct_ledger_valid_group(const char *group);
const char *ct_ledger_strerror(int32_t code);
/* LEDGER-END */
/* CFFI-END */

#endif
