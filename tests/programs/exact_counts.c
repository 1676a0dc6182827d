/*
 * exact_counts: a program whose heap events are known exactly.
 *
 *   malloc   1,000,000  (all malloc(32))
 *   calloc          10  (calloc(1, 16), kept live)
 *   realloc         10  (10 of the kept malloc blocks shrunk from 32 to 16 bytes)
 *   free       999,000  (all of them malloc'd blocks)
 *
 * Live at exit: 990 x 32 + 10 x 16 (realloc'd) + 10 x 16 (calloc'd) = 32,000 bytes
 * in 1,010 blocks.
 *
 * No stdio and no other libc call that allocates: the only output goes
 * through write(2), so every heap event in the trace is one of the above.
 * Compile with -fno-builtin so the compiler cannot elide malloc/free pairs.
 * Prints "exact_counts ok\n" and exits 0 when its own checks pass, 1 otherwise.
 *
 * `exact_counts idle` returns 0 at once without allocating: a baseline for
 * what the process's startup allocates (e.g. with another malloc preloaded).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_MALLOC 1000000
#define N_KEEP 1000
#define N_CALLOC 10
#define N_REALLOC 10
#define BLOCK 32
#define SMALL 16

/* Static, so the pointer table itself is not a heap allocation. */
static unsigned char *blocks[N_MALLOC];
static unsigned char *zeroed[N_CALLOC];

static void say(const char *text) {
    size_t len = strlen(text);
    while (len > 0) {
        ssize_t n = write(1, text, len);
        if (n <= 0) return;
        text += n;
        len -= (size_t)n;
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "idle") == 0) return 0;

    /* Allocate in batches and free most of each batch as we go, the way a
     * real program churns, so the heap never holds all 32 MB at once. */
    const int batch = 10000;
    const int keep_per_batch = N_KEEP / (N_MALLOC / batch); /* 10 */
    for (int start = 0; start < N_MALLOC; start += batch) {
        for (int i = start; i < start + batch; i++) {
            blocks[i] = malloc(BLOCK);
            if (blocks[i] == NULL) { say("malloc failed\n"); return 1; }
            blocks[i][0] = (unsigned char)i;
            blocks[i][BLOCK - 1] = (unsigned char)(i >> 8);
        }
        /* Keep the first keep_per_batch blocks of each batch; free the rest
         * in reverse order. */
        for (int i = start + batch - 1; i >= start + keep_per_batch; i--) {
            if (blocks[i][0] != (unsigned char)i) { say("heap corrupted\n"); return 1; }
            free(blocks[i]);
            blocks[i] = NULL;
        }
    }

    for (int i = 0; i < N_CALLOC; i++) {
        zeroed[i] = calloc(1, SMALL);
        if (zeroed[i] == NULL) { say("calloc failed\n"); return 1; }
        for (int j = 0; j < SMALL; j++)
            if (zeroed[i][j] != 0) { say("calloc not zeroed\n"); return 1; }
    }

    /* Shrink the first kept block of each of the first N_REALLOC batches. */
    for (int r = 0; r < N_REALLOC; r++) {
        int i = r * batch;
        unsigned char *p = realloc(blocks[i], SMALL);
        if (p == NULL) { say("realloc failed\n"); return 1; }
        if (p[0] != (unsigned char)i) { say("realloc lost data\n"); return 1; }
        blocks[i] = p;
    }

    /* free(NULL) is not an event; exercise it anyway. */
    free(NULL);

    long kept = 0;
    for (int i = 0; i < N_MALLOC; i++)
        if (blocks[i] != NULL) kept++;
    if (kept != N_KEEP) { say("wrong number of kept blocks\n"); return 1; }

    say("exact_counts ok\n");
    return 0;
}
