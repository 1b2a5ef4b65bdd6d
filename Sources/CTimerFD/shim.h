// timerfd_create(2) and timerfd_settime(2), which the Glibc module does not export.
#include <sys/timerfd.h>
