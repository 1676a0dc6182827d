/*
 * address_limit MIB: allocates and touches 1 MiB blocks until malloc
 * fails or MIB are held, and prints "held N MiB". Run under an
 * address-space limit (ulimit -v), N is what the limit left the program.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    long most = argc > 1 ? atol(argv[1]) : 100;
    long held = 0;
    while (held < most) {
        char *block = malloc(1 << 20);
        if (!block) break;
        memset(block, 1, 1 << 20);
        held++;
    }
    printf("held %ld MiB\n", held);
    return 0;
}
