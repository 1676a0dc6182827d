/* bigheap [mib=1024] [keep_every=4] [churn_pairs=0]
 * Fills a heap of `mib` MiB with 256-byte blocks, then frees all but every
 * `keep_every`-th: a 1 GiB heap of mostly-empty pages, for timing
 * `memgap report` on a big page map (bench/report.sh). With `churn_pairs`,
 * then replaces that many kept blocks, one at a time, by new blocks of the
 * same size: tens of millions of events over the same big heap. */
#include <stdio.h>
#include "workload.h"

int main(int argc, char **argv) {
    long mib = arg_or(argc, argv, 1, 1024);
    long keep_every = arg_or(argc, argv, 2, 4);
    long churn_pairs = arg_or(argc, argv, 3, 0);
    long count = mib * 1024 * 1024 / 256;
    if (keep_every < 1) keep_every = 1;
    unsigned char **blocks = malloc(count * sizeof *blocks);
    for (long i = 0; i < count; i++) {
        blocks[i] = malloc(248);
        blocks[i][0] = (unsigned char)i;
    }
    uint64_t checksum = 0;
    for (long i = 0; i < count; i++) {
        checksum = checksum * 31 + blocks[i][0];
        if (i % keep_every != 0) free(blocks[i]);
    }
    uint64_t rng = 42;
    long kept = (count + keep_every - 1) / keep_every;
    for (long i = 0; i < churn_pairs && kept > 0; i++) {
        long slot = (long)(next_random(&rng) % (uint64_t)kept) * keep_every;
        checksum = checksum * 31 + blocks[slot][0];
        free(blocks[slot]);
        blocks[slot] = malloc(248);
        blocks[slot][0] = (unsigned char)i;
    }
    printf("checksum %016llx\n", (unsigned long long)checksum);
    return 0;
}
