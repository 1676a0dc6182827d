/* fibers N: allocations made on stacks the thread does not own.
 *   - a fiber (ucontext) on a 16 KiB stack malloc'd from the heap, with a
 *     16 KiB canary below it in the same block: nothing may write there;
 *   - a fiber on a 128 KiB mmap'd stack above a guard page;
 *   - a second thread whose first allocation is made in a fiber (on an
 *     mmap'd stack), then allocates on its own stack;
 *   - a SIGUSR1 handler on a sigaltstack, raised by main.
 * Each fiber makes N allocations, of 1000 and 2000 bytes in turn from two
 * call sites, switching back to its caller after each; every block is kept
 * to the end. Prints "fibers N ok"
 * when the canary is intact. The functions that allocate are not inlined,
 * so their names are the call sites. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#define CANARY (16 << 10)
#define SMALL_STACK (16 << 10)
#define MAPPED_STACK (128 << 10)
#define PAGE 4096

struct fiber {
    ucontext_t caller, context;
    int n;
    void **held;
};

static int n;

__attribute__((noinline)) static void *allocate_in_fiber(int i) {
    char *block = malloc(1000);
    block[0] = (char)i;
    return block;
}

__attribute__((noinline)) static void *allocate_more_in_fiber(int i) {
    char *block = malloc(2000);
    block[0] = (char)i;
    return block;
}

/* Two call sites at the same depth, taken in turn: each walk must read
 * the stack as it is now, not as an earlier walk found it. */
__attribute__((noinline)) static void fiber_body(struct fiber *f) {
    for (int i = 0; i < f->n; i++) {
        f->held[i] = i % 2 ? allocate_more_in_fiber(i) : allocate_in_fiber(i);
        swapcontext(&f->context, &f->caller);
    }
}

static void fiber_entry(unsigned high, unsigned low) {
    fiber_body((struct fiber *)(((unsigned long)high << 32) | low));
}

/* Runs a fiber on [stack, stack + size) until it has made every allocation. */
static void run_fiber(struct fiber *f, void *stack, size_t size) {
    getcontext(&f->context);
    f->context.uc_stack.ss_sp = stack;
    f->context.uc_stack.ss_size = size;
    f->context.uc_link = &f->caller;
    unsigned long address = (unsigned long)f;
    makecontext(&f->context, (void (*)(void))fiber_entry, 2, (unsigned)(address >> 32), (unsigned)address);
    for (int i = 0; i <= f->n; i++)
        swapcontext(&f->caller, &f->context);
}

static void *mapped_stack(void) {
    char *mapping = mmap(NULL, MAPPED_STACK + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (mapping == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    mprotect(mapping, PAGE, PROT_NONE);
    return mapping + PAGE;
}

__attribute__((noinline)) static void *allocate_on_thread_stack(void) {
    char *block = malloc(3000);
    block[0] = 1;
    return block;
}

static void *thread_main(void *held) {
    struct fiber f = {.n = n, .held = held};
    run_fiber(&f, mapped_stack(), MAPPED_STACK);
    return allocate_on_thread_stack();
}

void *volatile in_handler;

__attribute__((noinline)) static void allocate_in_handler(void) {
    char *block = malloc(5000);
    block[0] = 1;
    in_handler = block;
}

static void on_usr1(int signal) {
    (void)signal;
    allocate_in_handler();
}

int main(int argc, char **argv) {
    n = argc > 1 ? atoi(argv[1]) : 200;
    void **held = calloc(3 * (size_t)n, sizeof *held);

    unsigned char *block = malloc(CANARY + SMALL_STACK);
    memset(block, 0xa5, CANARY);
    struct fiber small = {.n = n, .held = held};
    run_fiber(&small, block + CANARY, SMALL_STACK);

    struct fiber mapped = {.n = n, .held = held + n};
    run_fiber(&mapped, mapped_stack(), MAPPED_STACK);

    pthread_t thread;
    void *from_thread;
    pthread_create(&thread, NULL, thread_main, held + 2 * n);
    pthread_join(thread, &from_thread);

    stack_t alternate = {.ss_sp = malloc(64 << 10), .ss_size = 64 << 10};
    sigaltstack(&alternate, NULL);
    struct sigaction action = {.sa_handler = on_usr1, .sa_flags = SA_ONSTACK};
    sigaction(SIGUSR1, &action, NULL);
    raise(SIGUSR1);

    for (int i = 0; i < CANARY; i++) {
        if (block[i] != 0xa5) {
            printf("canary overwritten at %d below the fiber's stack\n", CANARY - i);
            return 1;
        }
    }
    printf("fibers %d ok\n", n);
    return 0;
}
