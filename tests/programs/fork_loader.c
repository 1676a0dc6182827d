/*
 * fork_loader FORKS: two threads walk the loaded modules with
 * dl_iterate_phdr over and over, each walk slow (its callback spins), so
 * nearly every instant one of them holds the loader's lock — which glibc's
 * fork does not reset in the child. Meanwhile the main thread forks FORKS
 * children one after the other. Each child makes 100 mallocs and 100 frees
 * from `child_work` and _exit(7)s without touching the loader, so the
 * program never waits on that lock itself; the parent prints
 * "forks N ok" when every child exited with 7, and exits 0.
 */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int stop;

static int slow_visit(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info;
    (void)size;
    for (volatile int i = 0; i < 20000; i++) (*(long *)data)++;
    return 0;
}

static void *walker(void *arg) {
    (void)arg;
    long visits = 0;
    while (!atomic_load(&stop)) dl_iterate_phdr(slow_visit, &visits);
    return NULL;
}

__attribute__((noinline)) static void child_work(void) {
    void *volatile blocks[100];
    for (int i = 0; i < 100; i++) blocks[i] = malloc(40 + i);
    for (int i = 0; i < 100; i++) free(blocks[i]);
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 50;
    pthread_t walkers[2];
    for (int i = 0; i < 2; i++) pthread_create(&walkers[i], NULL, walker, NULL);
    int ok = 0;
    for (int i = 0; i < forks; i++) {
        pid_t child = fork();
        if (child == 0) {
            child_work();
            _exit(7);
        }
        int status = 0;
        if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 7) ok++;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(walkers[i], NULL);
    printf("forks %d %s\n", forks, ok == forks ? "ok" : "FAILED");
    return ok == forks ? 0 : 1;
}
