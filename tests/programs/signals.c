/*
 * signals MODE: a program with signal handlers of its own.
 *
 *   handlers: installs SIGTERM and SIGINT handlers that only set a flag;
 *             allocates in a loop, printing "ready" once; when the flag is
 *             set it frees everything, prints "got SIGTERM" or "got SIGINT"
 *             and exits 42 (SIGTERM) or 43 (SIGINT).
 *   default:  no handler; prints "ready" and allocates until a signal
 *             kills it.
 *   alarm:    a SIGALRM handler that mallocs and frees fires every 200 us
 *             while the main thread makes 2,000,000 malloc/free pairs with
 *             SIGALRM blocked around each call (malloc is not
 *             async-signal-safe: a handler may allocate only where it cannot
 *             interrupt an allocation); prints "alarms N, pairs 2000000" and
 *             exits 0. N > 0 checks that the handler really ran.
 *   alarm-anywhere: the same handler, every 100 us, but nothing blocked:
 *             it interrupts the program's own allocations (as many
 *             single-threaded programs get away with, glibc taking no lock
 *             while a process has one thread); 300,000 pairs, then
 *             "pairs 300000".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t got;
static volatile sig_atomic_t alarms;
static volatile sig_atomic_t mapped;

static void on_signal(int signal) { got = signal; }

static void on_alarm(int signal) {
    (void)signal;
    char *block = malloc(100 + alarms % 50);
    if (block != NULL) block[0] = 1;
    free(block);
    alarms++;
}

/* mmap and munmap are plain system calls, so unlike malloc they are safe
 * wherever the handler lands; memgap's hooks record them all the same. */
static void on_alarm_mapping(int signal) {
    (void)signal;
    for (int i = 0; i < 2; i++) {
        char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page == MAP_FAILED) continue;
        page[0] = 1;
        munmap(page, 4096);
        mapped++;
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "handlers";
    if (strcmp(mode, "alarm") == 0) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = on_alarm;
        action.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &action, NULL);
        struct itimerval every = {{0, 200}, {0, 200}};
        setitimer(ITIMER_REAL, &every, NULL);
        sigset_t alarm_only, previous;
        sigemptyset(&alarm_only);
        sigaddset(&alarm_only, SIGALRM);
        for (long i = 0; i < 2000000; i++) {
            sigprocmask(SIG_BLOCK, &alarm_only, &previous);
            void *block = malloc(16 + i % 500);
            free(block);
            sigprocmask(SIG_SETMASK, &previous, NULL);
        }
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        printf("alarms %s, pairs 2000000\n", alarms > 0 ? "N" : "0");
        return 0;
    }
    if (strcmp(mode, "alarm-anywhere") == 0) {
        free(malloc(1));
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = on_alarm;
        action.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &action, NULL);
        struct itimerval every = {{0, 100}, {0, 100}};
        setitimer(ITIMER_REAL, &every, NULL);
        for (long i = 0; i < 300000; i++) {
            void *block = malloc(16 + i % 500);
            free(block);
        }
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        printf("pairs 300000\n");
        return 0;
    }
    if (strcmp(mode, "alarm-count") == 0) {
        free(malloc(1));
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = on_alarm_mapping;
        action.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &action, NULL);
        struct itimerval every = {{0, 50}, {0, 50}};
        setitimer(ITIMER_REAL, &every, NULL);
        for (long i = 0; i < 200000; i++) {
            void *block = malloc(16 + i % 500);
            free(block);
        }
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        /* The warm-up, the loop, and stdout's buffer. */
        printf("mallocs %d frees %d mmaps %ld\n", 1 + 200000 + 1, 1 + 200000, (long)mapped);
        return 0;
    }
    if (strcmp(mode, "handlers") == 0) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = on_signal;
        sigaction(SIGTERM, &action, NULL);
        sigaction(SIGINT, &action, NULL);
    }
    void *ring[1024] = {0};
    int announced = 0;
    for (unsigned long i = 0; !got; i++) {
        free(ring[i % 1024]);
        ring[i % 1024] = malloc(32 + i % 700);
        if (!announced && i == 10000) {
            printf("ready\n");
            fflush(stdout);
            announced = 1;
        }
        if (i % 10000 == 0) usleep(1000);
    }
    for (int i = 0; i < 1024; i++) free(ring[i]);
    printf("got %s\n", got == SIGTERM ? "SIGTERM" : "SIGINT");
    return got == SIGTERM ? 42 : 43;
}
