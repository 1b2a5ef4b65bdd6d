import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// A file holding one access token and nothing else, mode 0600, alone in a directory of its own
/// that only its owner can use (made by `mkdtemp`: mode 0700, under a name no one could take
/// first). It is created under a random name with `O_CREAT | O_EXCL | O_NOFOLLOW` and replaced
/// whole (a new file renamed over it), so a reader never sees half a token.
final class TokenFile {
    /// The file's path.
    let path: String
    private let name: String
    /// The directory's path, and the directory held open so that renames and the removal act on
    /// the one that was checked.
    private let directoryPath: String
    private let directory: Int32

    /// Writes `token` to a file in a new directory `tokenbroker-exec-XXXXXX` under `base`.
    init(inNewDirectoryUnder base: String, token: String) throws {
        var template = Array((base + "/tokenbroker-exec-XXXXXX").utf8CString)
        let made = template.withUnsafeMutableBufferPointer { buffer in
            mkdtemp(buffer.baseAddress!).map { String(cString: $0) }
        }
        guard let made else {
            throw BridgeFailure("cannot create a directory in \(base): \(String(cString: strerror(errno)))")
        }
        directoryPath = made
        directory = open(directoryPath, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard directory >= 0 else {
            let reason = String(cString: strerror(errno))
            rmdir(directoryPath)
            throw BridgeFailure("cannot open \(directoryPath): \(reason)")
        }
        name = Self.randomName()
        path = directoryPath + "/" + name
        var facts = stat()
        do {
            guard fstat(directory, &facts) == 0, facts.st_uid == getuid(), facts.st_mode & 0o077 == 0 else {
                throw BridgeFailure("\(directoryPath) must be a directory of yours that no one else can use")
            }
            try write(token, as: name)
        } catch {
            rmdir(directoryPath)
            close(directory)
            throw error
        }
    }

    deinit { close(directory) }

    /// Replaces the file's content with `token` at once (rename over it).
    func replace(with token: String) throws {
        let temporary = Self.randomName()
        try write(token, as: temporary)
        guard renameat(directory, temporary, directory, name) == 0 else {
            let reason = String(cString: strerror(errno))
            unlinkat(directory, temporary, 0)
            throw BridgeFailure("cannot replace \(path): \(reason)")
        }
    }

    /// Deletes the file and its directory.
    func remove() {
        unlinkat(directory, name, 0)
        rmdir(directoryPath)
    }

    /// A new file `name` in the directory holding exactly `token`.
    private func write(_ token: String, as name: String) throws {
        let fd = openat(directory, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw BridgeFailure("cannot create \(name): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard StandardStream(descriptor: fd).write(token) else {
            let reason = String(cString: strerror(errno))
            unlinkat(directory, name, 0)
            throw BridgeFailure("cannot write \(name): \(reason)")
        }
    }

    /// `bearer-` and 128 random bits in hex.
    private static func randomName() -> String {
        var generator = SystemRandomNumberGenerator()
        let bits = (0..<2).map { _ in String(generator.next() as UInt64, radix: 16) }
        return "bearer-" + bits.map { String(repeating: "0", count: 16 - $0.count) + $0 }.joined()
    }
}
