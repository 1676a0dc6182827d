/*
 * watch_stages: a heap that changes in stages, one per line read on stdin,
 * for `memgap watch`. It prints "pid PID", then "stage N" once each stage
 * is done, and idles until the next line; it exits when stdin closes.
 *
 *   stage 1   12,000 blocks of 1-4 KiB (about 30 MiB), written to, then a
 *             small block above them that keeps the heap's top where it is
 *   stage 2   three blocks of four freed: the heap is fragmented
 *   stage 3   the rest freed: the free pages below the pin stay resident
 *             (retained) until malloc_trim(0) returns them
 *   stage 4   30 MiB more, which only RSS thresholds care about
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCKS 12000

static char *blocks[BLOCKS];
static char *more[BLOCKS];

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("pid %d\n", getpid());
    char line[64];
    int stage = 0;
    while (fgets(line, sizeof line, stdin)) {
        stage++;
        if (stage == 1) {
            for (int i = 0; i < BLOCKS; i++) {
                size_t size = 1024 + (size_t)(i * 37 % 3072);
                blocks[i] = malloc(size);
                memset(blocks[i], 1, size);
            }
            char *pin = malloc(64);
            memset(pin, 2, 64);
        } else if (stage == 2) {
            for (int i = 0; i < BLOCKS; i++)
                if (i % 4) {
                    free(blocks[i]);
                    blocks[i] = NULL;
                }
        } else if (stage == 3) {
            for (int i = 0; i < BLOCKS; i++) {
                free(blocks[i]);
                blocks[i] = NULL;
            }
        } else if (stage == 4) {
            for (int i = 0; i < BLOCKS; i++) {
                size_t size = 1024 + (size_t)(i * 37 % 3072);
                more[i] = malloc(size);
                memset(more[i], 3, size);
            }
        }
        printf("stage %d\n", stage);
    }
    return 0;
}
