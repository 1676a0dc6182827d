/* big [allocations=200000] [live=16] [seed=1]
 * Large blocks of 64 KiB..4 MiB, `live` at a time, 2 bytes touched per block.
 * M_MMAP_THRESHOLD is pinned because glibc otherwise raises it after the first
 * free of an mmapped block; pinned, every block is a real mmap/munmap, so this
 * workload is dominated by the kernel and shows the profiler's cost on large blocks. */
#include <malloc.h>
#include <stdio.h>
#include "workload.h"

int main(int argc, char **argv) {
    long allocations = arg_or(argc, argv, 1, 200000);
    long live = arg_or(argc, argv, 2, 16);
    uint64_t rng = (uint64_t)arg_or(argc, argv, 3, 1);
    if (live < 1) live = 1;
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);

    unsigned char **blocks = calloc(live, sizeof *blocks);
    size_t *sizes = calloc(live, sizeof *sizes);
    uint64_t checksum = 0;
    for (long i = 0; i < allocations; i++) {
        long slot = i % live;
        if (blocks[slot]) {
            checksum = checksum * 31 + blocks[slot][0] + blocks[slot][sizes[slot] - 1];
            free(blocks[slot]);
        }
        sizes[slot] = random_between(&rng, 64 * 1024, 4 * 1024 * 1024);
        blocks[slot] = malloc(sizes[slot]);
        blocks[slot][0] = (unsigned char)i;
        blocks[slot][sizes[slot] - 1] = (unsigned char)(i >> 8);
    }
    for (long slot = 0; slot < live; slot++) {
        if (blocks[slot]) {
            checksum = checksum * 31 + blocks[slot][0] + blocks[slot][sizes[slot] - 1];
            free(blocks[slot]);
        }
    }
    free(sizes);
    free(blocks);
    printf("checksum %016llx\n", (unsigned long long)checksum);
    return 0;
}
