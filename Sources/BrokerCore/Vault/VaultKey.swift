import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// Finds or creates the vault key file (docs/install.md, "Files").
public enum VaultKey {
    /// Reads the 32-byte key at `path`; when `create` is set and no file exists, makes one
    /// with fresh random bytes, mode 0600, in a private directory. Like ssh with a private
    /// key, refuses a link, a file of another uid, or one that others can read or write
    /// (systemd's `LoadCredential=` files are the user's own, mode 0400).
    public static func load(path: String, create: Bool) throws -> SecretKey {
        guard var bytes = try FileSystem.readPrivateFile(path, role: "vault key") else {
            guard create else { throw VaultError("no vault key at \(path)") }
            return try generate(at: path)
        }
        defer { Sodium.wipe(&bytes) }
        guard bytes.count == Sodium.keyLength, let key = SecretKey(bytes: bytes) else {
            throw VaultError(
                "the vault key at \(path) is \(bytes.count) bytes; a key is exactly \(Sodium.keyLength) bytes")
        }
        return key
    }

    /// Writes a fresh random key to `path`, which must not exist yet, and returns it.
    private static func generate(at path: String) throws -> SecretKey {
        try FileSystem.preparePrivateDirectory(
            FileSystem.parent(of: path), role: "vault key directory",
            remedy: "set TOKENBROKER_KEY_FILE (or --key-file) to a path in a directory only you can write")
        var bytes = Sodium.randomBytes(Sodium.keyLength)
        defer { _ = bytes.withUnsafeMutableBytes { $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        let fd = try FileSystem.openPrivateFile(path, role: "vault key", flags: O_WRONLY | O_CREAT | O_EXCL)
        defer { close(fd) }
        guard write(fd, bytes, bytes.count) == bytes.count, fsync(fd) == 0 else {
            throw VaultError("cannot write the vault key at \(path): \(FileSystem.errnoText())")
        }
        guard let key = SecretKey(bytes: bytes) else { throw VaultError("cannot hold the vault key in locked memory") }
        return key
    }
}
