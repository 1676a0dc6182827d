/*
 * outside_heap: a glibc heap shaped for `memgap snapshot PID` to walk, the
 * same with or without memgap. Builds its heap, prints "idle PID" and waits
 * until its standard input closes, then exits without freeing anything (so
 * a recording's exit snapshot shows the idle heap). Block sizes are 16n+8
 * bytes, for which glibc's usable size is the size asked for.
 *
 *   strided K         main arena: 40,000 blocks of 1000 and 56 bytes, every
 *                     K-th survives; the last ~4 MiB allocated are freed
 *                     (free pages at the top); one 1 MiB mmapped block
 *   threads-survivors three threads fill their arenas (~12 MiB each) and keep
 *                     every 5th block; they stay alive, blocked
 *   threads-emptied   three threads fill their arenas and free everything
 *   threads-heavy N   N threads malloc and free at random without end
 *                     (for snapshots under load); prints "idle PID" after
 *                     starting them, and on stdin's end "ops N" and "ok"
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCKS 40000

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t filled = PTHREAD_COND_INITIALIZER;
static pthread_cond_t release = PTHREAD_COND_INITIALIZER;
static int workers_done, stopping;

/* Makes the main arena's next chunk start on a page: what the loader and
   a preloaded library allocated before main then does not move the
   program's blocks against page boundaries (which would change how many
   pages hold none). The filler is larger than any hole they left, so it
   comes from the top; it stays allocated. */
static void *align_top_to_page(void) {
    void *probe = malloc(100000);
    uintptr_t chunk = (uintptr_t)probe - 16;
    free(probe);
    size_t pad = 4096 - chunk % 4096;
    if (pad < 32) pad += 4096;
    void *filler = malloc(pad + 65536 - 8);
    memset(filler, 1, 64);
    return filler;
}

static size_t size_of(int i) { return (i % 3 == 0) ? 56 : 1000; }

static void fill(void **blocks, int count, int keep_every) {
    for (int i = 0; i < count; i++) {
        blocks[i] = malloc(size_of(i));
        memset(blocks[i], 0x5a, size_of(i));
    }
    for (int i = 0; i < count; i++)
        if (keep_every == 0 || i % keep_every != 0) {
            free(blocks[i]);
            blocks[i] = NULL;
        }
}

static void *worker(void *arg) {
    int keep_every = *(int *)arg;
    void *blocks[BLOCKS / 2];
    fill(blocks, BLOCKS / 2, keep_every);
    pthread_mutex_lock(&lock);
    workers_done++;
    pthread_cond_signal(&filled);
    while (!stopping) pthread_cond_wait(&release, &lock);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static volatile int heavy_stop;
static unsigned long heavy_ops[64];

static void *heavy(void *arg) {
    long id = (long)arg;
    unsigned long rng = 88172645463325252UL + (unsigned long)id * 7919;
    void *slots[4096] = {0};
    unsigned long ops = 0;
    while (!heavy_stop) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        int slot = rng % 4096;
        free(slots[slot]);
        size_t size = (rng >> 12) % 3 == 0 ? 24 + (rng >> 20) % 200 : 16 + (rng >> 20) % 4000;
        slots[slot] = malloc(size);
        memset(slots[slot], 1, size < 64 ? size : 64);
        ops++;
    }
    for (int i = 0; i < 4096; i++) free(slots[i]);
    heavy_ops[id] = ops;
    return NULL;
}

static void wait_for_stdin_end(void) {
    char buffer[64];
    while (read(0, buffer, sizeof buffer) > 0) {}
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "strided";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (strcmp(mode, "strided") == 0) {
        int keep_every = argc > 2 ? atoi(argv[2]) : 8;
        static void *blocks[BLOCKS];
        void *filler = align_top_to_page();
        fill(blocks, BLOCKS, keep_every);
        /* Then ~4 MiB more, freed: free pages at the main arena's top. */
        static void *tail[4000];
        for (int i = 0; i < 4000; i++) tail[i] = malloc(1000), memset(tail[i], 1, 1000);
        for (int i = 3999; i >= 0; i--) free(tail[i]);
        void *big = malloc((1 << 20) - 24);
        memset(big, 1, (1 << 20) - 24);
        printf("idle %d\n", getpid());
        wait_for_stdin_end();
        return blocks[0] == NULL || filler == NULL;
    }
    if (strcmp(mode, "threads-survivors") == 0 || strcmp(mode, "threads-emptied") == 0) {
        static int keep_every;
        keep_every = strcmp(mode, "threads-survivors") == 0 ? 5 : 0;
        pthread_t threads[3];
        for (int i = 0; i < 3; i++) {
            /* One at a time, so each thread's arena is the same every run. */
            pthread_create(&threads[i], NULL, worker, &keep_every);
            pthread_mutex_lock(&lock);
            while (workers_done < i + 1) pthread_cond_wait(&filled, &lock);
            pthread_mutex_unlock(&lock);
        }
        printf("idle %d\n", getpid());
        wait_for_stdin_end();
        /* Exit with the threads alive and blocked: the exit snapshot sees their tcaches. */
        _exit(0);
    }
    if (strcmp(mode, "threads-heavy") == 0) {
        long n = argc > 2 ? atol(argv[2]) : 7;
        if (n < 1 || n > 64) n = 7;
        pthread_t threads[64];
        for (long i = 0; i < n; i++) pthread_create(&threads[i], NULL, heavy, (void *)i);
        printf("idle %d\n", getpid());
        wait_for_stdin_end();
        heavy_stop = 1;
        unsigned long total = 0;
        for (long i = 0; i < n; i++) pthread_join(threads[i], NULL), total += heavy_ops[i];
        printf("ops %lu\nok\n", total);
        return 0;
    }
    fprintf(stderr, "outside_heap: unknown mode %s\n", mode);
    return 2;
}
