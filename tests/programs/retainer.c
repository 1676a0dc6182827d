/* A long-running process whose glibc heap is mostly free pages glibc keeps:
 * the situation `memgap trim PID` is for.
 *
 * retainer THREADS MIB COUNTER_FILE
 *
 * The main thread and THREADS others each allocate MIB MiB of strings
 * (256..2047 bytes), then free all but every 64th: the survivors pin the
 * free space between them, so glibc returns none of it on its own. Then it
 * prints "kept BYTES" (what is still allocated) and "port PORT" (a loopback
 * TCP echo server), and idles: the main thread writes a counter to
 * COUNTER_FILE every 10 ms, the workers sleep, one thread answers the echo
 * port. It runs until killed.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KEEP_EVERY 64

static size_t bytes_per_thread;
static pthread_barrier_t allocated;
static size_t kept_bytes[64];

/* Allocates bytes_per_thread of strings, frees all but every 64th; returns
 * the bytes still held. */
static size_t churn(unsigned seed) {
    size_t count = bytes_per_thread / 1152 + 1;
    char **strings = malloc(count * sizeof *strings);
    size_t kept = 0;
    for (size_t i = 0; i < count; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = 256 + (seed >> 8) % 1792;
        strings[i] = malloc(size);
        memset(strings[i], 'a' + i % 26, size - 1);
        strings[i][size - 1] = 0;
        if (i % KEEP_EVERY == KEEP_EVERY - 1)
            kept += size;
    }
    for (size_t i = 0; i < count; i++)
        if (i % KEEP_EVERY != KEEP_EVERY - 1)
            free(strings[i]);
    /* The survivors are never freed; the array of pointers is. */
    free(strings);
    return kept;
}

static void *worker(void *arg) {
    size_t index = (size_t)(uintptr_t)arg;
    kept_bytes[index] = churn(1000 + (unsigned)index);
    pthread_barrier_wait(&allocated);
    for (;;)
        sleep(1);
    return NULL;
}

static void *echo(void *arg) {
    int listener = (int)(intptr_t)arg;
    for (;;) {
        int client = accept(listener, NULL, NULL);
        if (client < 0)
            continue;
        char buf[256];
        ssize_t n;
        while ((n = read(client, buf, sizeof buf)) > 0)
            if (write(client, buf, n) != n)
                break;
        close(client);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: retainer THREADS MIB COUNTER_FILE\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    if (threads < 0 || threads > 63)
        return 2;
    bytes_per_thread = (size_t)atoi(argv[2]) << 20;
    FILE *counter = fopen(argv[3], "w");
    if (!counter)
        return 1;

    pthread_barrier_init(&allocated, NULL, threads + 1);
    pthread_t tid;
    for (int i = 1; i <= threads; i++)
        pthread_create(&tid, NULL, worker, (void *)(uintptr_t)i);
    kept_bytes[0] = churn(1);
    pthread_barrier_wait(&allocated);

    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 8) || getsockname(listener, (struct sockaddr *)&addr, &len))
        return 1;
    pthread_create(&tid, NULL, echo, (void *)(intptr_t)listener);

    size_t kept = 0;
    for (int i = 0; i <= threads; i++)
        kept += kept_bytes[i];
    printf("kept %zu\nport %d\n", kept, ntohs(addr.sin_port));
    fflush(stdout);

    for (unsigned long n = 1;; n++) {
        rewind(counter);
        fprintf(counter, "%20lu\n", n);
        fflush(counter);
        usleep(10000);
    }
}
