// Leaves free memory in the allocator in a known shape, then holds still
// so RSS can be measured from outside (and by memgap's exit snapshot).
//
// usage: owners_churn MODE MIB SECONDS
//   main:    the main thread allocates MIB of 1000-byte blocks, writes
//            them, and frees all but one in 512 (the last one survives,
//            so no free() shrinks the heap's top)
//   threads: four threads do the same with MIB/4 each, in their arenas
// then it sleeps SECONDS and exits.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 1000
#define KEEP_ONE_IN 512

static size_t blocks_per_worker;
static void **survivors[4];

static void *churn(void *arg) {
    size_t worker = (size_t)arg;
    void **all = malloc(blocks_per_worker * sizeof *all);
    survivors[worker] = malloc((blocks_per_worker / KEEP_ONE_IN + 1) * sizeof(void *));
    for (size_t i = 0; i < blocks_per_worker; i++) {
        all[i] = malloc(BLOCK);
        memset(all[i], (int)i, BLOCK);
    }
    size_t kept = 0;
    for (size_t i = 0; i < blocks_per_worker; i++) {
        if (i % KEEP_ONE_IN == KEEP_ONE_IN - 1) {
            survivors[worker][kept++] = all[i];
        } else {
            free(all[i]);
        }
    }
    free(all);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s main|threads MIB SECONDS\n", argv[0]);
        return 2;
    }
    size_t bytes = strtoul(argv[2], NULL, 10) << 20;
    double seconds = atof(argv[3]);
    if (strcmp(argv[1], "threads") == 0) {
        blocks_per_worker = bytes / 4 / BLOCK / KEEP_ONE_IN * KEEP_ONE_IN;
        pthread_t threads[4];
        for (size_t t = 0; t < 4; t++) pthread_create(&threads[t], NULL, churn, (void *)t);
        for (size_t t = 0; t < 4; t++) pthread_join(threads[t], NULL);
    } else {
        blocks_per_worker = bytes / BLOCK / KEEP_ONE_IN * KEEP_ONE_IN;
        churn((void *)0);
    }
    usleep((useconds_t)(seconds * 1e6));
    printf("done\n");
    return 0;
}
