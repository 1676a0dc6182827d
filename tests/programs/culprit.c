/*
 * culprit: three allocation sites with known blame.
 *   site_dense   keeps 8 MiB of contiguous 256-byte blocks: live, dense
 *   site_sparse  allocates 64 MiB of 64-byte blocks, keeps every 64th:
 *                little live, most of its pages otherwise empty
 *   site_temp    allocates 32 MiB and frees all of it
 * Then asks memgap for a snapshot. Built with -O0 so each site keeps its
 * own frame and line.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *keep[1 << 20];
static int kept;

static void site_dense(void) {
    for (int i = 0; i < (8 << 20) / 256; i++) {
        char *block = malloc(256); /* SITE_DENSE */
        memset(block, 1, 256);
        keep[kept++] = block;
    }
}

static void site_sparse(void) {
    int count = (64 << 20) / 64;
    void **blocks = calloc(count, sizeof *blocks);
    for (int i = 0; i < count; i++) {
        blocks[i] = malloc(64); /* SITE_SPARSE */
        memset(blocks[i], 2, 64);
    }
    for (int i = 0; i < count; i++) {
        if (i % 64 == 0) keep[kept++] = blocks[i];
        else free(blocks[i]);
    }
    free(blocks);
}

static void site_temp(void) {
    int count = (32 << 20) / 128;
    void **blocks = calloc(count, sizeof *blocks);
    for (int i = 0; i < count; i++) {
        blocks[i] = malloc(128); /* SITE_TEMP */
        memset(blocks[i], 3, 128);
    }
    for (int i = 0; i < count; i++) free(blocks[i]);
    free(blocks);
}

int main(void) {
    site_dense();
    site_sparse();
    site_temp();
    void (*snapshot)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "memgap_snapshot");
    if (snapshot) snapshot();
    printf("kept %d blocks\n", kept);
    return 0;
}
