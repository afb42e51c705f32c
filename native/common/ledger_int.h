/* ledger_int.h - what the files of the budget ledger share among themselves (ledger.h is the API):
 * the handle, the atomics, and the functions one file of the ledger calls in another. Nothing
 * here is exported: every function is hidden in both libraries.
 *
 *   ledger.c        liveness (OFD byte locks, pids), slots, the hot path, queries, snapshots
 *   ledger_open.c   opening (a member's mapping, a reader's pread copy), checking a file, the
 *                   directories (private and shared), group paths, closing
 *   ledger_parts.c  a group in a shared directory: the other users' parts, found in the
 *                   directory and read with pread
 *   ledger_group.c  the group rule (ct_ledger_adopt) and the budget grammar */
#ifndef CUDATRACE_LEDGER_INT_H
#define CUDATRACE_LEDGER_INT_H

#include "ledger.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#define CTL_HIDDEN __attribute__((visibility("hidden")))

#define LD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define XCHG(p, v) __atomic_exchange_n((p), (v), __ATOMIC_SEQ_CST)
#define CAS(p, e, d)                                                                               \
    __atomic_compare_exchange_n((p), (e), (d), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)

#define W_STATE(w) ((uint32_t)((w)&0xffu))
#define W_GEN(w) ((uint32_t)(((w) >> 8) & 0xffffffu))
#define W_PID(w) ((int32_t)(uint32_t)((w) >> 32))
#define W_MAKE(pid, gen, st)                                                                       \
    (((uint64_t)(uint32_t)(pid) << 32) | ((uint64_t)((gen)&0xffffffu) << 8) | (uint64_t)(st))

/* One other user's part of a member's group (ledger_parts.c). Entries are published once
 * (ct_ledger_parts.n) and never freed while the handle lives: a reserving thread reads them
 * without a lock. */
struct ctl_part {
    int fd;              /* O_RDONLY, our own; never mapped */
    uint32_t gone;       /* atomic: not in the directory at the last look (skipped) */
    uint32_t said;       /* atomic: that it cannot be read was said */
    uint32_t uid;        /* its owner: the uid its name says */
    uint64_t created_ns; /* its header's, when it was found (0: unreadable then) */
    uint64_t dev, ino;
    uint64_t last[CT_LEDGER_MAX_DEVICES]; /* atomic: its last good total + ext_total */
};

struct ctl_parts {
    int dirfd;              /* the shared directory, opened once (O_NOFOLLOW) */
    uint32_t n;             /* atomic: entries published in part[] */
    int32_t scanner;        /* atomic: pid of the process whose thread looks now, 0 none */
    uint64_t started, done; /* atomic: looks at the directory begun; the last one finished */
    uint32_t settled;       /* atomic: the directory had not changed for a while at the last look */
    int64_t ctime_s, ctime_ns;            /* atomic: the directory's ctime at the last look */
    char prefix[CT_LEDGER_GROUP_MAX + 2]; /* "<group>@" */
    size_t prefix_len;
    uint64_t self_dev, self_ino; /* this member's own part */
    uint64_t dir_dev, dir_ino;   /* the directory's (to reopen it when the program closed it) */
    struct ctl_part part[CT_LEDGER_MAX_PARTS];
};

struct ct_ledger {
    struct ct_ledger_header *hdr; /* the mapping; NULL for a reader's handle */
    struct ct_ledger_member *mem;
    int32_t slot;      /* -1: not a member */
    int32_t pid;       /* the member's pid */
    int32_t joined_by; /* getpid() of the process that joined (fork check in leave) */
    uint64_t word;     /* our slot's ACTIVE state word */
    uint64_t pidns;    /* our pid namespace, 0 unknown */
    int fd;            /* our open file description of the ledger (liveness locks), -1 none */
    int32_t fd_owner;  /* getpid() of the process that opened fd (a child reopens its own) */
    uint64_t ino, dev; /* of the file, to tell that fd is still ours */
    char *path;
    uint64_t share; /* ct_ledger_set_share: written into every slot this handle joins */
    uint64_t share_limit;
    int reader;              /* opened to read: never mapped; fd is its own descriptor */
    uint32_t damaged;        /* atomic: a member's file found damaged (why says how) */
    uint32_t damage_said;    /* atomic: reported (ct_ledger_set_report) */
    uint64_t next_check_ns;  /* atomic: when a member checks its own file again */
    unsigned shared_mode;    /* the file's mode in a shared directory, 0 elsewhere */
    uint32_t owner;          /* the file's owner when opened (a member's: its uid then) */
    struct ctl_parts *parts; /* a group in a shared directory: the other users' parts */
    char why[400];           /* ct_ledger_damage */
};

/* ---- ledger.c ------------------------------------------------------------------------------ */
CTL_HIDDEN void ctl_set_err(char *err, uint64_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
CTL_HIDDEN uint64_t ctl_mono_ns(void);
CTL_HIDDEN uint64_t ctl_real_ns(void);
CTL_HIDDEN uint64_t ctl_sat_add(uint64_t a, uint64_t b);
CTL_HIDDEN void ctl_sleep_ms(long ms);
CTL_HIDDEN int ctl_valid(const struct ct_ledger *l);
CTL_HIDDEN int ctl_our_fd(const struct ct_ledger *l);
CTL_HIDDEN void ctl_own_fd(struct ct_ledger *l);
CTL_HIDDEN int ctl_range_locked(int fd, uint64_t off, uint64_t len);
/* CT_LEDGER_ALIVE, _DEAD or _UNKNOWN of the member in slot, as a process of pid namespace
 * my_pidns tells it through fd (a description of the member's file) */
CTL_HIDDEN int ctl_member_alive(uint64_t my_pidns, int fd, int32_t slot, int32_t pid,
                                uint64_t ticks, uint64_t pidns, uint64_t liveness);
CTL_HIDDEN uint32_t ctl_hwm(const struct ct_ledger *l);
CTL_HIDDEN int ctl_reclaim_scan(struct ct_ledger *l);
/* the view of a ledger held at hdr/mem (a mapping or a copy); self_slot: the reader's own */
CTL_HIDDEN void ctl_fill_view(const struct ct_ledger_header *h, const struct ct_ledger_member *mem,
                              uint64_t my_pidns, int fd, int32_t self_slot,
                              struct ct_ledger_view *out);
/* a member's own file (or its group's directory) is damaged: why, CT_LEDGER_EDAMAGED from now
 * on; said by the next accounting call (never from open, join or adopt, whose callers may hold
 * the lock the report takes) */
CTL_HIDDEN void ctl_damaged(struct ct_ledger *l, const char *why);
CTL_HIDDEN void ctl_report(int32_t fatal, const char *msg);

/* ---- ledger_open.c ------------------------------------------------------------------------- */
/* Whether the header h (of a file of size bytes, or -1: a mapping of the right size) is a
 * ledger of this version, undamaged; group: it must be this group (NULL: any). 0, or -1 with
 * the reason in why (*again = 1: not initialized yet, its creator may be making it). */
CTL_HIDDEN int ctl_check_header(const struct ct_ledger_header *h, const char *group, char *why,
                                size_t n, int *again);
/* a member's periodic look at its own file (fstat and header); 0 fine, -1 damaged (said) */
CTL_HIDDEN int ctl_check_own(struct ct_ledger *l);
/* pread exactly n bytes at off (restarting on EINTR and short reads); bytes read, -1 error */
CTL_HIDDEN long ctl_pread_full(int fd, void *buf, size_t n, uint64_t off);
/* the mode a ledger has in the shared directory dsb describes (0: not a shared directory) */
CTL_HIDDEN unsigned ctl_shared_mode(const struct stat *dsb);

/* ---- ledger_parts.c ------------------------------------------------------------------------ */
/* Set up the parts of l's group in the shared directory dirfd (taken over, closed with the
 * handle), looking once. 0, or -1 with err. */
CTL_HIDDEN int ctl_parts_open(struct ct_ledger *l, int dirfd, char *err, uint64_t errlen);
CTL_HIDDEN void ctl_parts_close(struct ct_ledger *l);
/* What the other parts hold on dev (totals and the agent's contexts). precise: a part whose
 * lock bytes no one holds is read whole and only members not dead count (dead members of a
 * part no one of its uid reclaims). Looks for new parts first when the directory changed. */
CTL_HIDDEN uint64_t ctl_parts_sum(struct ct_ledger *l, int32_t dev, int precise);
/* Live members of the other parts whose part's budget differs from want: how many; their
 * "pid P (uid U)" list into pids, the first such budget into other[] (may be NULL). */
CTL_HIDDEN int ctl_parts_conflicts(struct ct_ledger *l, const uint64_t *want, char *pids, size_t n,
                                   uint64_t *other);
/* the number of other parts counted (looking first) */
CTL_HIDDEN int ctl_parts_count(struct ct_ledger *l);

#endif
