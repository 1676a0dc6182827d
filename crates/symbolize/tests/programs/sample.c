/* Known functions at known lines for the symbolizer tests. The comments
 * "line: NAME" mark the lines the tests expect; keep them on those lines. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include "report.h"

static const void *captured_return_address;
static volatile int calls;

/* Stands in for a malloc hook: the return address it sees is what the agent
 * would record for the caller's frame. */
__attribute__((noipa)) void capture_caller(void) {
    captured_return_address = __builtin_return_address(0);
    calls++;
}

static inline __attribute__((always_inline)) void inlined_helper(void) {
    capture_caller(); /* line: inlined_call */
    calls++;
}

__attribute__((noipa)) void outer_function(void) {
    inlined_helper(); /* line: outer_call */
    calls++;
}

__attribute__((noipa)) int plain_function(int value) {
    return value * 3 + calls; /* line: plain_body */
}

int main(void) {
    outer_function();
    report_modules();
    report_address("plain_function", (const void *)plain_function);
    report_address("outer_return", captured_return_address);
    report_address("malloc", dlsym(RTLD_DEFAULT, "malloc"));
    return plain_function(0) >= 0 ? 0 : 1;
}
