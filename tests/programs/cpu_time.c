/* Spends a known CPU time, allocating as it goes, in itself and in a child
 * it waits for, so a measure of the program's CPU time has a floor to be
 * checked against.
 *
 * cpu_time MS
 *
 * Forks; parent and child each allocate and free until their own CPU
 * clock (CLOCK_PROCESS_CPUTIME_ID) reaches MS milliseconds; the parent
 * waits for the child and prints "cpu_time ok".
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double own_cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void spend(double ms) {
    volatile unsigned long sink = 0;
    while (own_cpu_ms() < ms) {
        for (int i = 0; i < 1000; i++) {
            char *block = malloc(16 + i % 200);
            block[0] = (char)i;
            sink += (unsigned char)block[0];
            free(block);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: cpu_time MS\n");
        return 2;
    }
    double ms = atof(argv[1]);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    spend(ms);
    if (child == 0) _exit(0);
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "cpu_time: the child failed\n");
        return 1;
    }
    printf("cpu_time ok\n");
    return 0;
}
