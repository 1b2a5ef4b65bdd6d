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
    /// temp file, fsync, rename, fsync of the directory.
    static func writeAtomically(_ data: Data, to path: String) throws {
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
        let temporary = "\(path).tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw VaultError("cannot write \(temporary): \(errnoText())") }
        let written = data.withUnsafeBytes { write(fd, $0.baseAddress, data.count) }
        guard written == data.count, fsync(fd) == 0 else {
            let reason = errnoText()
            close(fd)
            unlink(temporary)
            throw VaultError("cannot write \(temporary): \(reason)")
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let reason = errnoText()
            unlink(temporary)
            throw VaultError("cannot replace \(path): \(reason)")
        }
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directoryFD >= 0 else { throw VaultError("cannot open \(directory): \(errnoText())") }
        defer { close(directoryFD) }
        guard fsync(directoryFD) == 0 else { throw VaultError("cannot sync \(directory): \(errnoText())") }
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }
}
