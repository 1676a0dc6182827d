/* heldheap [mib=1024] [block=48] [keep_every=1] [writers=0]
 * Fills a heap of `mib` MiB with `block`-byte blocks, frees all but every
 * `keep_every`-th, prints "ready", then holds the heap until its standard
 * input closes: a big idle heap for timing `memgap snapshot PID` from
 * outside (bench/snapshot.sh). With `writers`, that many threads keep
 * replacing kept blocks meanwhile, so the heap changes under the walk. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include "workload.h"

static unsigned char **blocks;
static long kept, keep_every, block;
static volatile int stopping;

static void *writer(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    while (!stopping) {
        long slot = (long)(next_random(&rng) % (uint64_t)kept) * keep_every;
        unsigned char *fresh = malloc(block);
        fresh[0] = 1;
        unsigned char *old = __atomic_exchange_n(&blocks[slot], fresh, __ATOMIC_ACQ_REL);
        free(old);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long mib = arg_or(argc, argv, 1, 1024);
    block = arg_or(argc, argv, 2, 48);
    keep_every = arg_or(argc, argv, 3, 1);
    long writers = arg_or(argc, argv, 4, 0);
    if (block < 1) block = 1;
    if (keep_every < 1) keep_every = 1;
    long count = mib * 1024 * 1024 / (block + 8 > 32 ? block + 8 : 32);
    blocks = malloc(count * sizeof *blocks);
    for (long i = 0; i < count; i++) {
        blocks[i] = malloc(block);
        blocks[i][0] = (unsigned char)i;
    }
    for (long i = 0; i < count; i++)
        if (i % keep_every != 0) free(blocks[i]);
    kept = (count + keep_every - 1) / keep_every;
    pthread_t threads[64];
    if (writers > 64) writers = 64;
    for (long i = 0; i < writers; i++) pthread_create(&threads[i], NULL, writer, (void *)(uintptr_t)(i + 1));
    printf("ready %ld blocks\n", kept);
    fflush(stdout);
    char byte;
    while (read(0, &byte, 1) > 0) {}
    stopping = 1;
    for (long i = 0; i < writers; i++) pthread_join(threads[i], NULL);
    return 0;
}
