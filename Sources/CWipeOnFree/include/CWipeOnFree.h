#ifndef TOKENBROKER_WIPE_ON_FREE_H
#define TOKENBROKER_WIPE_ON_FREE_H

/// Whether this program's `free` and `realloc` wipe every block they give back (always 1 once
/// linked); brokerd calls it at start so that the linker keeps the definitions.
int tokenbroker_wipe_on_free(void);

/// Keeps glibc's trim threshold at 128 KiB, so that freed pages at the top of the heap go back
/// to the system. glibc raises the threshold after the first large block is freed; brokerd
/// frees large blocks at start (the vault's plaintext, the reader's buffers), and the pages
/// they left were kept: 2.4 MiB with 1,000 accounts. (Swift's Glibc module has no `mallopt`.)
void tokenbroker_keep_heap_trimmed(void);

#endif
