/* numa_touch MIB: the main thread allocates MIB MiB in 256 KiB blocks and
 * two threads 4 MiB each, every byte written (first touch), all kept live
 * until exit. Prints a checksum so a changed run shows. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK (256 * 1024)

static void *worker(void *arg) {
    char **blocks = arg;
    for (int i = 0; i < 16; i++) {
        blocks[i] = malloc(BLOCK);
        memset(blocks[i], i + 1, BLOCK);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int mib = argc > 1 ? atoi(argv[1]) : 16;
    int count = mib * 4;
    char **mine = malloc(count * sizeof *mine);
    for (int i = 0; i < count; i++) {
        mine[i] = malloc(BLOCK);
        memset(mine[i], i, BLOCK);
    }
    char *theirs[2][16];
    pthread_t threads[2];
    for (int t = 0; t < 2; t++) pthread_create(&threads[t], NULL, worker, theirs[t]);
    for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
    long sum = 0;
    for (int i = 0; i < count; i++) sum += mine[i][BLOCK - 1];
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 16; i++) sum += theirs[t][i][7];
    printf("%ld\n", sum);
    return 0;
}
