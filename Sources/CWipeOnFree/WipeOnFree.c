// brokerd's allocator wipes every heap block before glibc takes it back.
//
// Swift cannot keep every transient copy of a secret out of the heap: JSON encoders and
// decoders, form bodies, `Data` and `String` buffers all hold one for a moment. Those copies
// must not outlive their owner, so `free` zeroes the whole usable block first, and `realloc`
// never lets glibc move a block without wiping the old one. MALLOC_PERTURB_ would not do:
// glibc's per-thread cache (tcache) skips it, and it fills with a byte only when asked.
//
// These definitions live in the executable, so they interpose for every library loaded with
// it (libsodium, libsystemd, and the Swift runtime and Foundation linked in statically); glibc
// calls them for its own internal frees too, as it supports replacing the allocator. They
// delegate to glibc's exported `__libc_*` entry points. Linked only into brokerd.

#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "CWipeOnFree.h"

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *pointer);

void free(void *pointer) {
    if (pointer == NULL) return;
    explicit_bzero(pointer, malloc_usable_size(pointer));
    __libc_free(pointer);
}

void *realloc(void *pointer, size_t size) {
    if (pointer == NULL) return __libc_malloc(size);
    if (size == 0) {
        free(pointer);
        return NULL;
    }
    size_t usable = malloc_usable_size(pointer);
    // Fits: the same block (a shrunk block's tail is wiped when it is freed).
    if (size <= usable) return pointer;
    void *moved = __libc_malloc(size);
    if (moved == NULL) return NULL;
    memcpy(moved, pointer, usable);
    free(pointer);
    return moved;
}

void *reallocarray(void *pointer, size_t count, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(pointer, total);
}

int tokenbroker_wipe_on_free(void) { return 1; }

void tokenbroker_keep_heap_trimmed(void) { mallopt(M_TRIM_THRESHOLD, 128 * 1024); }
