/* exit_path_frees N [WAVES]: WAVES waves (default 1) of N detached threads
 * with 16 MiB stacks, whose exit paths free memory after every key
 * destructor has run:
 * - each leaves a dlerror message (a failed dlopen), which glibc frees as
 *   the thread ends;
 * - glibc keeps 40 MiB of exited threads' stacks for reuse, and as each
 *   detached thread exits it frees the thread-local storage of the cached
 *   stacks past that.
 * Each thread also allocates and frees 50 blocks. One wave's threads wait
 * for each other before they exit, so that all N are alive together. Waves
 * do not wait: new threads start while others exit (their buffers change
 * hands), and main allocates and frees between waves, so freed addresses
 * are reused at once. main waits until all have exited, then prints
 * "exit paths N ok". */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_int finished;

static void *work(void *all_started) {
    for (int i = 0; i < 50; i++) {
        char *volatile block = malloc(64 + 8 * i);
        block[0] = 1;
        free(block);
    }
    if (dlopen("libmemgap-test-absent.so", RTLD_NOW) != NULL)
        abort();
    if (all_started != NULL)
        pthread_barrier_wait(all_started);
    atomic_fetch_add(&finished, 1);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    int waves = argc > 2 ? atoi(argv[2]) : 1;
    pthread_barrier_t all_started;
    pthread_barrier_init(&all_started, NULL, (unsigned)n);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 16 << 20);
    for (int wave = 0; wave < waves; wave++) {
        for (int i = 0; i < n; i++) {
            pthread_t thread;
            if (pthread_create(&thread, &attr, work, waves == 1 ? &all_started : NULL) != 0) {
                perror("pthread_create");
                return 1;
            }
        }
        for (int i = 0; i < 200; i++) {
            char *volatile block = malloc(64 + i);
            block[0] = 1;
            free(block);
        }
    }
    while (atomic_load(&finished) < n * waves)
        usleep(1000);
    /* A thread counted itself before its exit path: let the last ones end. */
    usleep(100 * 1000);
    printf("exit paths %d ok\n", n);
    return 0;
}
