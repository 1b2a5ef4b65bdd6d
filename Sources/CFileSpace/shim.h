// fallocate(2) with FALLOC_FL_KEEP_SIZE, which the Glibc module does not export: space allocated
// beyond a file's end without changing its size (the vault log's reserve, protocol/VAULT.md).
#include <errno.h>
#include <linux/falloc.h>
#include <sys/syscall.h>
#include <unistd.h>

/// Allocates `length` bytes from `offset` of `fd` ahead of writes, keeping its size: 0, or the errno.
static inline int tb_allocate_keeping_size(int fd, long long offset, long long length) {
    return syscall(SYS_fallocate, fd, FALLOC_FL_KEEP_SIZE, offset, length) == 0 ? 0 : errno;
}
