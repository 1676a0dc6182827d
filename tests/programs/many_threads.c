/*
 * many_threads THREADS PER_THREAD ROUNDS: ROUNDS times, starts THREADS
 * threads at once; each makes PER_THREAD malloc(24 + i % 200) calls and
 * frees all but its last block, then exits at once — with its last events
 * still in its buffer, for the agent's thread-exit path to flush. The
 * blocks left are freed by the main thread after the join (a free from
 * another thread than the one that allocated).
 *
 * Events made by the test's own loop: THREADS * ROUNDS * PER_THREAD
 * malloc and as many free; everything else (pthread_create's own
 * allocations) is the same with PER_THREAD = 0, so the tests subtract a
 * run with PER_THREAD = 0. Prints "done"; exits 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long per_thread;

static void *work(void *arg) {
    (void)arg;
    void *previous = NULL;
    for (long i = 0; i < per_thread; i++) {
        void *block = malloc(24 + (size_t)(i % 200));
        if (block == NULL) abort();
        memset(block, 1, 24);
        free(previous);
        previous = block;
    }
    return previous;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: many_threads THREADS PER_THREAD ROUNDS\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    per_thread = atol(argv[2]);
    int rounds = atoi(argv[3]);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    for (int round = 0; round < rounds; round++) {
        for (int t = 0; t < threads; t++) {
            if (pthread_create(&ids[t], NULL, work, NULL) != 0) {
                fprintf(stderr, "pthread_create failed\n");
                return 1;
            }
        }
        for (int t = 0; t < threads; t++) {
            void *last;
            pthread_join(ids[t], &last);
            free(last);
        }
    }
    free(ids);
    printf("done\n");
    return 0;
}
