/*
 * idle_rss: 8 threads each build and drop bursts of 4000-byte strings,
 * keeping the last of each burst, so glibc keeps most freed pages in the
 * threads' arenas. Then the program idles for a second and prints its own
 * VmRSS in kB: the steady state a trim remedy should lower.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *work(void *unused) {
    (void)unused;
    void **kept = malloc(20 * sizeof *kept);
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
