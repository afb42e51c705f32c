/* The C library functions the preload library calls that exist only above its glibc floor
 * (native/floor/glibc_floor.py), defined here through raw system calls, hidden: the library's
 * own calls reach these, never the C library's, and nothing of the program's changes.
 *
 *   stat, fstat, lstat, fstatat   glibc 2.33 (before: inline wrappers of __xstat and
 *                                 __fxstatat in the headers)
 *
 * Built with headers older than the function (a glibc before 2.33 here), the headers' own
 * wrappers are used and nothing is defined. Linked into the preload library only (the tools
 * library runs in the Python process, on this machine's glibc). */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33) && defined(SYS_newfstatat) && defined(SYS_fstat)
#define CT_COMPAT __attribute__((visibility("hidden")))

/* x86-64 and aarch64: the kernel's struct stat is glibc's, field for field */
CT_COMPAT int stat(const char *restrict path, struct stat *restrict buf)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, buf, 0);
}

CT_COMPAT int lstat(const char *restrict path, struct stat *restrict buf)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, buf, AT_SYMLINK_NOFOLLOW);
}

CT_COMPAT int fstat(int fd, struct stat *buf) { return (int)syscall(SYS_fstat, fd, buf); }

CT_COMPAT int fstatat(int dirfd, const char *restrict path, struct stat *restrict buf, int flags)
{
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags);
}
#endif
