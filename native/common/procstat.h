/* procstat.h - what the ledger reads of /proc (procstat.c): a process's state and start time,
 * this process's pid namespace, the path of one of its descriptors. Plain C, libc only, no
 * stdio and no allocation: it runs inside the traced program (the shim) and in Python's (the
 * tools library). */
#ifndef CUDATRACE_PROCSTAT_H
#define CUDATRACE_PROCSTAT_H

#include <stdint.h>

/* /proc/<pid>/stat: 1 with the state letter (field 3) and the start time in clock ticks since
 * boot (field 22); 0 when the process does not exist (ENOENT/ESRCH); -1 when it cannot be told.
 * errno as the reads left it. */
int ct_procstat_read(int32_t pid, char *state, uint64_t *ticks);
/* the start time of pid (0: none, or it cannot be read); errno kept */
uint64_t ct_procstat_start_ticks(int32_t pid);
/* the inode of this process's pid namespace (/proc/self/ns/pid), 0 when unknown */
uint64_t ct_procstat_self_pidns(void);
/* "/proc/self/fd/<fd>" into buf (at least 32 bytes): reopening it gives an open file
 * description of one's own on the same file */
void ct_procstat_fd_path(char *buf, int fd);

#endif
