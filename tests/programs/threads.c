/*
 * threads: 8 threads allocate and free concurrently.
 *
 * Each worker does exactly 100,000 malloc and 100,000 free (sizes 16..527
 * bytes), keeping up to 64 blocks live at a time, and writes into every
 * block. Workers start together (a barrier) so their events interleave.
 * Main joins them, checks every worker's checksum against the value it
 * computes itself, prints "threads ok <checksum>\n" with write(2) and exits 0
 * (1 on a mismatch).
 *
 * Heap events from the program itself: malloc 800,000, free 800,000.
 * glibc's pthread_create adds one calloc per new thread stack (the thread's
 * DTV), freed only when glibc releases the stack. The threads get small
 * stacks (256 KiB) so all eight stay in glibc's stack cache and no DTV is
 * freed before exit: free stays exactly 800,000. Nothing else allocates
 * (no stdio).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 8
#define PER_THREAD 100000
#define SLOTS 64
#define STACK_SIZE (256 * 1024)

static pthread_barrier_t start_line;

struct worker {
    pthread_t thread;
    unsigned id;
    uint64_t checksum;
};

static size_t size_for(unsigned id, unsigned i) {
    return 16 + (size_t)((i * 2654435761u + id * 40503u) % 512);
}

static uint64_t expected_checksum(unsigned id) {
    uint64_t sum = 0;
    for (unsigned i = 0; i < PER_THREAD; i++)
        sum += (uint64_t)size_for(id, i) * (id + 1) + (i & 0xff);
    return sum;
}

static void *work(void *arg) {
    struct worker *w = arg;
    unsigned char *slots[SLOTS] = {0};
    size_t sizes[SLOTS] = {0};
    pthread_barrier_wait(&start_line);
    for (unsigned i = 0; i < PER_THREAD; i++) {
        unsigned s = i % SLOTS;
        if (slots[s] != NULL) {
            w->checksum += (uint64_t)sizes[s] * (w->id + 1) + slots[s][sizes[s] - 1];
            free(slots[s]);
        }
        sizes[s] = size_for(w->id, i);
        slots[s] = malloc(sizes[s]);
        if (slots[s] == NULL) abort();
        memset(slots[s], 0, sizes[s]);
        slots[s][sizes[s] - 1] = (unsigned char)(i & 0xff);
    }
    for (unsigned s = 0; s < SLOTS; s++) {
        if (slots[s] != NULL) {
            w->checksum += (uint64_t)sizes[s] * (w->id + 1) + slots[s][sizes[s] - 1];
            free(slots[s]);
        }
    }
    return NULL;
}

static void say(const char *text) {
    size_t len = strlen(text);
    while (len > 0) {
        ssize_t n = write(1, text, len);
        if (n <= 0) return;
        text += n;
        len -= (size_t)n;
    }
}

static void say_number(uint64_t value) {
    char digits[24];
    int at = sizeof digits;
    digits[--at] = '\0';
    do {
        digits[--at] = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    say(digits + at);
}

int main(void) {
    static struct worker workers[THREADS];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, STACK_SIZE);
    pthread_barrier_init(&start_line, NULL, THREADS);
    for (unsigned t = 0; t < THREADS; t++) {
        workers[t].id = t;
        if (pthread_create(&workers[t].thread, &attr, work, &workers[t]) != 0) {
            say("pthread_create failed\n");
            return 1;
        }
    }
    uint64_t total = 0;
    int ok = 1;
    for (unsigned t = 0; t < THREADS; t++) {
        pthread_join(workers[t].thread, NULL);
        if (workers[t].checksum != expected_checksum(t)) ok = 0;
        total += workers[t].checksum;
    }
    if (!ok) {
        say("threads: checksum mismatch\n");
        return 1;
    }
    say("threads ok ");
    say_number(total);
    say("\n");
    return 0;
}
