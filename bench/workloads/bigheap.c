/* bigheap [mib=1024] [keep_every=4]
 * Fills a heap of `mib` MiB with 256-byte blocks, then frees all but every
 * `keep_every`-th: a 1 GiB heap of mostly-empty pages, for timing
 * `memgap report` on a big page map (bench/report.sh). */
#include <stdio.h>
#include "workload.h"

int main(int argc, char **argv) {
    long mib = arg_or(argc, argv, 1, 1024);
    long keep_every = arg_or(argc, argv, 2, 4);
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
    printf("checksum %016llx\n", (unsigned long long)checksum);
    return 0;
}
