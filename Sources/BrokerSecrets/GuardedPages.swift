import BrokerModel
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Whole pages for secrets, mapped by the broker itself: each region between two inaccessible
/// guard pages, left out of core dumps (`MADV_DONTDUMP`) and of forked children
/// (`MADV_WIPEONFORK`), locked in RAM when `RLIMIT_MEMLOCK` allows, and read-only except while
/// it is written. libsodium's `sodium_malloc` does the same but ignores a failed `mlock`; here
/// the caller learns of it (docs/security.md, "Secrets in memory").
package final class GuardedPages: Sendable {
    /// A mapped region: `size` bytes at `start`, a guard page on each side.
    package struct Region: Hashable, @unchecked Sendable {
        package let start: UnsafeMutableRawPointer
        package let size: Int
    }

    package static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))

    /// Bytes this source still maps: unbounded for the broker's own memory; a test gives less
    /// to stand for a kernel that refuses.
    private let budget: Mutex<Int>

    package init(budget: Int = .max) { self.budget = Mutex(budget) }

    /// `count` bytes (rounded up to whole pages) of zeros, read-only, with the errno of `mlock`
    /// when it could not lock them; `nil` when the kernel (or the budget) refuses the memory.
    package func map(_ count: Int) -> (region: Region, lockError: Int32?)? {
        let page = Self.pageSize
        let size = max(page, (count + page - 1) / page * page)
        let granted = budget.withLock { left in
            guard left >= size else { return false }
            left -= size
            return true
        }
        guard granted else { return nil }
        guard let base = mmap(nil, size + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
            base != UnsafeMutableRawPointer(bitPattern: -1)
        else {
            budget.withLock { $0 += size }
            return nil
        }
        let start = base + page
        guard mprotect(start, size, PROT_READ | PROT_WRITE) == 0 else {
            munmap(base, size + 2 * page)
            budget.withLock { $0 += size }
            return nil
        }
        _ = madvise(start, size, MADV_DONTDUMP)
        _ = madvise(start, size, MADV_WIPEONFORK)
        let lockError = mlock(start, size) == 0 ? nil : errno
        mprotect(start, size, PROT_READ)
        return (Region(start: start, size: size), lockError)
    }

    /// Wipes `region` and gives it back with its guard pages.
    package func unmap(_ region: Region) {
        makeWritable(region)
        Sodium.wipe(UnsafeMutableRawBufferPointer(start: region.start, count: region.size))
        munmap(region.start - Self.pageSize, region.size + 2 * Self.pageSize)
        budget.withLock { $0 += region.size }
    }

    /// Makes `region` writable, until `makeReadOnly`.
    package func makeWritable(_ region: Region) { mprotect(region.start, region.size, PROT_READ | PROT_WRITE) }

    /// Makes `region` read-only again.
    package func makeReadOnly(_ region: Region) { mprotect(region.start, region.size, PROT_READ) }
}
