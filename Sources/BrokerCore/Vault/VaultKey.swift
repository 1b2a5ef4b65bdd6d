import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Finds or creates the vault key file (CONTRACT section 2).
public enum VaultKey {
    /// Reads the 32-byte key at `path`; when `create` is set and no file exists, makes one
    /// with fresh random bytes, mode 0600, in a 0700 directory.
    public static func load(path: String, create: Bool) throws -> SecretKey {
        if !FileManager.default.fileExists(atPath: path) {
            guard create else { throw VaultError("no vault key at \(path)") }
            try generate(at: path)
        }
        guard var bytes = FileManager.default.contents(atPath: path) else {
            throw VaultError("cannot read the vault key at \(path)")
        }
        defer { Sodium.wipe(&bytes) }
        guard bytes.count == Sodium.keyLength, let key = SecretKey(bytes: [UInt8](bytes)) else {
            throw VaultError(
                "the vault key at \(path) is \(bytes.count) bytes; a key is exactly \(Sodium.keyLength) bytes")
        }
        return key
    }

    private static func generate(at path: String) throws {
        try FileSystem.makeDirectory(URL(fileURLWithPath: path).deletingLastPathComponent().path)
        var bytes = Sodium.randomBytes(Sodium.keyLength)
        defer { _ = bytes.withUnsafeMutableBytes { $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw VaultError("cannot create the vault key at \(path): \(FileSystem.errnoText())") }
        defer { close(fd) }
        guard write(fd, bytes, bytes.count) == bytes.count, fsync(fd) == 0 else {
            throw VaultError("cannot write the vault key at \(path): \(FileSystem.errnoText())")
        }
    }
}
