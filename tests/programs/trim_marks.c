/*
 * trim_marks: fills about 100 MiB of the main heap with 200-byte blocks,
 * frees all but one block in every 64 KiB (so the free space sits between
 * live blocks, where only malloc_trim gives it back, not the top of the
 * heap), then calls malloc_trim(0) once and idles a little so a snapshot
 * can follow. Prints its own VmRSS (kB) before and after the trim and what
 * malloc_trim returned: "before AFTER returned".
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 200
#define TOTAL (100L << 20)
#define COUNT (TOTAL / BLOCK)
/* One survivor per 64 KiB of blocks. */
#define KEEP_EVERY ((64 << 10) / BLOCK)

static long vm_rss_kb(void) {
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (status && fgets(line, sizeof line, status))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (status) fclose(status);
    return kb;
}

int main(void) {
    char **blocks = malloc(COUNT * sizeof *blocks);
    for (long i = 0; i < COUNT; i++) {
        blocks[i] = malloc(BLOCK);
        memset(blocks[i], 1, BLOCK);
    }
    for (long i = 0; i < COUNT; i++)
        if (i % KEEP_EVERY != 0 && i != COUNT - 1) free(blocks[i]);
    /* Let the writer take its snapshots of the full heap first. */
    usleep(300 * 1000);
    long before = vm_rss_kb();
    int returned = malloc_trim(0);
    long after = vm_rss_kb();
    printf("%ld %ld %d\n", before, after, returned);
    fflush(stdout);
    usleep(300 * 1000);
    return 0;
}
