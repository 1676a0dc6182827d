/*
 * sleeper: allocates forever, for tests that kill a program mid-run.
 *
 * Each round makes 1,000 malloc calls (sizes 16..1039 bytes) into a ring
 * of 4,096 slots, freeing whatever a slot held before, so up to 4,096 blocks
 * stay live and memory stays bounded; then it sleeps 10 ms. After the first
 * round it writes "sleeper running\n" to stdout. It never exits on its own.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RING 4096
#define PER_ROUND 1000

static void *ring[RING];

int main(void) {
    unsigned long next = 0;
    const struct timespec pause = {0, 10 * 1000 * 1000};
    for (unsigned long round = 0;; round++) {
        for (int i = 0; i < PER_ROUND; i++, next++) {
            unsigned slot = (unsigned)(next % RING);
            free(ring[slot]);
            size_t size = 16 + (size_t)((next * 2654435761u) % 1024);
            ring[slot] = malloc(size);
            if (ring[slot] == NULL) return 1;
            memset(ring[slot], (int)(next & 0xff), size);
        }
        if (round == 0) {
            static const char line[] = "sleeper running\n";
            if (write(1, line, sizeof line - 1) < 0) return 1;
        }
        nanosleep(&pause, NULL);
    }
}
