/* Threads that never sleep, to call malloc_trim among: one computes with
 * general and vector registers and checks every result (a register the
 * caller fails to restore shows as an error), one allocates and frees
 * without pause and checks its blocks' contents.
 *
 * busy STATUS_FILE
 *
 * Prints "spinner TID" and "churner TID", then every 10 ms rewrites
 * STATUS_FILE with "spins N errors N churns N corrupt N".
 */
#define _GNU_SOURCE
#include <emmintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WORDS 4096

static atomic_ulong spins, errors, churns, corrupt;
static int words[WORDS];
static int expected;

/* Sums `words` four lanes at a time, with a float product alongside; the
 * inputs never change, so neither may the results. */
static void *spinner(void *arg) {
    (void)arg;
    printf("spinner %d\n", gettid());
    fflush(stdout);
    for (;;) {
        __m128i sum = _mm_setzero_si128();
        __m128 product = _mm_set1_ps(1.0f);
        for (int i = 0; i < WORDS; i += 4) {
            sum = _mm_add_epi32(sum, _mm_loadu_si128((const __m128i *)&words[i]));
            product = _mm_mul_ps(product, _mm_set1_ps(1.0f));
        }
        int lanes[4];
        float floats[4];
        _mm_storeu_si128((__m128i *)lanes, sum);
        _mm_storeu_ps(floats, product);
        if (lanes[0] + lanes[1] + lanes[2] + lanes[3] != expected || floats[0] != 1.0f || floats[3] != 1.0f)
            atomic_fetch_add(&errors, 1);
        atomic_fetch_add(&spins, 1);
    }
    return NULL;
}

static void *churner(void *arg) {
    (void)arg;
    printf("churner %d\n", gettid());
    fflush(stdout);
    char *held[64] = {0};
    for (unsigned long n = 0;; n++) {
        unsigned slot = (n * 2654435761u) % 64;
        if (held[slot]) {
            size_t size = 64 + slot * 300;
            if (held[slot][0] != (char)slot || held[slot][size - 1] != (char)slot)
                atomic_fetch_add(&corrupt, 1);
            free(held[slot]);
        }
        size_t size = 64 + slot * 300;
        held[slot] = malloc(size);
        memset(held[slot], (char)slot, size);
        atomic_fetch_add(&churns, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    for (int i = 0; i < WORDS; i++) {
        words[i] = i * 7 - 3;
        expected += words[i];
    }
    pthread_t tid;
    pthread_create(&tid, NULL, spinner, NULL);
    pthread_create(&tid, NULL, churner, NULL);
    FILE *status = fopen(argv[1], "w");
    if (!status)
        return 1;
    for (;;) {
        rewind(status);
        fprintf(status, "spins %20lu errors %20lu churns %20lu corrupt %20lu\n", atomic_load(&spins), atomic_load(&errors), atomic_load(&churns), atomic_load(&corrupt));
        fflush(status);
        usleep(10000);
    }
}
