/*
 * older_agent: a stand-in for the agent of an earlier memgap, built as a
 * shared library and preloaded by `MEMGAP_AGENT=... memgap run`. Like every
 * agent it makes its process's area in $MEMGAP_AREA_DIR, but with an
 * earlier layout's magic ("MGAREA01") before the pid, and then records
 * nothing. The recorder must say so and leave the program alone.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void make_older_area(void) {
    const char *dir = getenv("MEMGAP_AREA_DIR");
    if (dir == NULL) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.0.area", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return;
    unsigned char start[12];
    memcpy(start, "MGAREA01", 8);
    uint32_t pid = (uint32_t)getpid();
    memcpy(start + 8, &pid, 4);
    if (ftruncate(fd, 512 * 1024) == 0) {
        ssize_t written = pwrite(fd, start, sizeof start, 0);
        (void)written;
    }
    close(fd);
}
