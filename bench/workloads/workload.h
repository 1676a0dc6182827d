/* Shared helpers for the bench workloads: a fixed-seed RNG and argument parsing.
 * Every workload is deterministic and prints one "checksum ..." line, which run.py
 * compares across plain and profiled runs to prove the profiler changed nothing. */
#ifndef MEMGAP_BENCH_WORKLOAD_H
#define MEMGAP_BENCH_WORKLOAD_H

#include <stdint.h>
#include <stdlib.h>

/* splitmix64: tiny, fast and good enough to pick sizes and slots. */
static inline uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t random_between(uint64_t *state, uint64_t low, uint64_t high) {
    return low + next_random(state) % (high - low + 1);
}

/* argv[index] as a number, or fallback when absent. */
static inline long arg_or(int argc, char **argv, int index, long fallback) {
    return index < argc ? strtol(argv[index], NULL, 10) : fallback;
}

#endif
