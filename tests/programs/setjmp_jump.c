/*
 * setjmp_jump: longjmp out of deeply nested calls that allocated (the
 * blocks are tracked in a list and freed after the jump), and siglongjmp
 * out of a signal handler (SIGUSR1 raised inside an allocation loop), so
 * that control leaves frames without returning through them. Prints
 * totals; exits 0.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jmp_buf escape;
static sigjmp_buf signal_escape;
static void *pending[4096];
static int pending_count;

static void dive(int depth, int jump_at) {
    void *block = malloc(16 + depth * 8);
    memset(block, depth, 16);
    pending[pending_count++] = block;
    if (depth == jump_at) longjmp(escape, depth + 1);
    dive(depth + 1, jump_at);
}

static void on_usr1(int signal) {
    (void)signal;
    siglongjmp(signal_escape, 1);
}

int main(void) {
    long jumps = 0, depth_sum = 0, freed = 0;
    for (int round = 0; round < 5000; round++) {
        pending_count = 0;
        int value = setjmp(escape);
        if (value == 0) {
            dive(0, round % 60);
        } else {
            jumps++;
            depth_sum += value;
        }
        for (int i = 0; i < pending_count; i++) {
            free(pending[i]);
            freed++;
        }
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_usr1;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR1, &action, NULL);
    long signal_jumps = 0;
    for (int round = 0; round < 500; round++) {
        volatile int allocated = 0;
        void *volatile block = NULL;
        if (sigsetjmp(signal_escape, 1) == 0) {
            for (;;) {
                block = realloc(block, 32 + allocated * 16);
                allocated++;
                if (allocated == 10 + round % 20) raise(SIGUSR1);
            }
        }
        signal_jumps++;
        free(block);
    }
    printf("jumps %ld, depth sum %ld, freed %ld, signal jumps %ld\n", jumps, depth_sum, freed, signal_jumps);
    return 0;
}
