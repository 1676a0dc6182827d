/*
 * dlopen_cycle: loads and unloads shared libraries of the system many
 * times (libz, libsqlite3, libm, libexpat, libcrypto — whichever exist),
 * calling a function of each while it is loaded, so the agent sees its
 * module list change under it and allocations made from code that is
 * unmapped again. Prints one line per library; exits 0, or 1 if none loaded.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct library {
    const char *name;
    const char *symbol;
};

int main(void) {
    static const struct library libraries[] = {
        {"libz.so.1", "zlibVersion"},
        {"libsqlite3.so.0", "sqlite3_libversion"},
        {"libm.so.6", "cos"},
        {"libexpat.so.1", "XML_ExpatVersion"},
        {"libcrypto.so.3", "OpenSSL_version_num"},
    };
    int loaded = 0;
    for (size_t i = 0; i < sizeof libraries / sizeof libraries[0]; i++) {
        int cycles = 0;
        for (int round = 0; round < 40; round++) {
            void *handle = dlopen(libraries[i].name, round % 2 ? RTLD_NOW | RTLD_LOCAL : RTLD_LAZY | RTLD_GLOBAL);
            if (handle == NULL) break;
            void *symbol = dlsym(handle, libraries[i].symbol);
            char *note = malloc(64 + round);
            snprintf(note, 64 + round, "%s:%d:%s", libraries[i].name, round, symbol ? "found" : "missing");
            if (symbol != NULL) cycles++;
            free(note);
            if (dlclose(handle) != 0) {
                fprintf(stderr, "dlclose %s: %s\n", libraries[i].name, dlerror());
                return 2;
            }
        }
        printf("%s %s: %d cycles\n", libraries[i].name, cycles ? "loaded" : "absent", cycles);
        loaded += cycles > 0;
    }
    /* A library that does not exist: dlerror must say so, unchanged. */
    void *none = dlopen("libmemgap-no-such-library.so", RTLD_NOW);
    printf("missing library: %s\n", none == NULL ? "refused" : "loaded?");
    return loaded > 0 ? 0 : 1;
}
