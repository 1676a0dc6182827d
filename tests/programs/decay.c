/*
 * decay [HOLD_MS] [TOTAL_MS]: a burst that an allocator with delayed
 * purging (jemalloc's dirty_decay_ms) keeps resident after it is freed.
 * It allocates 64 MiB in blocks of 256..4351 bytes, keeps them until HOLD_MS
 * (default 800) ms after start, frees them all, then until TOTAL_MS (default
 * 1600) allocates and frees 32 blocks of 100 KiB every 2 ms: without a
 * background thread jemalloc purges only when the program calls into it
 * (a tick per call that reaches an arena: large blocks do, small ones mostly
 * stay in the thread cache). Prints "decay ok" and exits 0.
 *
 * Under glibc the freed blocks coalesce into the top of the heap and free()
 * hands it back at once; under jemalloc the pages stay resident until their
 * decay time passes, so RSS drops late in the run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BURST_BYTES (64u << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double hold = (argc > 1 ? atof(argv[1]) : 800) / 1000;
    double total = (argc > 2 ? atof(argv[2]) : 1600) / 1000;
    double start = now();
    size_t count = 0, bytes = 0, capacity = BURST_BYTES / 256;
    char **blocks = malloc(capacity * sizeof *blocks);
    if (blocks == NULL) return 1;
    while (bytes < BURST_BYTES && count < capacity) {
        size_t size = 256 + (count * 2654435761u) % 4096;
        char *block = malloc(size);
        if (block == NULL) return 1;
        memset(block, 1, size);
        blocks[count++] = block;
        bytes += size;
    }
    struct timespec tick = { 0, 2000000L };
    while (now() - start < hold) nanosleep(&tick, NULL);
    for (size_t i = 0; i < count; i++) free(blocks[i]);
    while (now() - start < total) {
        for (int i = 0; i < 32; i++) {
            char *large = malloc(100 << 10);
            if (large == NULL) return 1;
            large[0] = 1;
            free(large);
        }
        nanosleep(&tick, NULL);
    }
    puts("decay ok");
    return 0;
}
