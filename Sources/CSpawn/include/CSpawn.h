#include <spawn.h>

/* posix_spawn_file_actions_addclosefrom_np (glibc 2.34) is declared only under _GNU_SOURCE,
   which Swift's Glibc module does not set; this wrapper makes it callable. */
int tokenbroker_spawn_close_from(posix_spawn_file_actions_t *actions, int lowest);
