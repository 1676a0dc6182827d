/* measure RESULT_FILE CMD [ARGS...]
 * Runs CMD, waits for it and writes one line to RESULT_FILE:
 *   exit_code wall_seconds user_seconds sys_seconds peak_rss_kib
 * exit_code is 128+N when CMD dies of signal N, as in the shell; measure exits with it too.
 * CPU time and peak RSS come from wait4(), so they include every descendant CMD waited for
 * (heaptrack's interpreter and zstd, for example); peak RSS is that of the largest process.
 *
 * Why a C launcher rather than os.wait4 in run.py: Linux folds the forking process's RSS
 * high-water mark into the child's ru_maxrss at exec, so a child of the Python harness can
 * never report less than ~14 MiB. Forked from this ~1 MiB process, small programs (big:
 * ~1.5 MiB) and small in-process overheads stay visible. */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double seconds(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: measure RESULT_FILE CMD [ARGS...]\n");
        return 2;
    }
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    pid_t child = fork();
    if (child == 0) {
        execvp(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    int status = 0;
    struct rusage usage;
    if (child < 0 || wait4(child, &status, 0, &usage) < 0) {
        perror("measure");
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    FILE *result = fopen(argv[1], "w");
    if (!result) {
        perror(argv[1]);
        return 2;
    }
    fprintf(result, "%d %.6f %.6f %.6f %ld\n", exit_code,
            (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9,
            seconds(usage.ru_utime), seconds(usage.ru_stime), usage.ru_maxrss);
    fclose(result);
    return exit_code;
}
