/*
 * unannounced_fork ROUNDS: each round the parent allocates 1,000 blocks,
 * forks with _Fork (glibc 2.34+), which runs no atfork handler, and frees
 * them once the child is gone. The child frees the inherited blocks,
 * allocates 1,000 of its own and _exit(3)s. The child shares nothing with
 * its parent after the fork, but an agent that only learns of forks from
 * atfork handlers still holds the parent's buffers there. Prints
 * "rounds N ok" when every child exited with 3.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern pid_t _Fork(void);

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    void *volatile blocks[1000];
    int ok = 0;
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < 1000; i++) blocks[i] = malloc(32 + i);
        pid_t child = _Fork();
        if (child == 0) {
            for (int i = 0; i < 1000; i++) free(blocks[i]);
            for (int i = 0; i < 1000; i++) blocks[i] = malloc(4000);
            _exit(3);
        }
        int status = 0;
        if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 3) ok++;
        for (int i = 0; i < 1000; i++) free(blocks[i]);
    }
    printf("rounds %d %s\n", rounds, ok == rounds ? "ok" : "FAILED");
    return ok == rounds ? 0 : 1;
}
