/*
 * fork_heap: a child that frees what it inherited. The parent builds a heap
 * (mixed 24-3000-byte blocks, ~48 MiB), forks, and then frees all of its own
 * copy (so a reader that took the parent's later frees for the child's
 * would lose the child's blocks). The child frees all but every K-th
 * inherited block, allocates a little of its own, calls memgap_snapshot()
 * (found with dlsym, so it runs without memgap too), measures its Rss
 * (smaps_rollup, read without malloc) around its own malloc_trim(0), takes
 * another snapshot and prints "child PID", "live BYTES" (what it still
 * holds: the kept blocks, its own, the pointer array) and "trim BEFORE
 * AFTER".
 *
 *   main K      the heap is in the main arena
 *   thread K    a worker thread of the parent built it (a thread arena);
 *               the fork is from the main thread
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOTAL (48u << 20)

static void snapshot(void) {
    void (*take)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "memgap_snapshot");
    if (take) take();
}

static long rss_bytes(void) {
    char text[4096];
    int fd = open("/proc/self/smaps_rollup", O_RDONLY);
    if (fd < 0) return -1;
    ssize_t got = read(fd, text, sizeof text - 1);
    close(fd);
    if (got <= 0) return -1;
    text[got] = 0;
    char *rss = strstr(text, "\nRss:");
    return rss ? strtol(rss + 5, NULL, 10) * 1024 : -1;
}

static char **blocks;
static size_t *sizes;
static size_t count;

static void *build(void *arg) {
    (void)arg;
    unsigned long rng = 0x9e3779b97f4a7c15UL;
    size_t bytes = 0;
    while (bytes < TOTAL) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        size_t size = 24 + rng % 2977;
        blocks[count] = malloc(size);
        memset(blocks[count], 1, size);
        sizes[count++] = size;
        bytes += size;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: fork_heap main|thread K\n");
        return 2;
    }
    size_t keep_every = strtoul(argv[2], NULL, 10);
    if (keep_every == 0) keep_every = 1;
    size_t most = TOTAL / 24 + 1;
    blocks = malloc(most * sizeof *blocks);
    sizes = malloc(most * sizeof *sizes);
    if (strcmp(argv[1], "thread") == 0) {
        pthread_t worker;
        pthread_create(&worker, NULL, build, NULL);
        pthread_join(worker, NULL);
    } else {
        build(NULL);
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) return 1;
    if (child > 0) {
        for (size_t i = 0; i < count; i++) free(blocks[i]);
        int status = 0;
        waitpid(child, &status, 0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    size_t live = 2 * most * sizeof(char *);
    for (size_t i = 0; i < count; i++) {
        if (i % keep_every == 0) {
            live += sizes[i];
        } else {
            free(blocks[i]);
        }
    }
    char *own[64];
    for (int i = 0; i < 64; i++) {
        own[i] = malloc(1000);
        memset(own[i], 2, 1000);
        live += 1000;
    }
    printf("child %d\nlive %zu\n", (int)getpid(), live);
    fflush(stdout);
    snapshot();
    long before = rss_bytes();
    malloc_trim(0);
    long after = rss_bytes();
    snapshot();
    printf("trim %ld %ld\n", before, after);
    fflush(stdout);
    return own[0][0] == 2 ? 0 : 1;
}
