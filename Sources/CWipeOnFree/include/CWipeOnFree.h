#ifndef TOKENBROKER_WIPE_ON_FREE_H
#define TOKENBROKER_WIPE_ON_FREE_H

/// Whether this program's `free` and `realloc` wipe every block they give back (always 1 once
/// linked); brokerd calls it at start so that the linker keeps the definitions.
int tokenbroker_wipe_on_free(void);

#endif
