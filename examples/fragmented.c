// A program whose RSS stays far above what it holds: it builds 400 MB of
// small records, then keeps every tenth. glibc cannot return pages that
// still hold a live record, so RSS stays near the peak.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECORDS 1000000
#define RECORD_SIZE 400

int main(void) {
    static char *records[RECORDS];
    for (int i = 0; i < RECORDS; i++) {
        records[i] = malloc(RECORD_SIZE);
        memset(records[i], i & 0xff, RECORD_SIZE);
    }
    long kept = 0;
    for (int i = 0; i < RECORDS; i++) {
        if (i % 10 == 0) {
            kept += RECORD_SIZE;
        } else {
            free(records[i]);
            records[i] = NULL;
        }
    }
    printf("holding %ld MB in %d records\n", kept >> 20, RECORDS / 10);
    return 0;
}
