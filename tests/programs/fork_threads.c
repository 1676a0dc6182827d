/*
 * fork_threads FORKS: while 4 threads allocate and free in a loop, the main
 * thread forks FORKS children one after the other (whatever locks the
 * other threads held at that instant — the allocator's, the agent's —
 * must not deadlock the child), then starts FORKS more children with
 * vfork + exec and with posix_spawn (which run no atfork handler).
 *
 * Each fork child makes 1,000 malloc(40) and 1,000 free and _exit(7)s —
 * _exit: nothing of the parent's atexit runs in it. Each vfork child execs
 * `/bin/true`, each posix_spawn child `/bin/sh -c 'exit 3'`. The parent
 * checks every exit status and prints
 * "forks N ok, vforks N ok, spawns N ok"; exits 0 if all were as expected.
 */
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static atomic_int stop;

static void *churn(void *arg) {
    (void)arg;
    void *ring[64] = {0};
    for (unsigned long i = 0; !atomic_load(&stop); i++) {
        free(ring[i % 64]);
        ring[i % 64] = malloc(16 + i % 3000);
    }
    for (int i = 0; i < 64; i++) free(ring[i]);
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 20;
    pthread_t threads[4];
    for (int t = 0; t < 4; t++) pthread_create(&threads[t], NULL, churn, NULL);
    int forks_ok = 0, vforks_ok = 0, spawns_ok = 0;
    for (int i = 0; i < forks; i++) {
        pid_t child = fork();
        if (child == 0) {
            void *blocks[1000];
            for (int j = 0; j < 1000; j++) blocks[j] = malloc(40);
            for (int j = 0; j < 1000; j++) free(blocks[j]);
            _exit(7);
        }
        int status = 0;
        if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 7) forks_ok++;
    }
    for (int i = 0; i < forks; i++) {
        pid_t child = vfork();
        if (child == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        int status = 0;
        if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0) vforks_ok++;
    }
    for (int i = 0; i < forks; i++) {
        pid_t child;
        char *args[] = {"sh", "-c", "exit 3", NULL};
        if (posix_spawn(&child, "/bin/sh", NULL, NULL, args, environ) != 0) continue;
        int status = 0;
        if (waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 3) spawns_ok++;
    }
    atomic_store(&stop, 1);
    for (int t = 0; t < 4; t++) pthread_join(threads[t], NULL);
    printf("forks %d %s, vforks %d %s, spawns %d %s\n", forks, forks_ok == forks ? "ok" : "FAILED", forks,
           vforks_ok == forks ? "ok" : "FAILED", forks, spawns_ok == forks ? "ok" : "FAILED");
    return forks_ok == forks && vforks_ok == forks && spawns_ok == forks ? 0 : 1;
}
