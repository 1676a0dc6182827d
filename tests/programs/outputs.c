/*
 * outputs: writes known text to stdout and stderr, allocates, exits 3.
 *
 * Uses stdio on purpose (stdio allocates its own buffers) and mixes
 * buffered stdio with raw write(2), long lines, a line without a final
 * newline on stderr and non-ASCII bytes, so a test can compare what it
 * prints with and without memgap byte for byte.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    printf("outputs: %d argument(s)\n", argc - 1);
    for (int i = 1; i < argc; i++) printf("arg %d: %s\n", i, argv[i]);

    unsigned long sum = 0;
    char **lines = calloc(100, sizeof *lines);
    if (lines == NULL) return 1;
    for (int i = 0; i < 100; i++) {
        size_t len = 10 + (size_t)i * 37;
        lines[i] = malloc(len + 1);
        if (lines[i] == NULL) return 1;
        memset(lines[i], 'a' + i % 26, len);
        lines[i][len] = '\0';
        sum += len;
    }
    lines[7] = realloc(lines[7], 5000);
    if (lines[7] == NULL) return 1;
    printf("%s\n", lines[99]);
    printf("sum of lengths: %lu\n", sum);
    printf("caf\xc3\xa9 \xe2\x9c\x93 tab\there\n");
    fflush(stdout);

    static const char raw[] = "raw write to stdout\n";
    if (write(1, raw, sizeof raw - 1) < 0) return 1;

    fprintf(stderr, "warning: this goes to stderr\n");
    fprintf(stderr, "second stderr line, %d blocks\n", 100);
    fprintf(stderr, "no newline at the end");

    for (int i = 0; i < 100; i += 2) free(lines[i]);
    printf("done\n");
    return 3;
}
