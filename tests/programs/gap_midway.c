/*
 * gap_midway: a program whose largest gap between RSS and the live heap is
 * neither at its RSS peak nor at its end. Under glibc:
 *
 *   1. peak:   48 MiB of 1 KiB blocks and one 48 MiB block (its own mmap),
 *              all live and touched: RSS ~96 MiB, gap small;
 *   2. gap:    the 48 MiB block freed (unmapped) and 7 of every 8 small
 *              blocks freed: RSS ~48 MiB, live ~6 MiB, gap ~42 MiB;
 *   3. end:    every block freed and malloc_trim(0): RSS and gap small.
 *
 * It asks memgap for a snapshot at the end of each phase (memgap_snapshot,
 * looked up with dlsym: nothing when run without memgap) and prints one
 * line per phase with its time since start, then "gap_midway ok".
 */
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SMALL_BYTES (48u << 20)
#define SMALL_SIZE 1024u
#define SMALL_COUNT (SMALL_BYTES / SMALL_SIZE)
#define LARGE_BYTES (48u << 20)

static struct timespec start;

static double elapsed(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - start.tv_sec) + (t.tv_nsec - start.tv_nsec) / 1e9;
}

static void pause_ms(long ms) {
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&t, NULL);
}

static void phase(const char *name) {
    static void (*snapshot)(void);
    static int looked_up;
    if (!looked_up) {
        snapshot = (void (*)(void))dlsym(RTLD_DEFAULT, "memgap_snapshot");
        looked_up = 1;
    }
    pause_ms(50);
    if (snapshot) snapshot();
    printf("%s at %.3f s\n", name, elapsed());
    fflush(stdout);
    pause_ms(150);
}

int main(void) {
    clock_gettime(CLOCK_MONOTONIC, &start);
    char **small = malloc(SMALL_COUNT * sizeof *small);
    if (small == NULL) return 1;
    for (size_t i = 0; i < SMALL_COUNT; i++) {
        small[i] = malloc(SMALL_SIZE);
        if (small[i] == NULL) return 1;
        memset(small[i], 1, SMALL_SIZE);
    }
    char *large = malloc(LARGE_BYTES);
    if (large == NULL) return 1;
    memset(large, 2, LARGE_BYTES);
    phase("peak");

    free(large);
    for (size_t i = 0; i < SMALL_COUNT; i++) {
        if (i % 8 != 0) {
            free(small[i]);
            small[i] = NULL;
        }
    }
    phase("gap");

    for (size_t i = 0; i < SMALL_COUNT; i += 8) free(small[i]);
    free(small);
    malloc_trim(0);
    phase("end");
    puts("gap_midway ok");
    return 0;
}
