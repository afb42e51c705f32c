/* ledger.h - the budget ledger: its file layout and C API (native/common/ledger.c, linked into
 * both the preload library and the tools library).
 *
 * Python reads the part between the CFFI markers through cffi (cudatrace/native.py): keep it to
 * plain structs of fixed-width integers, integer #defines and prototypes. */
#ifndef CUDATRACE_LEDGER_H
#define CUDATRACE_LEDGER_H
#include <stdint.h>

/* CFFI-BEGIN */
/* A budget ledger is one file of CT_LEDGER_FILE_SIZE bytes:
 *
 *   struct ct_ledger_header                      at offset 0, CT_LEDGER_HEADER_SIZE bytes
 *   struct ct_ledger_member[CT_LEDGER_MAX_MEMBERS]  one slot per live member process
 *
 * Who maps it. Only members map a ledger (MAP_SHARED), and a member maps only a file that its
 * own uid owns and that no other uid may write (regular, owner = euid, no group/other write
 * bit, exactly CT_LEDGER_FILE_SIZE bytes: checked with fstat on the descriptor it maps). So
 * the only processes that can truncate what a member maps are of its own uid (and root), who
 * could kill it anyway: a tenant's damage to a ledger file can fault no process but its own.
 * Everyone else reads a ledger with pread into a buffer of its own and parses the copy
 * (ct_ledger_open_reader, ct_ledger_open_fd: `cudatrace status`, `metrics`, the node agent,
 * the other users' members), which never faults on a short, grown, garbled or replaced file;
 * it is refused with the reason, and nothing is written into it but the node agent's
 * ext_context figures, with pwrite.
 *
 * Parts. A group in a shared ledger directory (sticky, several users: Slurm's per-GPU group, a
 * named container group) is one file per uid, its part: <group>@<uid>.ledger, mode 0644 (0640
 * in a 1770 directory). A member maps its own uid's part and reads the others' header with
 * pread at each reservation: a reservation adds to its own held[dev] and its part's
 * total[dev], then sums its own part's slots and the other parts' total + ext_total, and
 * withdraws if the sum passes the limit (the same argument as within one file, below, with
 * pread as the other reserver's load), so the group's limit holds across users. A part that
 * cannot be read or parsed counts as its last good figure and is said once; one uid can thus
 * hurt its group's budget (write a huge total, or lie with a small one: it can also not load
 * the preload library at all) but never kill, stop or zero another uid's members or their
 * accounting. In a directory of one user (0700, its own) a group is one file, <group>.ledger.
 *
 * There is no lock anywhere. Every field the ledger changes after creation is accessed with
 * sequentially consistent atomics (ledger.c); a member adds to its own held[dev] and then sums
 * held[dev] over all ACTIVE slots, withdrawing if the sum passes the limit, so concurrent
 * reservers in any number of threads and processes can never together exceed it. A member's
 * slot state word packs (pid << 32) | (generation << 8) | state, so a claim publishes its pid
 * and a reclaim cannot hit a slot that was freed and claimed again in the meantime.
 * Everything else (reading, snapshots) goes through the functions below: Python reads the
 * ledger with the same C code as the shim. Limits are bytes; 0 means no limit. */
#define CT_LEDGER_VERSION 3
#define CT_LEDGER_MAGIC 3553981414494721091
#define CT_LEDGER_MAX_DEVICES 16
#define CT_LEDGER_MAX_MEMBERS 256
#define CT_LEDGER_GROUP_MAX 64
#define CT_LEDGER_HEADER_SIZE 4096
#define CT_LEDGER_MEMBER_SIZE 768
#define CT_LEDGER_FILE_SIZE 200704
/* the other users' parts of a group a member reads (more: it fails closed, saying so) */
#define CT_LEDGER_MAX_PARTS 64
/* what a reader of another user's part reads with pread at each reservation: the header up to
 * and including ext_total */
#define CT_LEDGER_PART_HEAD 1024

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
#define CT_LEDGER_DENIED_SHARE 2 /* reserve: denied by the member's share (ct_ledger_set_share) */
#define CT_LEDGER_EINVAL -1
#define CT_LEDGER_ENOTMEMBER -2
#define CT_LEDGER_EFULL -3
#define CT_LEDGER_ENODEV -4
#define CT_LEDGER_ENOENT -5
#define CT_LEDGER_EACCESS -6
#define CT_LEDGER_ESYS -7
#define CT_LEDGER_ECONFLICT -8 /* adopt: the group has another budget, and live members */
#define CT_LEDGER_ENOBUDGET -9 /* adopt: the group has no budget, and this process names none */
#define CT_LEDGER_EBUSY -10    /* adopt: another member is deciding the budget (and stays at it) */
#define CT_LEDGER_EDAMAGED                                                                         \
    -11 /* the ledger file was damaged under its members (ct_ledger_damage) */

/* The budget grammar (ct_ledger_parse_size): a number without a unit below this many bytes is
 * refused as a typo (--budget 12 meant 12 GiB); 12B says bytes */
#define CT_LEDGER_BARE_MIN 1048576

/* ct_ledger_member.liveness. CT_LEDGER_LIVE_LOCK: the member holds an open file description
 * of the ledger with an OFD write lock (F_OFD_SETLK) on byte CT_LEDGER_LOCK_BASE + its slot. The
 * kernel drops it when the process dies, in whatever pid namespace or container, so any process
 * that maps the file tells a live member from a dead one by testing the lock (F_OFD_GETLK: never
 * a lock anyone waits on). CT_LEDGER_LIVE_PID (0): judged by pid and start time, which only
 * means something in the member's own pid namespace (a join on behalf of another process, or a
 * file system without OFD locks). Byte CT_LEDGER_LOCK_OWNER is held by the launcher that owns a
 * private ledger. The lock bytes lie past the end of the file (= CT_LEDGER_FILE_SIZE). */
#define CT_LEDGER_LIVE_PID 0
#define CT_LEDGER_LIVE_LOCK 1
#define CT_LEDGER_LOCK_BASE 200704
#define CT_LEDGER_LOCK_OWNER 200960

/* ct_ledger_member_view.alive */
#define CT_LEDGER_DEAD 0
#define CT_LEDGER_ALIVE 1
#define CT_LEDGER_UNKNOWN 2

struct ct_ledger_header {
    uint64_t magic;       /* CT_LEDGER_MAGIC, stored last when the file is created */
    uint32_t version;     /* CT_LEDGER_VERSION */
    uint32_t header_size; /* CT_LEDGER_HEADER_SIZE */
    uint32_t member_size; /* CT_LEDGER_MEMBER_SIZE */
    uint32_t max_devices; /* CT_LEDGER_MAX_DEVICES */
    uint32_t max_members; /* CT_LEDGER_MAX_MEMBERS */
    uint32_t on_exceed;   /* atomic: CT_LEDGER_DENY / CT_LEDGER_WARN */
    uint32_t flags;       /* atomic: CT_LEDGER_F_* */
    uint32_t uid;         /* creator */
    uint64_t created_ns;  /* CLOCK_REALTIME */
    uint32_t members_hwm; /* atomic: 1 + highest slot ever claimed (bounds every scan) */
    uint32_t reserved0;
    uint64_t last_reclaim_ns;      /* atomic: CLOCK_MONOTONIC of the last periodic reclaim */
    uint64_t reclaimed;            /* atomic: dead members reclaimed so far */
    uint64_t last_deny_reclaim_ns; /* atomic: CLOCK_MONOTONIC of the last reclaim before a denial */
    char group[80];                /* NUL-terminated group name ("" for a private ledger) */
    uint64_t budget_token; /* atomic: the member deciding the group's budget (ct_ledger_adopt) */
    uint64_t reserved2[11];
    uint64_t limit[CT_LEDGER_MAX_DEVICES];   /* atomic: bytes, 0 = no limit */
    uint64_t peak[CT_LEDGER_MAX_DEVICES];    /* atomic: highest total seen by a granted reserve */
    uint64_t denials[CT_LEDGER_MAX_DEVICES]; /* atomic: reservations denied */
    uint64_t over[CT_LEDGER_MAX_DEVICES];    /* atomic: forced (warn mode) past the limit */
    /* atomic: what this file's slots hold (held, of every slot), kept in a shared directory
     * only (parts), for the other users' members, who read it with pread */
    uint64_t total[CT_LEDGER_MAX_DEVICES];
    /* the node agent's: the sum of its ext_context figures of ACTIVE slots (bytes), written with
     * pwrite (no member writes it) */
    uint64_t ext_total[CT_LEDGER_MAX_DEVICES];
    uint8_t reserved3[3072];
};

struct ct_ledger_member {
    uint64_t state; /* atomic: (pid << 32) | (generation << 8) | CT_LEDGER_FREE.. */
    int32_t pid;    /* copy of the pid in state, for readers */
    uint32_t reserved0;
    uint64_t start_ticks; /* /proc/<pid>/stat field 22; 0 = unknown (no reuse check) */
    uint64_t pidns;       /* inode of /proc/self/ns/pid; 0 = unknown */
    uint64_t joined_ns;   /* CLOCK_REALTIME */
    uint64_t liveness;    /* CT_LEDGER_LIVE_*: how others tell whether this member still lives */
    uint64_t share;       /* 0, or the share it belongs to: its name (<= 8 bytes) packed */
    uint64_t share_limit; /* bytes the members of its share may hold on each device; 0 none */
    uint64_t held[CT_LEDGER_MAX_DEVICES];        /* atomic: bytes this member holds */
    uint64_t peak[CT_LEDGER_MAX_DEVICES];        /* atomic: its highest held */
    uint64_t denials[CT_LEDGER_MAX_DEVICES];     /* atomic */
    uint64_t over[CT_LEDGER_MAX_DEVICES];        /* atomic */
    uint32_t context_kib[CT_LEDGER_MAX_DEVICES]; /* atomic: of held, its CUDA context (KiB) */
    /* its CUDA context as the node agent counts it (KiB; a member in another pid namespace
     * cannot find itself in NVML's list): counted beside held, written with pwrite by the
     * agent alone (ct_ledger_set_member_context) */
    uint32_t ext_context_kib[CT_LEDGER_MAX_DEVICES];
    uint8_t reserved1[64];
};

/* What ct_ledger_open writes into a ledger it creates. */
struct ct_ledger_config {
    uint64_t limit[CT_LEDGER_MAX_DEVICES]; /* bytes, 0 = no limit */
    uint32_t on_exceed;                    /* CT_LEDGER_DENY / CT_LEDGER_WARN */
    uint32_t flags;                        /* CT_LEDGER_F_* */
    char group[80];                        /* "" : taken from the file name */
};

struct ct_ledger_member_view {
    int32_t slot;
    int32_t pid;
    uint32_t alive;       /* CT_LEDGER_ALIVE, _DEAD (not reclaimed yet), _UNKNOWN */
    uint32_t other_pidns; /* 1: it joined from another pid namespace than the reader's */
    uint64_t pidns;       /* the inode of its pid namespace (0: unknown) */
    uint64_t start_ticks;
    uint64_t joined_ns;
    uint64_t held[CT_LEDGER_MAX_DEVICES];
    uint64_t peak[CT_LEDGER_MAX_DEVICES];
    uint64_t denials[CT_LEDGER_MAX_DEVICES];
    uint64_t over[CT_LEDGER_MAX_DEVICES];
    uint64_t context[CT_LEDGER_MAX_DEVICES]; /* of held: its CUDA context and modules (bytes) */
    uint64_t share;                          /* as in ct_ledger_member */
    uint64_t share_limit;
};

/* A consistent-enough copy for status displays (each field is one atomic load). */
struct ct_ledger_view {
    uint32_t version;
    uint32_t on_exceed;
    uint32_t flags;
    uint32_t uid;   /* its creator (header) */
    uint32_t owner; /* the file's owner (fstat): a part's uid */
    uint32_t reserved0;
    uint64_t created_ns;
    uint32_t nmembers; /* ACTIVE slots copied into members[] */
    uint32_t members_hwm;
    uint64_t reclaimed;
    char group[80];
    uint64_t limit[CT_LEDGER_MAX_DEVICES];
    uint64_t in_use[CT_LEDGER_MAX_DEVICES];    /* held by members alive (or of unknown state) */
    uint64_t dead_held[CT_LEDGER_MAX_DEVICES]; /* held by dead members not reclaimed yet */
    uint64_t peak[CT_LEDGER_MAX_DEVICES];
    uint64_t denials[CT_LEDGER_MAX_DEVICES];
    uint64_t over[CT_LEDGER_MAX_DEVICES];
    struct ct_ledger_member_view members[CT_LEDGER_MAX_MEMBERS];
};

/* A process's handle on an open ledger (process-local, opaque). */
struct ct_ledger;
typedef struct ct_ledger ct_ledger;

/* Open the ledger file at path as a member would (the shim, the launcher): mapped. NULL on
 * failure with a message in err. Refuses a symlink, a file of another uid or with group/other
 * write permission (any group/other bit outside a shared directory), a file that is not a
 * ledger of this version, or damaged. The directory is opened once (O_NOFOLLOW) and the file
 * through it, so a directory swapped later is not followed. In a shared ledger directory the
 * other users' parts of the group are found there and read with pread (ledger.h, "Parts").
 * create != 0: create it (no limits) when it does not exist. */
ct_ledger *ct_ledger_open(const char *path, int32_t create, char *err, uint64_t errlen);
/* Open a ledger to read it, never mapped: each snapshot is a pread copy of the file, checked
 * before it is parsed (a short, grown, garbled file is refused with the reason; a FIFO, a
 * link, a directory are never read). Any owner. NULL on failure with a message in err.
 * Members' calls (join, reserve...) answer CT_LEDGER_EINVAL on such a handle. */
ct_ledger *ct_ledger_open_reader(const char *path, char *err, uint64_t errlen);
/* The same for the ledger a descriptor names, for a reader outside the members' containers
 * (the node agent: fd from /proc/<pid>/map_files of a member's mapping, which the kernel
 * resolves, so no path inside a container is followed). fd stays the caller's (a duplicate is
 * kept); name is for messages. Opened for writing, ct_ledger_set_member_context writes the
 * agent's figures into it with pwrite. NULL on failure with a message in err. */
ct_ledger *ct_ledger_open_fd(int32_t fd, const char *name, char *err, uint64_t errlen);
/* Open, or create initialized from cfg (NULL: no limits) when it does not exist; *created (may
 * be NULL) says which. An existing ledger keeps its own settings (see ct_ledger_set_limit). */
ct_ledger *ct_ledger_create(const char *path, const struct ct_ledger_config *cfg, int32_t *created,
                            char *err, uint64_t errlen);
/* Why the handle's ledger is refused now ("" when it is not): a member's file found damaged
 * (its size, type, mode or header changed under it; its calls then answer CT_LEDGER_EDAMAGED),
 * or a reader's last snapshot that could not be made. */
const char *ct_ledger_damage(const ct_ledger *l);
/* The other users' parts of this member's group that it counts (0 outside a shared directory),
 * after looking for new ones now. */
int32_t ct_ledger_other_parts(ct_ledger *l);
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
/* Shares: a subset of a group's members that together may hold at most limit bytes on each
 * device, within the group's own limit (Slurm: the jobs on one GPU share its group, each job
 * its own share). name: 1 to 8 of [A-Za-z0-9_.-] (NULL or "": none). Applies to this handle's
 * later joins and, when a member already, to its slot. CT_LEDGER_OK or CT_LEDGER_EINVAL. */
int32_t ct_ledger_set_share(ct_ledger *l, const char *name, uint64_t limit);
/* Bytes held on dev by the members of this handle's share (0 without one). */
uint64_t ct_ledger_share_in_use(ct_ledger *l, int32_t dev);
/* Whether the directory holding path is a shared ledger directory (ct_ledger_dir): 1 or 0. */
int32_t ct_ledger_shared_dir(const char *path);

/* The hot path: no lock, no allocation, no system call except when a limit is hit (then a
 * yield and a reclaim) or when the periodic reclaim is due (once a second per ledger).
 * reserve: 1 granted (counted), 0 denied (not counted), 2 denied by the member's share (then
 *          *in_use and *limit are the share's), < 0 error (not counted: not a member,
 *          bad device). *in_use / *limit (either may be NULL): the device's total as this call
 *          saw it (with the request when granted, without it when denied) and its limit.
 * force:   counts without checking (warn mode, or an allocation larger than reserved): 1 within
 *          the limit, 0 the total is now over it, < 0 error.
 * release: 1 released, 0 clamped at zero (released more than held), < 0 error. */
int32_t ct_ledger_reserve(ct_ledger *l, int32_t dev, uint64_t bytes, uint64_t *in_use,
                          uint64_t *limit);
int32_t ct_ledger_force(ct_ledger *l, int32_t dev, uint64_t bytes);
int32_t ct_ledger_release(ct_ledger *l, int32_t dev, uint64_t bytes);
/* Count bytes of this member's CUDA context on dev (held, never denied) and record the figure
 * apart (context_kib). bytes is the context's current size: the difference to what was
 * recorded is forced or released. CT_LEDGER_OK or < 0. */
int32_t ct_ledger_set_context(ct_ledger *l, int32_t dev, uint64_t bytes);
/* The context of the active member in slot, whose pid (in its own namespace) and start_ticks
 * must still be these: a node agent counts the contexts NVML reports under host pids for
 * members in other pid namespaces, which cannot find themselves in NVML's list. The figure
 * goes to the slot's ext_context_kib and the header's ext_total (counted beside held, never
 * denied), written with pwrite on a reader's handle opened for writing (ct_ledger_open_fd), so
 * the agent never maps a file a tenant can truncate. CT_LEDGER_OK, CT_LEDGER_ENOTMEMBER (the
 * slot holds another process now), or < 0. */
int32_t ct_ledger_set_member_context(ct_ledger *l, int32_t slot, int32_t pid, uint64_t start_ticks,
                                     int32_t dev, uint64_t bytes);
/* The launcher's claim on a private ledger: an OFD lock on CT_LEDGER_LOCK_OWNER, held until
 * the handle is closed. CT_LEDGER_OK, or CT_LEDGER_ESYS where the file system has no OFD locks. */
int32_t ct_ledger_hold(ct_ledger *l);
/* Whether any other open file description holds a lock of this ledger (a live member or its
 * launcher): 1 yes, 0 no, CT_LEDGER_ESYS cannot tell (no OFD locks). */
int32_t ct_ledger_in_use_by_anyone(ct_ledger *l);
/* Free the slots of dead members now; returns how many. */
int32_t ct_ledger_reclaim(ct_ledger *l);

/* Queries (0 for a bad handle or device). in_use: total held by live members (dead members are
 * reclaimed at most a second after they die, by the next call that runs the periodic reclaim),
 * the other users' parts included. */
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
 * symlink, another owner, group/other permissions, except for a shared ledger directory named
 * by $CUDATRACE_LEDGER_DIR: sticky (mode 1777 or 1770) and owned by root or by you, where each
 * user's part of a group is its own (mode 0644, 0640 in a 1770 one; docs/budgets.md).
 * CT_LEDGER_ENOENT (path still in buf) when it does not exist and create == 0. */
int32_t ct_ledger_dir(char *buf, uint64_t len, int32_t create, char *err, uint64_t errlen);
/* ct_ledger_dir and ct_ledger_group_path with the named directory given (NULL: the defaults),
 * not read from the environment: the preload library's, whose directory a sealed fence record
 * may name (docs/budgets.md, "The sealed fence"). A name longer than a path is refused. */
int32_t ct_ledger_dir_at(const char *named, char *buf, uint64_t len, int32_t create, char *err,
                         uint64_t errlen);
/* <dir>/<group>.ledger, or in a shared ledger directory this uid's part, <dir>/<group>@<uid>.ledger;
 * group names are [A-Za-z0-9_.-]{1,64}, not starting with '.' or '-'. Returns as ct_ledger_dir. */
int32_t ct_ledger_group_path(const char *group, char *buf, uint64_t len, int32_t create_dir,
                             char *err, uint64_t errlen);
int32_t ct_ledger_group_path_at(const char *named, const char *group, char *buf, uint64_t len,
                                int32_t create_dir, char *err, uint64_t errlen);
int32_t ct_ledger_valid_group(const char *group);
const char *ct_ledger_strerror(int32_t code);

/* The group rule (docs/budgets.md, "Groups"), one for the launcher and the preload library.
 * Called as a member (after ct_ledger_join). want: the budget this process asks for, bytes per
 * device (NULL: none; it joins whatever budget the group has). CT_LEDGER_OK: the group's budget
 * is want (set now when the group had another one and no live member but this one), or the
 * group has one and want is NULL. CT_LEDGER_ECONFLICT: another budget, with live members;
 * CT_LEDGER_ENOBUDGET: the group has none and want is NULL; CT_LEDGER_EBUSY: another member
 * did not finish deciding within a second. err says which, with the budgets and pids. *replaced
 * (may be NULL): 1 when this call replaced a budget (err then says which). Lock-free for the
 * members: one token (budget_token) names the member deciding; a token of a member that died
 * is taken over, and nothing waits on a process that no longer runs. */
int32_t ct_ledger_adopt(ct_ledger *l, const uint64_t *want, int32_t *replaced, char *err,
                        uint64_t errlen);
/* The same rule's verdict now, deciding nothing and needing no membership (a process that
 * will join later: its cuInit is refused early): CT_LEDGER_OK (also when want would replace
 * the budget of a group without live members), _ECONFLICT or _ENOBUDGET with err. */
int32_t ct_ledger_check_budget(ct_ledger *l, const uint64_t *want, char *err, uint64_t errlen);

/* The one grammar of budget amounts (Python's --budget reads its sizes through it too): a
 * number (1.5) and a unit, binary B KiB MiB GiB TiB (K M G T alike), decimal KB MB GB TB; case
 * and blanks between them do not matter. A number without a unit is bytes, refused below
 * CT_LEDGER_BARE_MIN (12 is a typo for 12GiB: write 12B for bytes); no sign, no percentages.
 * 0 with *out bytes; CT_LEDGER_EINVAL with the reason and the fix in err. */
int32_t ct_ledger_parse_size(const char *text, uint64_t *out, char *err, uint64_t errlen);
/* A budget: "AMOUNT" for every device, "DEV=AMOUNT,..." per device, or both (the per-device
 * items win). limits[CT_LEDGER_MAX_DEVICES] gets bytes (0: no limit on that device). */
int32_t ct_ledger_parse_budget(const char *spec, uint64_t *limits, char *err, uint64_t errlen);
/* CFFI-END */

/* What a member's ledger says while it runs, for the preload library to say it (set once at
 * load; NULL: nothing is said): fatal != 0, its own file was found damaged (size, type, mode or
 * header changed under it; its calls answer CT_LEDGER_EDAMAGED from now on); fatal == 0, a note
 * about another user's part of its group (unreadable, damaged, too many), said once a part.
 * Called from the accounting calls, never from open, join or adopt (whose err says it). */
void ct_ledger_set_report(void (*fn)(int32_t fatal, const char *msg));

#endif
