/* A long-running process under a preloaded mimalloc, with what mimalloc
 * itself says it has committed: the figure `memgap snapshot PID` must read
 * from outside.
 *
 * mimalloc_commit MIB COUNTER_FILE [SECONDS]
 *
 * Two threads each allocate MIB MiB of blocks from 16 bytes to 64 KiB and
 * free two of every three; the main thread also allocates one 40 MiB block
 * (a segment of its own) and touches half of it. Then it asks mimalloc's
 * own mi_process_info (found with dlsym: mimalloc is preloaded) and prints
 * "committed BYTES" and "peak_committed BYTES", and idles: the main thread
 * writes a counter to COUNTER_FILE every 10 ms, without allocating. It runs
 * until killed, or for SECONDS and then exits holding its blocks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void process_info_fn(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *);

static size_t bytes_per_thread;

static void *churn(void *arg) {
    unsigned seed = (unsigned)(size_t)arg;
    size_t count = bytes_per_thread / 4096 + 1;
    char **blocks = malloc(count * sizeof *blocks);
    for (size_t i = 0; i < count; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = 16u << ((seed >> 8) % 13);
        blocks[i] = malloc(size);
        memset(blocks[i], 1, size);
    }
    for (size_t i = 0; i < count; i++)
        if (i % 3 != 0)
            free(blocks[i]);
    return blocks;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: mimalloc_commit MIB COUNTER_FILE [SECONDS]\n");
        return 2;
    }
    process_info_fn *process_info = (process_info_fn *)dlsym(RTLD_DEFAULT, "mi_process_info");
    if (!process_info) {
        fprintf(stderr, "mimalloc is not loaded (no mi_process_info)\n");
        return 3;
    }
    bytes_per_thread = (size_t)atoi(argv[1]) << 20;
    pthread_t other;
    pthread_create(&other, NULL, churn, (void *)7);
    void *mine = churn((void *)3);
    void *theirs;
    pthread_join(other, &theirs);
    size_t big_size = 40u << 20;
    char *big = malloc(big_size);
    memset(big, 1, big_size / 2);
    size_t committed = 0, peak = 0;
    process_info(NULL, NULL, NULL, NULL, NULL, &committed, &peak, NULL);
    printf("committed %zu\npeak_committed %zu\n", committed, peak);
    fflush(stdout);
    unsigned long ticks = argc == 4 ? (unsigned long)(atof(argv[3]) * 100) : 0;
    for (unsigned long n = 0; ticks == 0 || n < ticks; n++) {
        FILE *f = fopen(argv[2], "w");
        if (f) {
            fprintf(f, "%lu\n", n);
            fclose(f);
        }
        usleep(10000);
    }
    return big[0] == 1 && mine != theirs ? 0 : 1;
}
