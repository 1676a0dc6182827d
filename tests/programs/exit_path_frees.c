/* exit_path_frees N: N detached threads with 16 MiB stacks, alive together,
 * whose exit paths free memory after every key destructor has run:
 * - each leaves a dlerror message (a failed dlopen), which glibc frees as
 *   the thread ends;
 * - glibc keeps 40 MiB of exited threads' stacks for reuse, and as each
 *   detached thread exits it frees the thread-local storage of the cached
 *   stacks past that.
 * Each thread also allocates and frees one block. main waits until all
 * have exited, then prints "exit paths N ok". */
#include <dlfcn.h>
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
    if (dlopen("libmemgap-test-absent.so", RTLD_NOW) != NULL)
        abort();
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
    printf("exit paths %d ok\n", n);
    return 0;
}
