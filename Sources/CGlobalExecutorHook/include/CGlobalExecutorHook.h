#ifndef TOKENBROKER_GLOBAL_EXECUTOR_HOOK_H
#define TOKENBROKER_GLOBAL_EXECUTOR_HOOK_H

/// Sets the Swift runtime's `swift_task_enqueueGlobal_hook` to `hook` (a Swift function of the
/// hook's type) if no hook is set yet; returns 1 when it was set, 0 when another was there.
int tokenbroker_install_enqueue_global_hook(const void *hook);

#endif
