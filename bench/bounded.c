// bounded: runs a benchmark step with a time limit and leaves no process behind.
//
//   bounded SECONDS COMMAND [ARGUMENTS...]
//
// COMMAND runs in a process group of its own. bounded is a child subreaper, so whatever COMMAND
// starts and abandons (a server started with setsid, say) becomes bounded's child instead of
// PID 1's, which does not wait for anyone here. When COMMAND exits, when SECONDS pass, or when
// bounded gets SIGINT, SIGTERM or SIGHUP, COMMAND's group and every process left over get
// SIGTERM, then SIGKILL after 10 s, and all of them are waited for.
//
// Exit status: COMMAND's; 124 if the time ran out (as timeout(1)); 125 if COMMAND could not
// start; 128 + the signal if bounded was interrupted. Compiled by bench/run with gcc -O2.
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static pid_t command_pid;
static int command_status = -1;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

// Waits for every child that has ended; returns 1 while children are left.
static int reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      if (pid == command_pid) command_status = status;
      continue;
    }
    if (pid == 0) return 1;
    if (errno == EINTR) continue;
    return 0;  // ECHILD: none left
  }
}

// Sends `sig` to COMMAND's group and to every process whose parent is bounded.
static void signal_leftovers(int sig) {
  kill(-command_pid, sig);
  DIR *proc = opendir("/proc");
  if (!proc) return;
  struct dirent *entry;
  while ((entry = readdir(proc))) {
    if (!isdigit((unsigned char)entry->d_name[0])) continue;
    char path[300], stat[512];
    snprintf(path, sizeof path, "/proc/%s/stat", entry->d_name);
    FILE *file = fopen(path, "re");
    if (!file) continue;
    size_t length = fread(stat, 1, sizeof stat - 1, file);
    fclose(file);
    stat[length] = 0;
    char *end = strrchr(stat, ')');  // the name may hold spaces and parentheses
    int parent;
    if (end && sscanf(end + 1, " %*c %d", &parent) == 1 && parent == getpid()) kill(atoi(entry->d_name), sig);
  }
  closedir(proc);
}

// Waits up to `seconds` for all children to end; returns 1 if some are left.
static int wait_for_children(const sigset_t *signals, double seconds) {
  double deadline = now() + seconds;
  while (reap()) {
    if (now() >= deadline) return 1;
    struct timespec pause = {0, 50 * 1000 * 1000};
    sigtimedwait(signals, NULL, &pause);  // a SIGCHLD ends the pause early
  }
  return 0;
}

int main(int argc, char **argv) {
  char *end;
  double seconds = argc >= 3 ? strtod(argv[1], &end) : NAN;
  if (argc < 3 || *end || !isfinite(seconds) || seconds < 1 || seconds > 3600) {
    fprintf(stderr, "usage: bounded SECONDS(1-3600) COMMAND [ARGUMENTS...]\n");
    return 125;
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) { perror("bounded: prctl"); return 125; }
  sigset_t signals, none;
  sigemptyset(&signals);
  sigemptyset(&none);
  int handled[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
  for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++) sigaddset(&signals, handled[i]);
  sigprocmask(SIG_BLOCK, &signals, NULL);

  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setsigmask(&attributes, &none);
  int failed = posix_spawnp(&command_pid, argv[2], NULL, &attributes, argv + 2, environ);
  posix_spawnattr_destroy(&attributes);
  if (failed) {
    fprintf(stderr, "bounded: cannot start %s: %s\n", argv[2], strerror(failed));
    return 125;
  }

  int outcome = 0;  // 0: COMMAND ended; 124: out of time; 128 + n: signal n
  double deadline = now() + seconds;
  while (reap() && command_status == -1) {
    double left = deadline - now();
    if (left <= 0) { outcome = 124; break; }
    struct timespec pause = {0, (long)(fmin(left, 0.1) * 1e9)};
    int sig = sigtimedwait(&signals, NULL, &pause);
    if (sig > 0 && sig != SIGCHLD) { outcome = 128 + sig; break; }
  }
  if (outcome == 124) fprintf(stderr, "bounded: %s ran out of time (%g s)\n", argv[2], seconds);

  signal_leftovers(SIGTERM);
  if (wait_for_children(&signals, 10)) {
    while (reap()) {  // SIGKILL until none are left (an orphan's orphans land here too)
      signal_leftovers(SIGKILL);
      struct timespec pause = {0, 50 * 1000 * 1000};
      sigtimedwait(&signals, NULL, &pause);
    }
  }
  if (outcome) return outcome;
  if (WIFEXITED(command_status)) return WEXITSTATUS(command_status);
  return 128 + WTERMSIG(command_status);
}
