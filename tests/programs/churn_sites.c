/*
 * churn_sites [BLOCKS]: three allocation sites whose totals the program knows.
 *   churn_block  allocates BLOCKS blocks (default 20,000) of 512..4,607 bytes,
 *                tens of MiB in all, and frees each right away
 *   slow_block   allocates 16 blocks of 1,000 bytes, keeps them 300 ms, frees them
 *   hold_block   allocates 64 blocks of 8,000 bytes and keeps them to the end
 * Prints "<site> <allocations> <bytes>" for each. Built with -O0 so the
 * malloc/free pairs stay and each site keeps its own frame.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *held[64];

static size_t churn_block(long blocks) {
    size_t total = 0;
    for (long i = 0; i < blocks; i++) {
        size_t size = 512 + (size_t)(i * 2654435761u % 4096);
        char *block = malloc(size); /* CHURN_SITE */
        memset(block, 1, size);
        total += size;
        free(block);
    }
    return total;
}

static size_t slow_block(void) {
    void *blocks[16];
    for (int i = 0; i < 16; i++) {
        blocks[i] = malloc(1000); /* SLOW_SITE */
        memset(blocks[i], 2, 1000);
    }
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    for (int i = 0; i < 16; i++) free(blocks[i]);
    return 16 * 1000;
}

static size_t hold_block(void) {
    for (int i = 0; i < 64; i++) {
        held[i] = malloc(8000); /* HOLD_SITE */
        memset(held[i], 3, 8000);
    }
    return 64 * 8000;
}

int main(int argc, char **argv) {
    long blocks = argc > 1 ? atol(argv[1]) : 20000;
    size_t held_bytes = hold_block();
    size_t slow_bytes = slow_block();
    size_t churn_bytes = churn_block(blocks);
    printf("churn_block %ld %zu\nslow_block 16 %zu\nhold_block 64 %zu\n", blocks, churn_bytes, slow_bytes, held_bytes);
    return 0;
}
