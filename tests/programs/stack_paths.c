/* stack_paths [rounds=200000]
 * Allocates through call paths that reach malloc at the same stack depth,
 * in a changing order, with different values in registers and saved
 * frames each time: the agent remembers whole stack walks by stack pointer
 * and must never hand one path's stack to another. Every path allocates
 * its own size and keeps one block in 64 alive, so blame can tell, per
 * stack, which path's sizes it holds. */
#include <stdio.h>
#include <stdlib.h>

static void *kept[1 << 16];
static unsigned long nkept;

__attribute__((noinline)) static void *leaf(size_t size, unsigned long salt) {
    void *p = malloc(size);
    ((volatile unsigned char *)p)[0] = (unsigned char)salt;
    if (salt % 64 == 0 && nkept < sizeof kept / sizeof *kept) kept[nkept++] = p;
    else free(p);
    return p;
}

/* Same depth, different callers: sizes 101, 102, 103. */
__attribute__((noinline)) static void *path_a(unsigned long s) { void *p = leaf(101, s); __asm__ volatile("" ::: "memory"); return p; }
__attribute__((noinline)) static void *path_b(unsigned long s) { void *p = leaf(102, s * 3 + 1); __asm__ volatile("" ::: "memory"); return p; }
__attribute__((noinline)) static void *path_c(unsigned long s) { void *p = leaf(103, s ^ 0x5555); __asm__ volatile("" ::: "memory"); return p; }
/* One level deeper through a shared middle: sizes 201, 202. */
__attribute__((noinline)) static void *middle(void *(*path)(unsigned long), unsigned long s) { void *p = path(s + 7); __asm__ volatile("" ::: "memory"); return p; }
__attribute__((noinline)) static void *via_a(unsigned long s) { void *p = middle(path_a, s); __asm__ volatile("" ::: "memory"); return p; }
__attribute__((noinline)) static void *via_b(unsigned long s) { void *p = middle(path_b, s); __asm__ volatile("" ::: "memory"); return p; }

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 200000;
    unsigned long x = 88172645463325252UL;
    for (long i = 0; i < rounds; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        switch (x % 5) {
        case 0: path_a(x); break;
        case 1: path_b(x); break;
        case 2: path_c(x); break;
        case 3: via_a(x); break;
        default: via_b(x); break;
        }
    }
    printf("%lu blocks kept\n", nkept);
    return 0;
}
