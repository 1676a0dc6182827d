/* handoff PAIRS ITEMS KEPT
 * PAIRS producer/consumer thread pairs pass ITEMS heap blocks each through a
 * small ring: the producer allocates, the consumer frees, so addresses move
 * between threads many times within one writer round. Each consumer keeps
 * its last KEPT blocks alive; prints their total size. Block sizes vary so
 * that a misordered replay shows in the live bytes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define RING 64

struct pair {
    void *slots[RING];
    size_t sizes[RING];
    unsigned head, tail;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    long items, kept;
    size_t kept_bytes;
    void **keep;
};

static void *produce(void *arg) {
    struct pair *p = arg;
    for (long i = 0; i < p->items; i++) {
        size_t size = 16 + (size_t)(i * 7919 % 240);
        void *block = malloc(size);
        ((char *)block)[0] = (char)i;
        pthread_mutex_lock(&p->lock);
        while (p->head - p->tail == RING) pthread_cond_wait(&p->changed, &p->lock);
        p->slots[p->head % RING] = block;
        p->sizes[p->head % RING] = size;
        p->head++;
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

static void *consume(void *arg) {
    struct pair *p = arg;
    for (long i = 0; i < p->items; i++) {
        pthread_mutex_lock(&p->lock);
        while (p->head == p->tail) pthread_cond_wait(&p->changed, &p->lock);
        void *block = p->slots[p->tail % RING];
        size_t size = p->sizes[p->tail % RING];
        p->tail++;
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->lock);
        if (i >= p->items - p->kept) {
            p->keep[i - (p->items - p->kept)] = block;
            p->kept_bytes += size;
        } else {
            free(block);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int pairs = argc > 1 ? atoi(argv[1]) : 2;
    long items = argc > 2 ? atol(argv[2]) : 100000;
    long kept = argc > 3 ? atol(argv[3]) : 100;
    struct pair *p = calloc(pairs, sizeof *p);
    pthread_t *threads = calloc(2 * pairs, sizeof *threads);
    for (int i = 0; i < pairs; i++) {
        p[i].items = items;
        p[i].kept = kept < items ? kept : items;
        p[i].keep = calloc(p[i].kept + 1, sizeof(void *));
        pthread_mutex_init(&p[i].lock, NULL);
        pthread_cond_init(&p[i].changed, NULL);
    }
    for (int i = 0; i < pairs; i++) {
        pthread_create(&threads[2 * i], NULL, produce, &p[i]);
        pthread_create(&threads[2 * i + 1], NULL, consume, &p[i]);
    }
    size_t total = 0;
    for (int i = 0; i < pairs; i++) {
        pthread_join(threads[2 * i], NULL);
        pthread_join(threads[2 * i + 1], NULL);
        total += p[i].kept_bytes;
    }
    printf("kept %zu\n", total);
    fflush(stdout);
    _exit(0); /* the kept blocks stay live to the end */
}
