import FoundationEssentials

/// The vault's snapshot file: every account at one generation, sealed as one piece.
///
/// Layout: an 8-byte magic, a 2-byte big-endian format version and a 24-byte nonce form the
/// header; the rest is XChaCha20-Poly1305 ciphertext of the JSON state (its generation and
/// accounts), with the header as associated data. In format 1 this file was the whole vault;
/// in format 2 the changes saved since the snapshot follow in its `VaultLog`, which names the
/// snapshot by its generation and nonce.
struct VaultSnapshot {
    static let magic = Array("TKBVAULT".utf8)
    /// The format written: a snapshot followed by a log.
    static let formatVersion: UInt16 = 2
    /// The format before the log, read only to be converted.
    static let singleFileVersion: UInt16 = 1
    static let headerLength = magic.count + 2 + Sodium.nonceLength
    /// Generations stay below this, so counting on never overflows.
    static let generationLimit = UInt64(Int64.max)

    var version: UInt16
    /// Grows by one with each snapshot, so a staged snapshot can be told apart from an older one.
    var generation: UInt64
    /// The random nonce of this snapshot's header: what tells it from every other snapshot.
    var nonce: [UInt8]
    var accounts: [AccountRecord]
    /// The file's size in bytes.
    var length: Int

    /// The file holding `accounts` as generation `generation`, sealed under a fresh nonce, and
    /// that nonce.
    static func seal(_ accounts: [AccountRecord], generation: UInt64, key: SecretKey) throws -> (
        file: Data, nonce: [UInt8]
    ) {
        var plaintext = try JSONEncoder().encode(Body(generation: generation, accounts: accounts))
        defer { Sodium.wipe(&plaintext) }
        var header = magic
        header.append(bigEndian: formatVersion)
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        header += nonce
        var file = Data(header)
        file.append(Sodium.seal(plaintext, associatedData: header, nonce: nonce, key: key))
        return (file, nonce)
    }

    /// Authenticates and decodes the snapshot file `bytes` read from `path` (named in errors),
    /// in either format.
    static func open(_ bytes: [UInt8], path: String, key: SecretKey) throws -> VaultSnapshot {
        guard bytes.count >= headerLength + Sodium.tagLength, bytes.starts(with: magic) else {
            throw VaultError("\(path) is not a tokenbroker vault (bad header); it was left untouched")
        }
        let version = bytes.bigEndian(UInt16.self, at: magic.count)
        guard version == formatVersion || version == singleFileVersion else {
            throw VaultError(
                "the vault \(path) has format version \(version); this brokerd reads versions \(singleFileVersion) "
                    + "and \(formatVersion); it was left untouched")
        }
        let header = Array(bytes.prefix(headerLength))
        let nonce = Array(header.suffix(Sodium.nonceLength))
        guard
            var plaintext = Sodium.open(
                Array(bytes.dropFirst(headerLength)), associatedData: header, nonce: nonce, key: key)
        else {
            throw VaultError(
                "the vault \(path) cannot be decrypted: the key is wrong or the file was modified; it was left untouched"
            )
        }
        defer { Sodium.wipe(&plaintext) }
        guard let body = try? JSONDecoder().decode(Body.self, from: plaintext),
            (body.generation ?? 0) < generationLimit
        else {
            throw VaultError("the vault \(path) decrypted but its contents are not understood")
        }
        return VaultSnapshot(
            version: version, generation: body.generation ?? 0, nonce: nonce, accounts: body.accounts,
            length: bytes.count)
    }

    /// The plaintext. `generation` is absent in format 1 vaults written before it existed.
    private struct Body: Codable {
        var generation: UInt64?
        var accounts: [AccountRecord]

        enum CodingKeys: String, CodingKey {
            /// Format 1 called it the save's sequence number.
            case generation = "sequence"
            case accounts
        }
    }
}
