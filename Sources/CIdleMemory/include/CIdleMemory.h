#ifndef TOKENBROKER_IDLE_MEMORY_H
#define TOKENBROKER_IDLE_MEMORY_H

#include <stddef.h>

/// Keeps glibc's trim threshold at 128 KiB, so that freed pages at the top of the heap go back
/// to the system. glibc raises the threshold after the first large block is freed; brokerd
/// frees large blocks at start (the vault's plaintext, the reader's buffers), and the pages
/// they left were kept: 2.4 MiB with 1,000 accounts.
void tokenbroker_keep_heap_trimmed(void);

/// Unmaps the pages of code and read-only data that the process has not used since the last
/// call, and gives free heap pages back (`malloc_trim`). Returns the bytes of segments advised.
///
/// The file bytes of every loaded object's segments that are never written (program headers
/// without `PF_W`, in objects without text relocations) get `MADV_DONTNEED`: their pages equal
/// the file's, so the kernel maps them again from the page cache when they run. Writable
/// segments, and the relocated read-only ones (`PT_GNU_RELRO` lies inside a writable load
/// segment), keep their pages. Start-up runs code steady work never does (the vault reader,
/// argument parsing, the service group's set-up); with fault-around mapping 64 KiB per touched
/// page, that code was most of an idle brokerd's resident memory.
size_t tokenbroker_release_idle_memory(void);

#endif
