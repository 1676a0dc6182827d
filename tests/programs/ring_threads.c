/* ring_threads THREADS ITERATIONS
 * THREADS threads share one ring of 4096 slots: each allocates a block of a
 * varying size, swaps it into a slot chosen at random, and frees the block it
 * took out, most often one another thread allocated. With far more threads
 * than cores, every address passes through many threads between two of the
 * writer's rounds. Prints "mallocs M frees F live L" (the ring's blocks). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define SLOTS 4096
#define MAX_THREADS 256

static _Atomic(void *) ring[SLOTS];
static long iterations;
static atomic_long mallocs, frees;

static void *work(void *arg) {
    unsigned seed = (unsigned)(long)arg * 2654435761u + 1;
    for (long i = 0; i < iterations; i++) {
        seed = seed * 1103515245u + 12345u;
        void *block = malloc(16 + (seed >> 16) % 200);
        atomic_fetch_add(&mallocs, 1);
        void *old = atomic_exchange(&ring[(seed >> 8) % SLOTS], block);
        if (old) {
            free(old);
            atomic_fetch_add(&frees, 1);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 64;
    iterations = argc > 2 ? atol(argv[2]) : 10000;
    if (threads < 1 || threads > MAX_THREADS) return 2;
    pthread_t t[MAX_THREADS];
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    long live = 0;
    for (int i = 0; i < SLOTS; i++) live += ring[i] != NULL;
    printf("mallocs %ld frees %ld live %ld\n", (long)mallocs, (long)frees, live);
    return 0;
}
