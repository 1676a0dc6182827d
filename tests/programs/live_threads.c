/*
 * live_threads N: starts N threads (64 KiB stacks); each allocates one
 * block, then all wait at one barrier until every thread has allocated,
 * then free and end. N threads hold a block, and under memgap a buffer,
 * at the same time. Prints "threads N ok".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_barrier_t all_allocated;

static void *worker(void *arg) {
    void *volatile block = malloc(100 + (long)arg);
    pthread_barrier_wait(&all_allocated);
    free(block);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    pthread_t *threads = malloc(n * sizeof *threads);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 << 10);
    pthread_barrier_init(&all_allocated, NULL, n + 1);
    for (int i = 0; i < n; i++) {
        if (pthread_create(&threads[i], &attr, worker, (void *)(long)i) != 0) {
            printf("only %d threads\n", i);
            return 1;
        }
    }
    pthread_barrier_wait(&all_allocated);
    for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
    printf("threads %d ok\n", n);
    return 0;
}
