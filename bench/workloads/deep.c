/* deep [pairs=5000000] [depth=30] [live=100000] [paths=16] [seed=1]
 * churn where every malloc happens `depth` frames down two mutually recursive,
 * non-tail functions: this measures the cost of unwinding deep stacks.
 * Each descent performs 16 malloc/free pairs at the bottom. The first log2(paths)
 * levels pick one of two call sites, so there are exactly `paths` distinct stacks.
 * Keep paths small: heaptrack 1.4's interpreter blows up on many distinct stacks
 * (256 paths took it to 18 GiB; see the heaptrack baseline document). */
#include <stdio.h>
#include "workload.h"

enum { PAIRS_PER_DESCENT = 16 };

static unsigned char **slots;
static long live;
static uint64_t rng;

static __attribute__((noipa)) uint64_t churn_at_bottom(void) {
    uint64_t checksum = 0;
    for (int i = 0; i < PAIRS_PER_DESCENT; i++) {
        long slot = (long)(next_random(&rng) % (uint64_t)live);
        checksum = checksum * 31 + slots[slot][0];
        free(slots[slot]);
        slots[slot] = malloc(random_between(&rng, 16, 512));
        slots[slot][0] = (unsigned char)i;
    }
    return checksum;
}

static uint64_t descend_b(int depth, unsigned path);

/* The work after each call keeps the recursion non-tail (no sibling-call or
 * accumulator optimisation), and noipa keeps both functions as real frames. */
static __attribute__((noipa)) uint64_t descend_a(int depth, unsigned path) {
    if (depth <= 1) return churn_at_bottom();
    uint64_t result;
    if (path & 1) {
        result = descend_b(depth - 1, path >> 1);
        result = result * 3 + (uint64_t)depth;
    } else {
        result = descend_b(depth - 1, path >> 1);
        result = result ^ (result >> 7) ^ (uint64_t)depth;
    }
    return result;
}

static __attribute__((noipa)) uint64_t descend_b(int depth, unsigned path) {
    if (depth <= 1) return churn_at_bottom();
    uint64_t result;
    if (path & 1) {
        result = descend_a(depth - 1, path >> 1);
        result = result * 5 + (uint64_t)depth;
    } else {
        result = descend_a(depth - 1, path >> 1);
        result = result ^ (result >> 11) ^ (uint64_t)depth;
    }
    return result;
}

int main(int argc, char **argv) {
    long pairs = arg_or(argc, argv, 1, 5000000);
    int depth = (int)arg_or(argc, argv, 2, 30);
    live = arg_or(argc, argv, 3, 100000);
    unsigned paths = (unsigned)arg_or(argc, argv, 4, 16);
    rng = (uint64_t)arg_or(argc, argv, 5, 1);
    if (live < 1) live = 1;
    if (paths < 1) paths = 1;

    slots = malloc(live * sizeof *slots);
    for (long i = 0; i < live; i++) {
        slots[i] = malloc(random_between(&rng, 16, 512));
        slots[i][0] = (unsigned char)i;
    }
    uint64_t checksum = 0;
    for (long descent = 0; descent < pairs / PAIRS_PER_DESCENT; descent++)
        checksum = checksum * 31 + descend_a(depth, (unsigned)(descent % paths));
    for (long i = 0; i < live; i++) {
        checksum = checksum * 31 + slots[i][0];
        free(slots[i]);
    }
    free(slots);
    printf("checksum %016llx\n", (unsigned long long)checksum);
    return 0;
}
