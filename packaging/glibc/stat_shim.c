/* The stat family as glibc before 2.33 provided it to programs: static
 * wrappers (libc_nonshared.a) around __xstat64 and friends, which every glibc
 * since 2.2.5 exports. Hidden: a library preloaded into a program must not
 * replace the program's own stat. No header: <sys/stat.h> declares these
 * with default visibility; the buffer is only passed on, and struct stat
 * and struct stat64 are the same on x86-64. */
#define SHIM __attribute__((visibility("hidden")))
#define STAT_VERSION 1 /* _STAT_VER_LINUX on x86-64 */

extern int __xstat64(int, const char *, void *);
extern int __lxstat64(int, const char *, void *);
extern int __fxstat64(int, int, void *);
extern int __fxstatat64(int, int, const char *, void *, int);

SHIM int stat64(const char *path, void *buf) { return __xstat64(STAT_VERSION, path, buf); }
SHIM int lstat64(const char *path, void *buf) { return __lxstat64(STAT_VERSION, path, buf); }
SHIM int fstat64(int fd, void *buf) { return __fxstat64(STAT_VERSION, fd, buf); }
SHIM int fstatat64(int dirfd, const char *path, void *buf, int flags) { return __fxstatat64(STAT_VERSION, dirfd, path, buf, flags); }
SHIM int stat(const char *path, void *buf) { return __xstat64(STAT_VERSION, path, buf); }
SHIM int lstat(const char *path, void *buf) { return __lxstat64(STAT_VERSION, path, buf); }
SHIM int fstat(int fd, void *buf) { return __fxstat64(STAT_VERSION, fd, buf); }
SHIM int fstatat(int dirfd, const char *path, void *buf, int flags) { return __fxstatat64(STAT_VERSION, dirfd, path, buf, flags); }
