import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Small POSIX helpers for durable, private files.
enum FileSystem {
    /// Creates `path` and its parents with mode 0700 (existing directories are left as they are).
    static func makeDirectory(_ path: String) throws {
        do {
            try FileManager.default.createDirectory(
                atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw VaultError("cannot create directory \(path): \(error.localizedDescription)")
        }
    }

    /// Replaces `path` with `data` so that a crash leaves either the old or the new file:
    /// `staging` written and fsync'd, renamed over `path`, then the directory fsync'd.
    static func writeAtomically(_ data: Data, to path: String, staging: String) throws {
        let fd = open(staging, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw VaultError("cannot write \(staging): \(errnoText())") }
        let written = data.withUnsafeBytes { write(fd, $0.baseAddress, data.count) }
        guard written == data.count, fsync(fd) == 0 else {
            let reason = errnoText()
            close(fd)
            unlink(staging)
            throw VaultError("cannot write \(staging): \(reason)")
        }
        close(fd)
        do {
            try rename(staging, over: path)
        } catch {
            unlink(staging)
            throw error
        }
    }

    /// Makes a complete `staging` file durable and renames it over `path`.
    static func promote(_ staging: String, to path: String) throws {
        let fd = open(staging, O_RDONLY | O_CLOEXEC)
        guard fd >= 0, fsync(fd) == 0 else {
            let reason = errnoText()
            if fd >= 0 { close(fd) }
            throw VaultError("cannot sync \(staging): \(reason)")
        }
        close(fd)
        try rename(staging, over: path)
    }

    /// Renames `staging` over `path` and fsyncs the directory, so the rename is durable. A
    /// failed rename leaves `staging` in place.
    private static func rename(_ staging: String, over path: String) throws {
        guard Glibc.rename(staging, path) == 0 else {
            throw VaultError("cannot replace \(path): \(errnoText())")
        }
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directoryFD >= 0 else { throw VaultError("cannot open \(directory): \(errnoText())") }
        defer { close(directoryFD) }
        guard fsync(directoryFD) == 0 else { throw VaultError("cannot sync \(directory): \(errnoText())") }
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }
}
