/* Prints what the memgap agent records about each loaded module, and named
 * code addresses, so a test can symbolize them after the process is gone:
 *   module <base> <size> <build-id hex> <path>
 *   address <name> <address>
 * base is dlpi_addr + the lowest PT_LOAD's p_vaddr, as the agent records it. */
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Returns whether it found and printed the build-id. */
static int print_build_id(const unsigned char *notes, size_t length) {
    while (length >= 12) {
        uint32_t name_length, desc_length, type;
        memcpy(&name_length, notes, 4);
        memcpy(&desc_length, notes + 4, 4);
        memcpy(&type, notes + 8, 4);
        size_t desc_start = 12 + ((name_length + 3) & ~3u);
        size_t next = desc_start + ((desc_length + 3) & ~3u);
        if (next > length) return 0;
        if (type == 3 /* NT_GNU_BUILD_ID */ && name_length == 4 && memcmp(notes + 12, "GNU", 4) == 0) {
            for (uint32_t i = 0; i < desc_length; i++) printf("%02x", notes[desc_start + i]);
            return 1;
        }
        notes += next;
        length -= next;
    }
    return 0;
}

static int print_module(struct dl_phdr_info *info, size_t size, void *first) {
    (void)size;
    uintptr_t low = UINTPTR_MAX, high = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[i];
        if (header->p_type == PT_LOAD) {
            if (header->p_vaddr < low) low = header->p_vaddr;
            if (header->p_vaddr + header->p_memsz > high) high = header->p_vaddr + header->p_memsz;
        }
    }
    char path[4096] = "";
    if (*(int *)first) {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        path[n > 0 ? n : 0] = 0;
        *(int *)first = 0;
    } else {
        snprintf(path, sizeof path, "%s", info->dlpi_name);
    }
    printf("module %#lx %#lx ", (unsigned long)(info->dlpi_addr + low), (unsigned long)(high - low));
    /* Several PT_NOTE segments are common (.note.gnu.property comes first). */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[i];
        const unsigned char *notes = (const unsigned char *)(info->dlpi_addr + header->p_vaddr);
        if (header->p_type == PT_NOTE && print_build_id(notes, header->p_memsz)) break;
    }
    printf(" %s\n", path);
    return 0;
}

static void report_modules(void) {
    int first = 1;
    dl_iterate_phdr(print_module, &first);
}

static void report_address(const char *name, const void *address) {
    printf("address %s %#lx\n", name, (unsigned long)(uintptr_t)address);
}
