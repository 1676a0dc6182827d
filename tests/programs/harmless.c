/* Programs that a profiler living inside the process would harm: each mode
 * does what common production programs do, and prints or writes what lets
 * a test compare a plain run with a traced one.
 *
 *   harmless closefrom      closes fds 3..1023, opens data.log, writes lines
 *                           while allocating
 *   harmless dup2           dup2s its own data.log over fds 3..1023, writes
 *   harmless pthread-exit   main ends with pthread_exit; workers print
 *   harmless strict         enters SECCOMP_MODE_STRICT, allocates, exits by SYS_exit
 *   harmless filter         a seccomp filter kills on open/openat and on
 *                           write above fd 2; allocates, exits normally
 *   harmless unshare        unshare(CLONE_NEWUSER) must succeed (single-threaded)
 *   harmless nproc          drops to uid/gid 65534 (as a daemon drops root),
 *                           sets RLIMIT_NPROC to 2 and starts one thread
 *   harmless slow SECONDS   allocates for SECONDS, then writes done.txt
 *   harmless fork-child     forks a child that prints "child PID" and
 *                           allocates for 1.5 s; the parent waits for it
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void churn(int rounds) {
    for (int r = 0; r < rounds; r++) {
        void *blocks[256];
        for (int i = 0; i < 256; i++) {
            blocks[i] = malloc(16 + (i * 37) % 600);
            memset(blocks[i], i, 16);
        }
        for (int i = 0; i < 256; i++) free(blocks[i]);
    }
}

static void write_lines(int fd, int lines) {
    for (int i = 0; i < lines; i++) {
        char line[64];
        int n = snprintf(line, sizeof line, "line %d\n", i);
        churn(200);
        if (write(fd, line, n) != n) _exit(3);
    }
}

static void *worker(void *arg) {
    long id = (long)arg;
    churn(500);
    printf("worker %ld done\n", id);
    fflush(stdout);
    return NULL;
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    churn(100);
    if (!strcmp(mode, "closefrom")) {
        for (int fd = 3; fd < 1024; fd++) close(fd);
        int fd = open("data.log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd != 3) return 2;
        write_lines(fd, 20);
        close(fd);
        puts("closefrom ok");
        return 0;
    }
    if (!strcmp(mode, "dup2")) {
        int fd = open("data.log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        for (int other = 3; other < 1024; other++)
            if (other != fd) dup2(fd, other);
        write_lines(fd, 20);
        puts("dup2 ok");
        return 0;
    }
    if (!strcmp(mode, "pthread-exit")) {
        pthread_t threads[4];
        for (long i = 0; i < 4; i++) pthread_create(&threads[i], NULL, worker, (void *)i);
        pthread_exit(NULL);
    }
    if (!strcmp(mode, "strict")) {
        const char ready[] = "strict ready\n";
        if (write(1, ready, sizeof ready - 1) < 0) return 2;
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) return 2;
        /* Small blocks from the arena glibc already has: no system call. */
        for (int i = 0; i < 1000; i++) free(malloc(32));
        const char done[] = "strict done\n";
        if (write(1, done, sizeof done - 1) < 0) syscall(SYS_exit, 2);
        syscall(SYS_exit, 0);
    }
    if (!strcmp(mode, "filter")) {
        struct sock_filter code[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_open, 5, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 4, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_write, 0, 2),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
            BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 2, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        };
        struct sock_fprog program = {.len = sizeof code / sizeof code[0], .filter = code};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 2;
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) return 2;
        write_lines(1, 10);
        puts("filter ok");
        return 0;
    }
    if (!strcmp(mode, "unshare")) {
        if (unshare(CLONE_NEWUSER) != 0) {
            printf("unshare failed: %s\n", strerror(errno));
            return 1;
        }
        churn(100);
        puts("unshare ok");
        return 0;
    }
    if (!strcmp(mode, "nproc")) {
        if (setgid(65534) != 0 || setuid(65534) != 0) {
            puts("not root: cannot drop privileges");
            return 3;
        }
        struct rlimit limit = {2, 2};
        if (setrlimit(RLIMIT_NPROC, &limit) != 0) return 2;
        pthread_t thread;
        int error = pthread_create(&thread, NULL, worker, (void *)0);
        if (error) {
            printf("pthread_create: %s\n", strerror(error));
            return 1;
        }
        pthread_join(thread, NULL);
        puts("nproc ok");
        return 0;
    }
    if (!strcmp(mode, "threads")) {
        int count = argc > 2 ? atoi(argv[2]) : 2;
        pthread_t threads[64];
        for (long i = 0; i < count && i < 64; i++) {
            int error = pthread_create(&threads[i], NULL, worker, (void *)i);
            if (error) {
                printf("thread %ld: %s\n", i, strerror(error));
                return 1;
            }
            pthread_join(threads[i], NULL);
        }
        puts("threads ok");
        return 0;
    }
    if (!strcmp(mode, "fork-child")) {
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            printf("child %d\n", (int)getpid());
            fflush(stdout);
            double until = seconds_now() + 1.5;
            while (seconds_now() < until) churn(50);
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        printf("parent done, child exit %d\n", WEXITSTATUS(status));
        return 0;
    }
    if (!strcmp(mode, "slow")) {
        double until = seconds_now() + (argc > 2 ? atof(argv[2]) : 1.0);
        long rounds = 0;
        while (seconds_now() < until) {
            churn(50);
            rounds++;
        }
        FILE *done = fopen("done.txt", "w");
        if (!done) return 2;
        fprintf(done, "done\n");
        fclose(done);
        puts("slow ok");
        return 0;
    }
    fprintf(stderr, "usage: harmless closefrom|dup2|pthread-exit|strict|filter|unshare|nproc|threads N|slow SECONDS|fork-child\n");
    return 64;
}
