import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A vault problem, with a message that says what to do; never contains a secret.
public struct VaultError: Error, CustomStringConvertible, Sendable {
    public let description: String

    init(_ description: String) { self.description = description }
}

/// The encrypted file holding every account and secret.
///
/// Layout: an 8-byte magic, a 2-byte big-endian format version and a 24-byte nonce form the
/// header; the rest is XChaCha20-Poly1305 ciphertext of the JSON state, with the header as
/// associated data. Opening a vault takes an exclusive lock, so a second broker on the same
/// vault refuses to start instead of burning one-time refresh tokens.
public final class Vault: @unchecked Sendable {
    static let magic = Array("TKBVAULT".utf8)
    static let formatVersion: UInt16 = 1
    static let headerLength = magic.count + 2 + Sodium.nonceLength

    public let path: String
    private let key: SecretKey
    private let lockDescriptor: Int32

    /// Opens (without reading) the vault at `path`, creating its directory, and takes its lock.
    public init(path: String, key: SecretKey) throws {
        self.path = path
        self.key = key
        try FileSystem.makeDirectory(URL(fileURLWithPath: path).deletingLastPathComponent().path)
        let lockPath = path + ".lock"
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw VaultError("cannot open \(lockPath): \(FileSystem.errnoText())") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw VaultError(
                "another brokerd is already using the vault \(path); stop it first (two brokers would burn one-time refresh tokens)"
            )
        }
        lockDescriptor = fd
    }

    deinit { close(lockDescriptor) }

    /// Reads and decrypts the vault; `nil` when no vault file exists yet. Never modifies the file.
    public func load() throws -> VaultContents? {
        guard let file = FileManager.default.contents(atPath: path) else {
            if FileManager.default.fileExists(atPath: path) {
                throw VaultError("cannot read the vault \(path)")
            }
            return nil
        }
        let bytes = [UInt8](file)
        guard bytes.count >= Self.headerLength + Sodium.tagLength, Array(bytes.prefix(Self.magic.count)) == Self.magic
        else {
            throw VaultError("\(path) is not a tokenbroker vault (bad header); it was left untouched")
        }
        let version = UInt16(bytes[8]) << 8 | UInt16(bytes[9])
        guard version == Self.formatVersion else {
            throw VaultError(
                "the vault \(path) has format version \(version); this brokerd reads version \(Self.formatVersion); it was left untouched")
        }
        let header = Array(bytes.prefix(Self.headerLength))
        let nonce = Array(header.suffix(Sodium.nonceLength))
        guard var plaintext = Sodium.open(Array(bytes.dropFirst(Self.headerLength)), associatedData: header, nonce: nonce, key: key)
        else {
            throw VaultError(
                "the vault \(path) cannot be decrypted: the key is wrong or the file was modified; it was left untouched")
        }
        defer { Sodium.wipe(&plaintext) }
        do {
            return try JSONDecoder().decode(VaultContents.self, from: plaintext)
        } catch {
            throw VaultError("the vault \(path) decrypted but its contents are not understood")
        }
    }

    /// Encrypts `contents` under a fresh nonce and replaces the vault atomically and durably.
    public func save(_ contents: VaultContents) throws {
        var plaintext = try JSONEncoder().encode(contents)
        defer { Sodium.wipe(&plaintext) }
        var header = Self.magic
        header += [UInt8(Self.formatVersion >> 8), UInt8(Self.formatVersion & 0xFF)]
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        header += nonce
        var file = Data(header)
        file.append(Sodium.seal(plaintext, associatedData: header, nonce: nonce, key: key))
        try FileSystem.writeAtomically(file, to: path)
    }
}

/// Everything the vault holds.
public struct VaultContents: Codable, Sendable, Equatable {
    public var accounts: [AccountRecord]

    public init(accounts: [AccountRecord]) { self.accounts = accounts }
}
