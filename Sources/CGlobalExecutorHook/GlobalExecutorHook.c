#include "CGlobalExecutorHook.h"

#include <stddef.h>

// Defined by the Swift concurrency runtime linked into brokerd. A static standard library keeps
// its symbols out of the dynamic symbol table, where NIO's own take-over looks with dlsym, so
// brokerd sets the hook by name at link time instead.
extern void *swift_task_enqueueGlobal_hook;

int tokenbroker_install_enqueue_global_hook(const void *hook) {
    void *expected = NULL;
    return __atomic_compare_exchange_n(&swift_task_enqueueGlobal_hook, &expected, (void *)hook, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
