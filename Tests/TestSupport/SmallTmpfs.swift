import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A small tmpfs mounted by the test (it runs as root) where brokerd keeps its state, so that a
/// test can fill the disk to the last byte (`fill`) and free it again (`free`). The caller
/// unmounts it (`unmount`) on every exit path.
public final class SmallTmpfs: Sendable {
    public let path: String
    /// The file that fills the filesystem.
    private var filler: String { path + "/filler" }

    /// Mounts a tmpfs of `kibibytes` at `path` (created), mode 0700; throws when not permitted.
    public init(at path: String, kibibytes: Int) throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        let mounted = try ChildProcess.run(
            "/usr/bin/mount", ["-t", "tmpfs", "-o", "size=\(kibibytes)k,mode=0700", "tmpfs", path],
            environment: ProcessInfo.processInfo.environment)
        guard mounted.status == 0 else { throw HarnessError("cannot mount a tmpfs at \(path): \(mounted.output)") }
        self.path = path
    }

    /// Fills the filesystem to the last byte: a filler file written until `ENOSPC`, in ever
    /// smaller writes; then cut by `leaving` bytes, which are free again.
    public func fill(leaving: Int = 0) throws {
        let fd = open(filler, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw HarnessError("cannot create \(filler): errno \(errno)") }
        defer { close(fd) }
        let chunk = [UInt8](repeating: 0x5a, count: 64 * 1024)
        for size in [chunk.count, 4096, 1] {
            while chunk.withUnsafeBytes({ write(fd, $0.baseAddress, size) }) > 0 {}
            guard errno == ENOSPC else { throw HarnessError("cannot fill \(path): errno \(errno)") }
        }
        guard leaving > 0 else { return }
        let size = lseek(fd, 0, SEEK_END)
        guard ftruncate(fd, max(0, size - off_t(leaving))) == 0 else {
            throw HarnessError("cannot cut \(filler): errno \(errno)")
        }
    }

    /// Bytes still free for an unprivileged writer.
    public var freeBytes: Int {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return -1 }
        return Int(info.f_bavail) * Int(info.f_frsize)
    }

    /// Removes the filler: the space is free again.
    public func free() {
        unlink(filler)
    }

    /// Unmounts the filesystem (lazily if something still holds it open).
    public func unmount() {
        let environment = ProcessInfo.processInfo.environment
        if (try? ChildProcess.run("/usr/bin/umount", [path], environment: environment))?.status != 0 {
            _ = try? ChildProcess.run("/usr/bin/umount", ["-l", path], environment: environment)
        }
    }
}
