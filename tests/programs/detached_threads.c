/* detached_threads N: N detached threads with 16 MiB stacks, alive together
 * (each allocates and frees one block, then waits at a barrier), then all
 * exit. glibc keeps 40 MiB of exited threads' stacks for reuse; as each
 * detached thread exits it frees the thread-local storage of the cached
 * stacks past that, from its own exit path, after every key destructor has
 * run. main waits until all have exited, then prints "detached N ok". */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_barrier_t all_started;
static atomic_int finished;

static void *work(void *arg) {
    char *volatile block = malloc(100);
    block[0] = 1;
    free(block);
    pthread_barrier_wait(&all_started);
    atomic_fetch_add(&finished, 1);
    return arg;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    pthread_barrier_init(&all_started, NULL, (unsigned)n);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 16 << 20);
    for (int i = 0; i < n; i++) {
        pthread_t thread;
        if (pthread_create(&thread, &attr, work, NULL) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    while (atomic_load(&finished) < n)
        usleep(1000);
    /* A thread counted itself before its exit path: let the last ones end. */
    usleep(100 * 1000);
    printf("detached %d ok\n", n);
    return 0;
}
