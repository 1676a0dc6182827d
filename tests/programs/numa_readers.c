/* numa_readers MIB ROUNDS: the main thread, pinned to CPU 0, allocates MIB
 * MiB in 1 MiB blocks and writes every byte (so first touch puts the pages
 * on CPU 0's node); then one reader thread per online CPU, each pinned to
 * its CPU, reads all of it ROUNDS times. The paper's pattern: an unpinned
 * main thread's allocations make one node take the accesses of every node.
 * Prints a checksum so a changed run shows. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK (1024 * 1024)

static char **blocks;
static int count, rounds;

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "numa_readers: cannot pin to CPU %d\n", cpu);
        exit(2);
    }
}

static void *reader(void *arg) {
    pin((int)(long)arg);
    long sum = 0;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < count; i++)
            for (int j = 0; j < BLOCK; j += 64) sum += ((volatile char *)blocks[i])[j];
    return (void *)sum;
}

int main(int argc, char **argv) {
    count = argc > 1 ? atoi(argv[1]) : 16;
    rounds = argc > 2 ? atoi(argv[2]) : 4;
    pin(0);
    blocks = malloc(count * sizeof *blocks);
    for (int i = 0; i < count; i++) {
        blocks[i] = malloc(BLOCK);
        memset(blocks[i], i + 1, BLOCK);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1) cpus = 1;
    pthread_t threads[cpus];
    for (long c = 0; c < cpus; c++) pthread_create(&threads[c], NULL, reader, (void *)c);
    long total = 0;
    for (long c = 0; c < cpus; c++) {
        void *sum;
        pthread_join(threads[c], &sum);
        total += (long)sum;
    }
    printf("%ld\n", total / cpus);
    return 0;
}
