/* Prints its pid, touches 8 MiB of heap and holds it 600 ms: long enough
 * for memgap run to see the process, whether the agent is in it or not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    char *block = malloc(8 << 20);
    if (block == NULL) return 1;
    memset(block, 1, 8 << 20);
    usleep(600000);
    free(block);
    return 0;
}
