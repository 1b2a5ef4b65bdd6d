#include <systemd/sd-daemon.h>
#include <sys/prctl.h>

/* prctl is variadic, which Swift cannot call; this wrapper makes the process non-dumpable. */
static inline int tokenbroker_set_non_dumpable(void) { return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); }
