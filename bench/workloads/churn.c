/* churn [pairs=20000000] [live=100000] [seed=1]
 * Small-object churn: keep `live` blocks of 16..512 B and replace a random one
 * `pairs` times (one free + one malloc each). Every block is written once after
 * malloc and read once before free, so the allocator's work is not optimised away. */
#include <stdio.h>
#include "workload.h"

int main(int argc, char **argv) {
    long pairs = arg_or(argc, argv, 1, 20000000);
    long live = arg_or(argc, argv, 2, 100000);
    uint64_t rng = (uint64_t)arg_or(argc, argv, 3, 1);
    if (live < 1) live = 1;

    unsigned char **slots = malloc(live * sizeof *slots);
    uint64_t checksum = 0;
    for (long i = 0; i < live; i++) {
        slots[i] = malloc(random_between(&rng, 16, 512));
        slots[i][0] = (unsigned char)i;
    }
    for (long i = 0; i < pairs; i++) {
        long slot = (long)(next_random(&rng) % (uint64_t)live);
        checksum = checksum * 31 + slots[slot][0];
        free(slots[slot]);
        slots[slot] = malloc(random_between(&rng, 16, 512));
        slots[slot][0] = (unsigned char)i;
    }
    for (long i = 0; i < live; i++) {
        checksum = checksum * 31 + slots[i][0];
        free(slots[i]);
    }
    free(slots);
    printf("checksum %016llx\n", (unsigned long long)checksum);
    return 0;
}
