/* threads [pairs=20000000] [live=100000] [threads=4] [seed=1]
 * churn split evenly over several threads: each thread replaces random slots in
 * its own table of live/threads blocks with its own seed. Exercises the profiler's
 * locking and per-thread paths; the plain run keeps both vCPUs busy. */
#include <pthread.h>
#include <stdio.h>
#include "workload.h"

struct churn_job {
    long pairs, live;
    uint64_t seed, checksum;
};

static void *run_churn(void *arg) {
    struct churn_job *job = arg;
    uint64_t rng = job->seed, checksum = 0;
    unsigned char **slots = malloc(job->live * sizeof *slots);
    for (long i = 0; i < job->live; i++) {
        slots[i] = malloc(random_between(&rng, 16, 512));
        slots[i][0] = (unsigned char)i;
    }
    for (long i = 0; i < job->pairs; i++) {
        long slot = (long)(next_random(&rng) % (uint64_t)job->live);
        checksum = checksum * 31 + slots[slot][0];
        free(slots[slot]);
        slots[slot] = malloc(random_between(&rng, 16, 512));
        slots[slot][0] = (unsigned char)i;
    }
    for (long i = 0; i < job->live; i++) {
        checksum = checksum * 31 + slots[i][0];
        free(slots[i]);
    }
    free(slots);
    job->checksum = checksum;
    return NULL;
}

int main(int argc, char **argv) {
    long pairs = arg_or(argc, argv, 1, 20000000);
    long live = arg_or(argc, argv, 2, 100000);
    long thread_count = arg_or(argc, argv, 3, 4);
    uint64_t seed = (uint64_t)arg_or(argc, argv, 4, 1);
    if (thread_count < 1) thread_count = 1;
    if (live < thread_count) live = thread_count;

    pthread_t *threads = malloc(thread_count * sizeof *threads);
    struct churn_job *jobs = malloc(thread_count * sizeof *jobs);
    for (long t = 0; t < thread_count; t++) {
        jobs[t] = (struct churn_job){pairs / thread_count, live / thread_count, seed + (uint64_t)t, 0};
        pthread_create(&threads[t], NULL, run_churn, &jobs[t]);
    }
    uint64_t checksum = 0;
    for (long t = 0; t < thread_count; t++) {
        pthread_join(threads[t], NULL);
        checksum = checksum * 31 + jobs[t].checksum; /* join order is fixed, so this is deterministic */
    }
    free(jobs);
    free(threads);
    printf("checksum %016llx\n", (unsigned long long)checksum);
    return 0;
}
