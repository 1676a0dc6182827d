/*
 * idle_rss: 8 threads each build and drop bursts of 4000-byte strings,
 * keeping the last of each burst, so glibc keeps most freed pages in the
 * threads' arenas. The threads take their first malloc together, so that
 * each gets an arena of its own however the machine schedules them (a
 * thread starting after another exited would reuse its arena, and its freed
 * pages). Then the program idles for a second and prints its own VmRSS in
 * kB: the steady state a trim remedy should lower.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_barrier_t arenas_taken;

static void *work(void *unused) {
    (void)unused;
    void **kept = malloc(20 * sizeof *kept);
    pthread_barrier_wait(&arenas_taken);
    for (int round = 0; round < 20; round++) {
        void *burst[500];
        for (int i = 0; i < 500; i++) {
            burst[i] = malloc(4000);
            memset(burst[i], 1, 4000);
        }
        kept[round] = burst[499];
        for (int i = 0; i < 499; i++) free(burst[i]);
    }
    return kept;
}

int main(void) {
    pthread_t threads[8];
    pthread_barrier_init(&arenas_taken, NULL, 8);
    for (int i = 0; i < 8; i++) pthread_create(&threads[i], NULL, work, NULL);
    for (int i = 0; i < 8; i++) pthread_join(threads[i], NULL);
    sleep(1);
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    while (fgets(line, sizeof line, status)) {
        long kb;
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) printf("%ld\n", kb);
    }
    return 0;
}
