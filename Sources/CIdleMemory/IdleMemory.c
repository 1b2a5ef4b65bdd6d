// brokerd's idle memory: a trimmed heap, and no start-up code left mapped (see CIdleMemory.h).

#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "CIdleMemory.h"

void tokenbroker_keep_heap_trimmed(void) { mallopt(M_TRIM_THRESHOLD, 128 * 1024); }

/// Whether the loader wrote into the object's code (text relocations): its read-only pages then
/// differ from the file's.
static int has_text_relocations(const struct dl_phdr_info *info) {
    for (int index = 0; index < info->dlpi_phnum; index++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[index];
        if (header->p_type != PT_DYNAMIC) continue;
        for (const ElfW(Dyn) *entry = (const ElfW(Dyn) *)(info->dlpi_addr + header->p_vaddr);
             entry->d_tag != DT_NULL; entry++) {
            if (entry->d_tag == DT_TEXTREL) return 1;
            if (entry->d_tag == DT_FLAGS && (entry->d_un.d_val & DF_TEXTREL)) return 1;
        }
    }
    return 0;
}

static int release_object(struct dl_phdr_info *info, size_t size, void *released) {
    (void)size;
    // The executable has an empty name and every library a path; the vDSO ("linux-vdso.so.1")
    // is the kernel's own mapping and is left alone.
    if (info->dlpi_name == NULL || (info->dlpi_name[0] != '\0' && info->dlpi_name[0] != '/')) return 0;
    if (has_text_relocations(info)) return 0;
    long page_size = sysconf(_SC_PAGESIZE);
    if (page_size <= 0) return 0;
    uintptr_t page = (uintptr_t)page_size;
    for (int index = 0; index < info->dlpi_phnum; index++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[index];
        if (header->p_type != PT_LOAD || (header->p_flags & PF_W) || header->p_filesz == 0) continue;
        // Whole pages of the file's bytes only: a page shared with a neighbour keeps its mapping,
        // and so does one the loader zero-filled past the file's end (memsz > filesz).
        uintptr_t start = info->dlpi_addr + header->p_vaddr;
        uintptr_t end = start + header->p_filesz;
        start = (start + page - 1) & ~(page - 1);
        end &= ~(page - 1);
        if (end > start && madvise((void *)start, end - start, MADV_DONTNEED) == 0) {
            *(size_t *)released += end - start;
        }
    }
    return 0;
}

size_t tokenbroker_release_idle_memory(void) {
    size_t released = 0;
    dl_iterate_phdr(release_object, &released);
    malloc_trim(0);
    return released;
}
