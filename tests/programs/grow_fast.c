/* grow_fast [MiB=1024] [MiB per second=1024]: mallocs 1 MiB blocks and
 * writes every page, at the given rate, then frees them all. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long total = argc > 1 ? atol(argv[1]) : 1024;
    double rate = argc > 2 ? atof(argv[2]) : 1024;
    char **blocks = calloc(total, sizeof *blocks);
    double start = now();
    for (long i = 0; i < total; i++) {
        blocks[i] = malloc(1 << 20);
        memset(blocks[i], (int)i, 1 << 20);
        double due = start + (i + 1) / rate;
        while (now() < due) {}
    }
    for (long i = 0; i < total; i++) free(blocks[i]);
    free(blocks);
    printf("grew %ld MiB in %.2f s\n", total, now() - start);
    return 0;
}
