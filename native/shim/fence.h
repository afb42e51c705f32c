/* fence.h - the sealed fence record (native/include/fence.def): found where the workload cannot
 * write it, read once at load, parsed and checked here; budget.c fences the process with it, and
 * the environment may then only make the fence stricter (docs/budgets.md, "The sealed fence"). */
#ifndef CUDATRACE_FENCE_H
#define CUDATRACE_FENCE_H

#include "util.h"

#define CT_SET_NONE (-1) /* a field of fence.def that no setting names */
#include "fence.def"
enum {
#define CT_FENCE_FIELD(ID, ...) CT_FENCE_##ID,
#include "fence.def"
#undef CT_FENCE_FIELD
    CT_FENCE_NFIELDS
};

/* Find this process's record and read it (once, at load, before the settings are used):
 *   a container's, CT_FENCE_PATH (a regular file on a read-only mount, or root's on a path only
 *   root can write), else
 *   a Slurm job's in CT_FENCE_JOBS_DIR: the job named by the process's cgroup (job_<id>, Slurm's
 *   task/cgroup layouts), else by SLURM_JOB_ID, else the strictest record of the process's real
 *   uid; a record of another uid is refused.
 * Never a location the environment names. 1: a record applies (usable, or ct_fence_error says
 * why not: the process's CUDA is then refused, or runs unfenced as the record's on-fence-error
 * says); 0: none. */
int ct_fence_load(void);
int ct_fence_sealed(void);
/* "" when the record is usable, else why not ("the fence record PATH, line 3: ...") */
const char *ct_fence_error(void);
/* where the record was found (for lines) */
const char *ct_fence_path(void);
/* a field's value (CT_FENCE_<ID>), NULL when the record has none */
const char *ct_fence_get(int field);
/* the field's key ("share-budget") and the settings.def ID naming it (CT_SET_NONE: none) */
const char *ct_fence_key(int field);
int ct_fence_setting(int field);
/* The fence's value of a fence setting (settings.def ID) in this process. With a sealed record:
 * the record's (the declared default where it has none), made stricter where the environment
 * is (a lower CUDATRACE_BUDGET or _SHARE_BUDGET bounds the process in a share: the record's,
 * else CUDATRACE_SHARE's or `env`; on-exceed warn < fail < abort; on-fence-error refuse;
 * count-host and count-contexts 1); anything else the environment says of the fence is
 * ignored (ct_fence_ignored). Without one: the environment's (ct_setting). */
const char *ct_fence_value(int setting);
/* what this process's environment said of its sealed fence and was ignored, for one line:
 * "CUDATRACE_GROUP='mine', ..." ("" nothing) */
const char *ct_fence_ignored(void);
/* text quoted for a line: 'value', or its first characters and its length when long */
void ct_fence_quote(char *out, size_t n, const char *value);

#endif
