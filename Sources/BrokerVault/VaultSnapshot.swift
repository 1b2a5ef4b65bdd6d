import BrokerIdP
import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// The vault's snapshot file: every account at one generation, sealed as one piece.
///
/// Layout: an 8-byte magic, a 2-byte big-endian format version and a 24-byte nonce form the
/// header; the rest is XChaCha20-Poly1305 ciphertext of the JSON state (its generation and
/// accounts), with the header as associated data. In format 1 this file was the whole vault;
/// in format 2 the changes saved since the snapshot follow in its `VaultLog`, which names the
/// snapshot by its generation and nonce. Format 3 is format 2 sealed with a key derived from a
/// passphrase: its header holds the `KeyDerivation` between the version and the nonce.
package struct VaultSnapshot {
    package static let magic = Array("TKBVAULT".utf8)
    /// The format written under the key file: a snapshot followed by a log.
    package static let formatVersion: UInt16 = 2
    /// The format written under a passphrase: format 2 with the key's derivation in the header.
    package static let passphraseVersion: UInt16 = 3
    /// The format before the log, read only to be converted.
    package static let singleFileVersion: UInt16 = 1
    /// The header's length in formats 1 and 2.
    package static let headerLength = magic.count + 2 + Sodium.nonceLength
    /// The header's length in format 3.
    package static let passphraseHeaderLength = headerLength + KeyDerivation.encodedLength
    /// Generations stay below this, so counting on never overflows.
    package static let generationLimit = UInt64(Int64.max)

    package var version: UInt16
    /// How the key was derived from a passphrase (format 3); `nil` under the key file.
    package var derivation: KeyDerivation?
    /// Grows by one with each snapshot, so a staged snapshot can be told apart from an older one.
    package var generation: UInt64
    /// The random nonce of this snapshot's header: what tells it from every other snapshot.
    package var nonce: [UInt8]
    package var contents: VaultContents
    /// The file's size in bytes.
    package var length: Int

    /// The file holding `contents` as generation `generation`, sealed under a fresh nonce, and
    /// that nonce: in format 3 when `derivation` (how `key` was derived from a passphrase) is
    /// given, else in format 2.
    package static func seal(
        _ contents: VaultContents, generation: UInt64, key: SecretKey, derivation: KeyDerivation? = nil
    ) throws -> (file: Data, nonce: [UInt8]) {
        var plaintext = try VaultJSONWriter.snapshot(generation: generation, contents)
        defer { Sodium.wipe(&plaintext) }
        return seal(plaintext: plaintext, key: key, derivation: derivation)
    }

    /// The file holding the JSON `plaintext`, sealed as `seal` does, and its nonce.
    package static func seal(plaintext: [UInt8], key: SecretKey, derivation: KeyDerivation? = nil) -> (
        file: Data, nonce: [UInt8]
    ) {
        var header = magic
        if let derivation {
            header.append(bigEndian: passphraseVersion)
            header += derivation.bytes
        } else {
            header.append(bigEndian: formatVersion)
        }
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        header += nonce
        var file = Data(header)
        file.append(Sodium.seal(plaintext, associatedData: header, nonce: nonce, key: key))
        return (file, nonce)
    }

    /// Authenticates and decodes the snapshot file `bytes` read from `path` (named in errors),
    /// in either format; `reader` reads its plaintext.
    package static func open(
        _ bytes: [UInt8], path: String, key: SecretKey, reader: VaultJSONReader = VaultJSONReader()
    )
        throws -> VaultSnapshot
    {
        var (version, derivation, nonce, plaintext) = try plaintext(bytes, path: path, key: key)
        defer { Sodium.wipe(&plaintext) }
        guard let body = plaintext.withUnsafeBytes({ reader.snapshot($0) }), (body.generation ?? 0) < generationLimit
        else {
            throw VaultError("the vault \(path) decrypted but its contents are not understood")
        }
        return VaultSnapshot(
            version: version, derivation: derivation, generation: body.generation ?? 0, nonce: nonce,
            contents: body.contents, length: bytes.count)
    }

    /// The format, derivation, nonce and JSON plaintext of the snapshot file `bytes` read from
    /// `path` (named in errors), authenticated; the caller wipes the plaintext.
    package static func plaintext(_ bytes: [UInt8], path: String, key: SecretKey) throws -> (
        version: UInt16, derivation: KeyDerivation?, nonce: [UInt8], plaintext: [UInt8]
    ) {
        let (version, derivation) = try header(bytes, path: path)
        let headerLength = derivation == nil ? headerLength : passphraseHeaderLength
        let header = Array(bytes.prefix(headerLength))
        let nonce = Array(header.suffix(Sodium.nonceLength))
        guard let plaintext = Sodium.open(bytes[headerLength...], associatedData: header, nonce: nonce, key: key)
        else {
            throw VaultError(
                "the vault \(path) cannot be decrypted: the key is wrong or the file was modified; it was left untouched",
                wrongKey: true)
        }
        return (version, derivation, nonce, plaintext)
    }

    /// The format version of the snapshot file `bytes` read from `path` (named in errors), and
    /// the derivation its header holds in format 3; refuses a file too short for its header and
    /// tag, a bad magic, an unknown version and a derivation brokerd does not accept.
    package static func header(_ bytes: [UInt8], path: String) throws -> (version: UInt16, derivation: KeyDerivation?) {
        guard bytes.count >= headerLength + Sodium.tagLength, bytes.starts(with: magic) else {
            throw VaultError("\(path) is not a tokenbroker vault (bad header); it was left untouched")
        }
        let version = bytes.bigEndian(UInt16.self, at: magic.count)
        switch version {
        case singleFileVersion, formatVersion:
            return (version, nil)
        case passphraseVersion:
            guard bytes.count >= passphraseHeaderLength + Sodium.tagLength,
                let derivation = KeyDerivation.read(bytes, at: magic.count + 2)
            else {
                throw VaultError(
                    "the vault \(path) names a key derivation this brokerd does not accept (Argon2id from moderate "
                        + "to sensitive limits); it was left untouched")
            }
            return (version, derivation)
        default:
            throw VaultError(
                "the vault \(path) has format version \(version); this brokerd reads versions \(singleFileVersion) "
                    + "to \(passphraseVersion); it was left untouched")
        }
    }

}
