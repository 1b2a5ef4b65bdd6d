import FoundationEssentials
import Synchronization

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
    /// The sequence number of the last state read or written, and whether the last `load`
    /// completed an interrupted save.
    private let state = Mutex<(sequence: UInt64, recovered: Bool)>((0, false))

    /// Opens (without reading) the vault at `path`, creating its directory (see
    /// `FileSystem.preparePrivateDirectory`), and takes its lock.
    public init(path: String, key: SecretKey) throws {
        self.path = path
        self.key = key
        try FileSystem.preparePrivateDirectory(
            FileSystem.parent(of: path), role: "vault directory",
            remedy: "set TOKENBROKER_VAULT (or --vault) to a path in a directory only you can write")
        let lockPath = path + ".lock"
        let fd = try FileSystem.openPrivateFile(lockPath, role: "vault lock", flags: O_RDWR | O_CREAT)
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw VaultError(
                "another brokerd is already using the vault \(path); stop it first (two brokers would burn one-time refresh tokens)"
            )
        }
        lockDescriptor = fd
    }

    deinit { close(lockDescriptor) }

    /// Reads and decrypts the vault; `nil` when no vault file exists yet. A wrong key or a
    /// modified vault is refused and the file is left untouched. A save that a crash cut off
    /// after writing its staging file but before the rename is completed here: the staging
    /// file is promoted when it authenticates and is the very next save after the vault's
    /// state (see `save`). Any other staging file (torn, foreign, stale, not private, a link)
    /// is deleted, never followed.
    public func load() throws -> VaultContents? {
        let current = try read(path)
        var chosen = current
        var recovered = false
        if let staged = try? read(stagingPath), staged.sequence == (current?.sequence ?? 0) + 1 {
            try FileSystem.promote(stagingPath, to: path)
            chosen = staged
            recovered = true
        } else {
            unlink(stagingPath)
        }
        state.withLock { $0 = (chosen?.sequence ?? 0, recovered) }
        return chosen.map { VaultContents(accounts: $0.accounts) }
    }

    /// Whether the last `load` completed a save that a crash had interrupted.
    public var recoveredInterruptedSave: Bool { state.withLock { $0.recovered } }

    /// Encrypts `contents` under a fresh nonce and replaces the vault atomically and durably:
    /// staging file, fsync, rename, fsync of the directory. Once the staging file is written,
    /// a killed broker loses nothing: `load` promotes it.
    public func save(_ contents: VaultContents) throws {
        let sequence = state.withLock { $0.sequence } + 1
        var plaintext = try JSONEncoder().encode(Stored(sequence: sequence, accounts: contents.accounts))
        defer { Sodium.wipe(&plaintext) }
        var header = Self.magic
        header += [UInt8(Self.formatVersion >> 8), UInt8(Self.formatVersion & 0xFF)]
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        header += nonce
        var file = Data(header)
        file.append(Sodium.seal(plaintext, associatedData: header, nonce: nonce, key: key))
        try FileSystem.writeAtomically(file, to: path, staging: stagingPath)
        state.withLock { $0.sequence = sequence }
    }

    /// Where `save` writes before renaming over the vault.
    var stagingPath: String { path + ".next" }

    /// Reads, authenticates and decodes one vault file; `nil` when it does not exist. The file
    /// must be a private regular file of this user (see `FileSystem.openPrivateFile`).
    private func read(_ path: String) throws -> Stored? {
        guard let file = try FileSystem.readPrivateFile(path, role: "vault") else { return nil }
        let bytes = [UInt8](file)
        guard bytes.count >= Self.headerLength + Sodium.tagLength, Array(bytes.prefix(Self.magic.count)) == Self.magic
        else {
            throw VaultError("\(path) is not a tokenbroker vault (bad header); it was left untouched")
        }
        let version = UInt16(bytes[8]) << 8 | UInt16(bytes[9])
        guard version == Self.formatVersion else {
            throw VaultError(
                "the vault \(path) has format version \(version); this brokerd reads version \(Self.formatVersion); it was left untouched"
            )
        }
        let header = Array(bytes.prefix(Self.headerLength))
        let nonce = Array(header.suffix(Sodium.nonceLength))
        guard
            var plaintext = Sodium.open(
                Array(bytes.dropFirst(Self.headerLength)), associatedData: header, nonce: nonce, key: key)
        else {
            throw VaultError(
                "the vault \(path) cannot be decrypted: the key is wrong or the file was modified; it was left untouched"
            )
        }
        defer { Sodium.wipe(&plaintext) }
        do {
            return try JSONDecoder().decode(Stored.self, from: plaintext)
        } catch {
            throw VaultError("the vault \(path) decrypted but its contents are not understood")
        }
    }

    /// The plaintext of a vault file. `sequence` grows with every save (absent in vaults
    /// written before it existed), so a staged file can be told apart from an older one.
    private struct Stored: Codable {
        var sequence: UInt64?
        var accounts: [AccountRecord]
    }
}

/// Everything the vault holds.
public struct VaultContents: Codable, Sendable, Equatable {
    public var accounts: [AccountRecord]

    public init(accounts: [AccountRecord]) { self.accounts = accounts }
}
