/*
 * churn_hwm PAIRS [limit-at-exit]: makes PAIRS malloc/free pairs (sizes 16..527) with at
 * most 64 blocks live, so the program itself needs almost no memory, then
 * prints "hwm <VmHWM in bytes>" and "pairs <PAIRS>" and exits 0. A tracer
 * that buffers events without bound shows up in VmHWM. With
 * "limit-at-exit" it lowers its own RLIMIT_FSIZE to 4 KiB just before
 * returning, so whatever writes a file after main (an atexit handler) is
 * past the limit.
 */
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 1000000;
    void *ring[64] = {0};
    for (long i = 0; i < pairs; i++) {
        free(ring[i % 64]);
        ring[i % 64] = malloc(16 + (size_t)(i * 2654435761u % 512));
    }
    for (int i = 0; i < 64; i++) free(ring[i]);
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    long hwm_kib = -1;
    while (status != NULL && fgets(line, sizeof line, status) != NULL) {
        if (strncmp(line, "VmHWM:", 6) == 0) hwm_kib = atol(line + 6);
    }
    if (status != NULL) fclose(status);
    printf("hwm %ld\npairs %ld\n", hwm_kib * 1024, pairs);
    if (argc > 2 && strcmp(argv[2], "limit-at-exit") == 0) {
        fflush(stdout);
        struct rlimit limit = {4096, RLIM_INFINITY};
        setrlimit(RLIMIT_FSIZE, &limit);
    }
    return 0;
}
