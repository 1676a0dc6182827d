/*
 * planted: heap patterns whose ledger is known in advance. Each mode calls
 * memgap_snapshot() (found with dlsym, so the program runs without memgap
 * too) at the points the test examines.
 *
 *   strip            200 MiB of 64-byte blocks, all freed but every 32nd
 *                    (80-byte chunks: a survivor on every 4 KiB page)
 *   take             the same, but the first 1/32 is kept (contiguous)
 *   trim             a worker thread fills its arena with 96 MiB, frees all
 *                    but its last block; snapshot, malloc_trim(0), snapshot
 *   strided K        64-256-byte blocks (~150 MiB), every K-th survives;
 *                    snapshot, malloc_trim(0), snapshot
 *   threads          16 threads build and drop strings, each keeping its last
 *   madvfree         64 MiB of its own mmap'd memory, touched, then MADV_FREE
 *
 * Prints one line of facts the test compares with the ledger.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void snapshot(void) {
    void (*take)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "memgap_snapshot");
    if (take) take();
}

static unsigned long rng = 88172645463325252UL;
static unsigned long next_random(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static void **fill(size_t count, size_t min_size, size_t max_size, size_t *requested) {
    void **blocks = malloc(count * sizeof *blocks);
    *requested = 0;
    for (size_t i = 0; i < count; i++) {
        size_t size = min_size + (max_size > min_size ? next_random() % (max_size - min_size + 1) : 0);
        blocks[i] = malloc(size);
        memset(blocks[i], 1, size);
        *requested += size;
    }
    return blocks;
}

static int strip_or_take(int take) {
    size_t count = (200u << 20) / 64, requested, kept = 0;
    void **blocks = fill(count, 64, 64, &requested);
    for (size_t i = 0; i < count; i++) {
        int keep = take ? i < count / 32 : i % 32 == 0;
        if (keep) kept += 64; else free(blocks[i]);
    }
    free(blocks); /* the pointer array: only the survivors stay live */
    snapshot();
    printf("kept %zu\n", kept);
    return 0;
}

static void *fill_arena_and_free(void *arg) {
    size_t count = (96u << 20) / 1024, requested;
    void **blocks = fill(count, 1024, 1024, &requested);
    for (size_t i = 0; i + 1 < count; i++) free(blocks[i]);
    *(void **)arg = blocks[count - 1];
    free(blocks);
    return NULL;
}

static int trim(void) {
    pthread_t worker;
    void *last = NULL;
    pthread_create(&worker, NULL, fill_arena_and_free, &last);
    pthread_join(worker, NULL);
    snapshot();
    int released = malloc_trim(0);
    snapshot();
    printf("trimmed %d\n", released);
    return 0;
}

static int strided(int k) {
    size_t count = 1000000, requested, kept = 0;
    void **blocks = fill(count, 64, 256, &requested);
    for (size_t i = 0; i < count; i++) {
        if (i % k == 0) kept++; else free(blocks[i]);
    }
    snapshot();
    malloc_trim(0);
    snapshot();
    printf("kept %zu of %zu blocks\n", kept, count);
    return 0;
}

static pthread_barrier_t start_together, all_have_arenas;

static void *strings(void *arg) {
    (void)arg;
    void *pins[20];
    int pinned = 0;
    /* Started together, the threads get arenas of their own: each takes its
       arena with a first malloc before any of them runs on and exits (an
       exited thread's arena goes to the next thread that asks). */
    pthread_barrier_wait(&start_together);
    char *last = malloc(32);
    pthread_barrier_wait(&all_have_arenas);
    for (int round = 0; round < 2000; round++) {
        size_t size = 32 + next_random() % 2000;
        char *s = malloc(size);
        memset(s, 'x', size);
        if (last) free(last);
        last = s;
        if (round % 100 == 0 && pinned < 20) {
            /* A burst dropped again. */
            void *burst[500];
            for (int i = 0; i < 500; i++) {
                burst[i] = malloc(4000);
                memset(burst[i], 'y', 4000);
            }
            /* The last block of the burst stays, so its pages sit below the
               arena's top and glibc keeps them. */
            pins[pinned++] = burst[499];
            for (int i = 0; i < 499; i++) free(burst[i]);
        }
    }
    return pinned ? pins[0] : last;
}

static int threads(void) {
    pthread_t t[16];
    pthread_barrier_init(&start_together, NULL, 16);
    pthread_barrier_init(&all_have_arenas, NULL, 16);
    for (int i = 0; i < 16; i++) pthread_create(&t[i], NULL, strings, NULL);
    for (int i = 0; i < 16; i++) pthread_join(t[i], NULL);
    snapshot();
    printf("threads done\n");
    return 0;
}

static int madvfree(void) {
    size_t len = 64u << 20;
    char *memory = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(memory, 1, len);
    madvise(memory, len, MADV_FREE);
    snapshot();
    printf("lazy %zu\n", len);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "strip")) return strip_or_take(0);
    if (!strcmp(mode, "take")) return strip_or_take(1);
    if (!strcmp(mode, "trim")) return trim();
    if (!strcmp(mode, "strided") && argc > 2) return strided(atoi(argv[2]));
    if (!strcmp(mode, "threads")) return threads();
    if (!strcmp(mode, "madvfree")) return madvfree();
    fprintf(stderr, "usage: planted strip|take|trim|strided K|threads|madvfree\n");
    return 2;
}
