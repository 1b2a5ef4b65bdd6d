import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// A file holding one access token and nothing else, mode 0600, under a directory that only its
/// owner can write (`$XDG_RUNTIME_DIR/tokenbroker/`, the socket's). It is created under a
/// random name with `O_CREAT | O_EXCL | O_NOFOLLOW` and replaced whole (a new file renamed
/// over it), so a reader never sees half a token.
final class TokenFile {
    /// The file's path.
    let path: String
    private let name: String
    /// The directory, held open so that renames and the removal act on the one that was checked.
    private let directory: Int32

    /// Writes `token` to a new file in `directoryPath`, creating the directory (0700) if it
    /// does not exist; refuses a directory that is a symlink, another user's, or writable by others.
    init(in directoryPath: String, token: String) throws {
        if mkdir(directoryPath, 0o700) != 0, errno != EEXIST {
            throw BridgeFailure("cannot create \(directoryPath): \(String(cString: strerror(errno)))")
        }
        directory = open(directoryPath, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard directory >= 0 else {
            throw BridgeFailure("cannot open \(directoryPath): \(String(cString: strerror(errno)))")
        }
        var facts = stat()
        guard fstat(directory, &facts) == 0, facts.st_uid == getuid(), facts.st_mode & 0o022 == 0 else {
            close(directory)
            throw BridgeFailure("\(directoryPath) must be a directory of yours that no one else can write")
        }
        name = Self.randomName()
        path = directoryPath + "/" + name
        do {
            try write(token, as: name)
        } catch {
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

    /// Deletes the file.
    func remove() { unlinkat(directory, name, 0) }

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
