/*
 * holds_live [MB] [MS]: a program no allocator remedy can help. It allocates
 * MB (default 32) MiB in 4 KiB blocks, touches them, keeps every one live for
 * MS (default 300) milliseconds, prints "holds_live <checksum>" and exits
 * without freeing: no free memory for malloc_trim to return, one thread so
 * one arena. For `memgap compare`, whose recommendation must then say
 * "within noise".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], NULL, 10) : 32;
    long ms = argc > 2 ? strtol(argv[2], NULL, 10) : 300;
    size_t blocks = mb * 256;
    char **kept = malloc(blocks * sizeof *kept);
    if (kept == NULL) return 1;
    unsigned long checksum = 0;
    for (size_t i = 0; i < blocks; i++) {
        kept[i] = malloc(4096);
        if (kept[i] == NULL) return 1;
        memset(kept[i], (int)(i & 0xff), 4096);
        checksum += (unsigned char)kept[i][i % 4096];
    }
    struct timespec pause = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&pause, NULL);
    printf("holds_live %lu\n", checksum);
    return 0;
}
