import BrokerModel
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// A file that holds one 32-byte key and nothing else (the vault key, the fleet key). Like ssh
/// with a private key, a link, a file of another uid, or one that others can read or write is
/// refused (systemd's `LoadCredential=` files are the user's own, mode 0400).
package enum SecretKeyFile {
    /// The key at `path`, in guarded memory; `nil` when there is no file. `role` names the file
    /// in errors, which `refuse` makes.
    package static func read(_ path: String, role: String, refuse: (String) -> any Error) throws -> SecretKey? {
        guard var bytes = try FileSystem.readPrivateFile(path, role: role) else { return nil }
        defer { Sodium.wipe(&bytes) }
        guard bytes.count == Sodium.keyLength, let key = SecretKey(bytes: bytes) else {
            throw refuse("the \(role) at \(path) is \(bytes.count) bytes; a key is exactly \(Sodium.keyLength) bytes")
        }
        return key
    }

    /// Writes fresh random bytes to `path`, which must not exist yet (mode 0600, fsynced, in a
    /// private directory: `remedy` says how to choose another), and returns them as a key.
    package static func create(at path: String, role: String, remedy: String, refuse: (String) -> any Error) throws
        -> SecretKey
    {
        try FileSystem.preparePrivateDirectory(FileSystem.parent(of: path), role: "\(role) directory", remedy: remedy)
        var bytes = Sodium.randomBytes(Sodium.keyLength)
        defer { Sodium.wipe(&bytes) }
        let fd = try FileSystem.openPrivateFile(path, role: role, flags: O_WRONLY | O_CREAT | O_EXCL)
        defer { close(fd) }
        guard write(fd, bytes, bytes.count) == bytes.count, fsync(fd) == 0 else {
            throw refuse("cannot write the \(role) at \(path): \(FileSystem.errnoText())")
        }
        guard let key = SecretKey(bytes: bytes) else { throw refuse("cannot hold the \(role) in locked memory") }
        return key
    }
}
