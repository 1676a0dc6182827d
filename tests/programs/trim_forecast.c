/*
 * trim_forecast: heaps shaped so that what malloc_trim(0) returns depends on
 * how glibc really trims (main arena top, thread arena tops, binned chunks,
 * tcache, an arena's earlier heaps). Each mode builds its heap, calls
 * memgap_snapshot() (found with dlsym, so the program runs without memgap
 * too), then measures its own Rss (smaps_rollup, read without malloc) around
 * its own malloc_trim(0), asks for another snapshot, and prints "BEFORE
 * AFTER" in bytes. Worker threads
 * stay alive until after the trim, so their tcaches hold what they hold.
 *
 *   main-strided K     main arena: mixed 24-2000-byte blocks (~96 MiB), every
 *                      K-th survives
 *   thread-emptied     two workers fill their arenas (~40 MiB each: one with
 *                      fastbin sizes only, one mixed) and free everything
 *   thread-half        a worker fills ~40 MiB and frees alternate 256 KiB runs
 *   thread-top         a worker keeps only the last 1 MiB it allocated
 *   thread-start       a worker keeps only the first 1 MiB it allocated
 *   thread-heaps       a worker fills ~150 MiB (three 64 MiB heaps) and keeps
 *                      one block per MiB of the last 50 MiB: its first heap
 *                      is all free, but the arena's top is in the third
 *   after-trim         main arena and a worker: free a third, malloc_trim,
 *                      then free another third; the measured trim is the second
 *   hold-thread-top    thread-top, but instead of trimming prints "pid PID" and
 *                      waits for SIGTERM (for `memgap trim PID`)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void snapshot(void) {
    void (*take)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "memgap_snapshot");
    if (take) take();
}

/* Rss of the whole process in bytes, from smaps_rollup (exact, unlike
   VmRSS), read into a stack buffer: no malloc between snapshot and trim. */
static long rss_bytes(void) {
    char text[4096];
    int fd = open("/proc/self/smaps_rollup", O_RDONLY);
    if (fd < 0) return -1;
    ssize_t got = read(fd, text, sizeof text - 1);
    close(fd);
    if (got <= 0) return -1;
    text[got] = 0;
    char *rss = strstr(text, "\nRss:");
    return rss ? strtol(rss + 5, NULL, 10) * 1024 : -1;
}

static unsigned long rng = 88172645463325252UL;
static unsigned long next_random(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

struct fill {
    char **blocks;
    size_t count;
};

/* Blocks of min..max bytes, written to, until `total` bytes. */
static struct fill fill(size_t total, size_t min, size_t max) {
    struct fill f = { malloc((total / min + 1) * sizeof(char *)), 0 };
    size_t bytes = 0;
    while (bytes < total) {
        size_t size = min + next_random() % (max - min + 1);
        f.blocks[f.count] = malloc(size);
        memset(f.blocks[f.count++], 7, size);
        bytes += size;
    }
    return f;
}

/* Frees the blocks for which keep(index, count, bytes so far) is false. */
static void free_unless(struct fill *f, int (*keep)(size_t i, size_t count, size_t offset)) {
    size_t offset = 0;
    for (size_t i = 0; i < f->count; i++) {
        size_t size = malloc_usable_size(f->blocks[i]);
        if (!keep(i, f->count, offset)) {
            free(f->blocks[i]);
            f->blocks[i] = NULL;
        }
        offset += size;
    }
}

static pthread_barrier_t built, trimmed;
static int (*worker_keep)(size_t, size_t, size_t);
static size_t worker_total, worker_min, worker_max;

static void *worker(void *arg) {
    (void)arg;
    struct fill f = fill(worker_total, worker_min, worker_max);
    free_unless(&f, worker_keep);
    pthread_barrier_wait(&built);
    pthread_barrier_wait(&trimmed);
    return NULL;
}

static void measure_trim(void) {
    snapshot();
    long before = rss_bytes();
    malloc_trim(0);
    long after = rss_bytes();
    /* What the trim left: taken before memgap's own post-trim snapshot. */
    snapshot();
    printf("%ld %ld\n", before, after);
    fflush(stdout);
}

/* Runs `workers` workers one after another (each gets an arena of its own
   while the others still hold theirs), then trims with all of them alive. */
static volatile sig_atomic_t terminated;
static void on_term(int signal) { (void)signal; terminated = 1; }

/* Instead of trimming: snapshot, print the pid, and wait for SIGTERM while
   `memgap trim PID` trims from outside. */
static void hold(void) {
    snapshot();
    signal(SIGTERM, on_term);
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    while (!terminated) usleep(10 * 1000);
}

static void (*main_action)(void) = measure_trim;

static int with_workers(int workers, size_t total, size_t min[], size_t max[], int (*keep)(size_t, size_t, size_t)) {
    pthread_t threads[4];
    pthread_barrier_init(&built, NULL, 2);
    pthread_barrier_init(&trimmed, NULL, workers + 1);
    worker_keep = keep;
    worker_total = total;
    for (int i = 0; i < workers; i++) {
        worker_min = min[i];
        worker_max = max[i];
        pthread_create(&threads[i], NULL, worker, NULL);
        pthread_barrier_wait(&built);
    }
    main_action();
    pthread_barrier_wait(&trimmed);
    for (int i = 0; i < workers; i++) pthread_join(threads[i], NULL);
    return 0;
}

static size_t stride;
static int keep_strided(size_t i, size_t count, size_t offset) { (void)count; (void)offset; return i % stride == 0; }
static int keep_none(size_t i, size_t count, size_t offset) { (void)i; (void)count; (void)offset; return 0; }
static int keep_alternate_runs(size_t i, size_t count, size_t offset) { (void)i; (void)count; return (offset >> 18) % 2 == 0; }
static int keep_last_mib(size_t i, size_t count, size_t offset) { (void)offset; return i >= count - count / 64; }
static int keep_first_mib(size_t i, size_t count, size_t offset) { (void)i; (void)count; return offset < (1 << 20); }
static int keep_one_per_mib_of_the_last_50(size_t i, size_t count, size_t offset) {
    static size_t last_kept_mib = (size_t)-1;
    (void)count;
    if (i == 0) last_kept_mib = (size_t)-1;
    if (offset < (100u << 20) || offset >> 20 == last_kept_mib) return 0;
    last_kept_mib = offset >> 20;
    return 1;
}

static int after_trim(void) {
    struct fill f = fill(48u << 20, 24, 2000);
    /* A third of the heap freed in runs, the first malloc_trim... */
    for (size_t i = 0; i < f.count; i++)
        if (i % 3 == 0 && (i / 256) % 2 == 0) { free(f.blocks[i]); f.blocks[i] = NULL; }
    stride = 4;
    pthread_t thread;
    pthread_barrier_init(&built, NULL, 2);
    pthread_barrier_init(&trimmed, NULL, 2);
    worker_keep = keep_alternate_runs;
    worker_total = 32u << 20;
    worker_min = 24;
    worker_max = 1500;
    pthread_create(&thread, NULL, worker, NULL);
    pthread_barrier_wait(&built);
    malloc_trim(0);
    /* ...the agent's snapshot after it... */
    usleep(400 * 1000);
    /* ...then whole runs freed where survivors were. */
    for (size_t i = 0; i < f.count; i++)
        if (f.blocks[i] && (i / 256) % 4 == 1) { free(f.blocks[i]); f.blocks[i] = NULL; }
    measure_trim();
    pthread_barrier_wait(&trimmed);
    pthread_join(thread, NULL);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    size_t fast_min[] = { 16, 24 }, fast_max[] = { 120, 2000 };
    size_t mixed_min[] = { 24 }, mixed_max[] = { 2000 };
    if (!strcmp(mode, "main-strided") && argc > 2) {
        stride = (size_t)atol(argv[2]);
        struct fill f = fill(96u << 20, 24, 2000);
        free_unless(&f, keep_strided);
        measure_trim();
        return 0;
    }
    if (!strcmp(mode, "thread-emptied")) return with_workers(2, 40u << 20, fast_min, fast_max, keep_none);
    if (!strcmp(mode, "thread-half")) return with_workers(1, 40u << 20, mixed_min, mixed_max, keep_alternate_runs);
    if (!strcmp(mode, "thread-top")) return with_workers(1, 48u << 20, mixed_min, mixed_max, keep_last_mib);
    if (!strcmp(mode, "thread-start")) return with_workers(1, 48u << 20, mixed_min, mixed_max, keep_first_mib);
    if (!strcmp(mode, "thread-heaps")) return with_workers(1, 150u << 20, mixed_min, mixed_max, keep_one_per_mib_of_the_last_50);
    if (!strcmp(mode, "after-trim")) return after_trim();
    if (!strcmp(mode, "hold-thread-top")) {
        main_action = hold;
        return with_workers(1, 48u << 20, mixed_min, mixed_max, keep_last_mib);
    }
    fprintf(stderr, "usage: trim_forecast main-strided K|thread-emptied|thread-half|thread-top|thread-start|thread-heaps|after-trim|hold-thread-top\n");
    return 2;
}
