/*
 * fork_exec: a parent that forks a child which then execs this program again.
 *
 *   parent, before fork:   100 malloc(24), 50 free
 *   child, after fork:   5,000 malloc(48), 2,000 free, then
 *                        execv("/proc/self/exe", {argv[0], "exec-child"})
 *   child, after exec:   3,000 malloc(80), 3,000 free, exit 0
 *   parent, after wait:     10 malloc(24), 10 free
 *
 * So the parent's own events are malloc 110 / free 60, and the child pid's
 * events (fork image + exec image) are malloc 8,000 / free 5,000.
 *
 * The parent prints "parent <pid> child <pid>\n" on stdout (write(2), no
 * stdio, so nothing else allocates) and exits 0 when the child exited 0,
 * 1 otherwise.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void say(const char *text) {
    size_t len = strlen(text);
    while (len > 0) {
        ssize_t n = write(1, text, len);
        if (n <= 0) return;
        text += n;
        len -= (size_t)n;
    }
}

static void say_number(long value) {
    char digits[24];
    int at = sizeof digits;
    digits[--at] = '\0';
    do {
        digits[--at] = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    say(digits + at);
}

/* Allocates `count` blocks of `size` bytes, touches them, frees the first
 * `freed` of them and leaks the rest. Returns 0 on success. */
static int churn(int count, int freed, size_t size) {
    static void *blocks[5000];
    for (int i = 0; i < count; i++) {
        blocks[i] = malloc(size);
        if (blocks[i] == NULL) return 1;
        memset(blocks[i], i & 0xff, size);
    }
    for (int i = 0; i < freed; i++) free(blocks[i]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "exec-child") == 0)
        return churn(3000, 3000, 80);

    if (churn(100, 50, 24) != 0) return 1;

    pid_t child = fork();
    if (child < 0) {
        say("fork failed\n");
        return 1;
    }
    if (child == 0) {
        if (churn(5000, 2000, 48) != 0) _exit(1);
        char *args[] = {argv[0], "exec-child", NULL};
        execv("/proc/self/exe", args);
        _exit(2);
    }

    int status = 0;
    if (waitpid(child, &status, 0) != child) return 1;
    if (churn(10, 10, 24) != 0) return 1;

    say("parent ");
    say_number((long)getpid());
    say(" child ");
    say_number((long)child);
    say("\n");
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
