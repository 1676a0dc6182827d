/* Holds 64 MiB in 16,384 blocks of 4 KiB, sleeps, frees fifteen blocks in
 * sixteen at once, sleeps again and exits. Prints when the frees began and
 * ended (seconds since main began, CLOCK_MONOTONIC) and the bytes it held
 * before and after, so a test can find the live heap's fall in time. With
 * "refill", it then allocates as much again before it exits, so that the
 * plateau after the frees is over by the exit.
 * Usage: frees_at [HOLD_MS [AFTER_MS [refill]]] (default 400 and 1200). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}

int main(int argc, char **argv) {
    double start = now();
    long hold_ms = argc > 1 ? atol(argv[1]) : 400;
    long after_ms = argc > 2 ? atol(argv[2]) : 1200;
    const size_t count = 16384, size = 4096;
    char **blocks = malloc(count * sizeof *blocks);
    if (!blocks) return 1;
    for (size_t i = 0; i < count; i++) {
        blocks[i] = malloc(size);
        if (!blocks[i]) return 1;
        memset(blocks[i], (int)i, size);
    }
    sleep_ms(hold_ms);
    double free_begin = now() - start;
    size_t kept = 0;
    for (size_t i = 0; i < count; i++) {
        if (i % 16 == 0) {
            kept += size;
        } else {
            free(blocks[i]);
            blocks[i] = NULL;
        }
    }
    double free_end = now() - start;
    printf("held %zu\nkept %zu\nfree_begin %.6f\nfree_end %.6f\n", count * size, kept, free_begin, free_end);
    fflush(stdout);
    sleep_ms(after_ms);
    if (argc > 3 && strcmp(argv[3], "refill") == 0) {
        for (size_t i = 0; i < count; i++) {
            if (!blocks[i]) {
                blocks[i] = malloc(size);
                if (!blocks[i]) return 1;
                memset(blocks[i], (int)i, size);
            }
        }
        printf("refilled %.6f\n", now() - start);
    }
    return blocks[0][0] == 0 ? 0 : 2;
}
