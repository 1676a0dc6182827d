/*
 * thread_churn [IDLE_MS]: the shape of a threaded server whose RSS stays high
 * after its work is done, for `memgap compare`.
 *
 * 8 worker threads each take their first malloc together (so glibc gives
 * each its own arena), then take turns, 3 rounds: a turn allocates 8 MiB of
 * strings of varied sizes (32..4031 bytes), fills them, keeps one small
 * string allocated after them (so the freed strings are not at the top of
 * the arena, where free() would hand them back), and frees the rest. Then
 * every thread exits and main idles IDLE_MS (default 1500) milliseconds:
 * the churn takes ~0.1 s, so the last half of the run, where compare takes
 * the steady RSS, mostly follows the first malloc_trim of memgap's trim
 * remedy (every second by default).
 *
 * Under glibc's default every arena keeps the pages of its own turns: about
 * 8 x 8 MiB resident while idle. With MALLOC_ARENA_MAX=2 the threads share
 * two arenas and reuse each other's freed strings; malloc_trim(0) returns the
 * free pages of every arena. The program prints "thread_churn ok <checksum>"
 * — the same under any allocator — and exits 0.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 8
#define ROUNDS 3
#define TURN_BYTES (8u << 20)
#define MAX_STRINGS (TURN_BYTES / 32)

static pthread_barrier_t arenas_taken;
static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_changed = PTHREAD_COND_INITIALIZER;
static unsigned turn; /* whose turn: round * THREADS + thread id */

struct worker {
    pthread_t thread;
    unsigned id;
    uint64_t checksum;
    char *kept[ROUNDS];
};

static size_t string_size(unsigned id, unsigned round, unsigned i) {
    return 32 + (size_t)((i * 2654435761u + id * 40503u + round * 977u) % 4000);
}

/* One turn: fill TURN_BYTES of strings, keep a small one above them, free them. */
static void churn(struct worker *w, unsigned round) {
    static __thread char *strings[MAX_STRINGS];
    size_t total = 0;
    unsigned count = 0;
    while (total < TURN_BYTES) {
        size_t size = string_size(w->id, round, count);
        char *s = malloc(size);
        if (s == NULL) abort();
        memset(s, 'a' + (count % 26), size - 1);
        s[size - 1] = '\0';
        strings[count++] = s;
        total += size;
    }
    w->kept[round] = malloc(64);
    if (w->kept[round] == NULL) abort();
    snprintf(w->kept[round], 64, "thread %u round %u", w->id, round);
    for (unsigned i = 0; i < count; i++) {
        w->checksum += (unsigned char)strings[i][i % 32] + strlen(strings[i]);
        free(strings[i]);
    }
}

static void *work(void *arg) {
    struct worker *w = arg;
    free(malloc(16)); /* attach to an arena while every thread is alive */
    pthread_barrier_wait(&arenas_taken);
    for (unsigned round = 0; round < ROUNDS; round++) {
        pthread_mutex_lock(&turn_lock);
        while (turn != round * THREADS + w->id)
            pthread_cond_wait(&turn_changed, &turn_lock);
        pthread_mutex_unlock(&turn_lock);

        churn(w, round);

        pthread_mutex_lock(&turn_lock);
        turn++;
        pthread_cond_broadcast(&turn_changed);
        pthread_mutex_unlock(&turn_lock);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long idle_ms = argc > 1 ? atol(argv[1]) : 1500;
    struct worker workers[THREADS];
    pthread_barrier_init(&arenas_taken, NULL, THREADS);
    for (unsigned i = 0; i < THREADS; i++) {
        workers[i] = (struct worker){.id = i};
        if (pthread_create(&workers[i].thread, NULL, work, &workers[i]) != 0) return 2;
    }
    uint64_t checksum = 0;
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(workers[i].thread, NULL);
        checksum += workers[i].checksum;
    }
    usleep((useconds_t)idle_ms * 1000);
    for (unsigned i = 0; i < THREADS; i++)
        for (unsigned round = 0; round < ROUNDS; round++) {
            checksum += strlen(workers[i].kept[round]);
            free(workers[i].kept[round]);
        }
    printf("thread_churn ok %llu\n", (unsigned long long)checksum);
    return 0;
}
