import FoundationEssentials

/// A shared account's record as its row holds it: sealed with the fleet key
/// (XChaCha20-Poly1305) with the account's name and the row's version as associated data, so
/// that a row copied onto another account's name, or put back at an older version, does not
/// open (docs/fleet.md, "Rows").
///
/// Layout: a format byte (1), the 24-byte nonce, the ciphertext of the record's JSON with its
/// tag. The associated data is a fixed label, the format byte, the name's UTF-8, a zero byte
/// and the version in 8 big-endian bytes.
public enum SharedRecord {
    static let format: UInt8 = 1
    static let label = Array("tokenbroker shared record\u{0}".utf8)

    /// `record` sealed for the row of its name at `version`.
    public static func seal(_ record: AccountRecord, version: Int64, key: SecretKey) throws -> [UInt8] {
        var plaintext = try JSONEncoder().encode(record)
        defer { Sodium.wipe(&plaintext) }
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        let ciphertext = Sodium.seal(
            plaintext, associatedData: associatedData(name: record.name, version: version), nonce: nonce, key: key)
        return [format] + nonce + Array(ciphertext)
    }

    /// The record the row `name` at `version` holds; refused (with the reason, never a secret)
    /// when it does not open under `key` as that name and version, or names another account.
    public static func open(_ sealed: [UInt8], name: String, version: Int64, key: SecretKey) throws -> AccountRecord {
        guard sealed.count > 1 + Sodium.nonceLength + Sodium.tagLength, sealed[0] == format else {
            throw FleetError("its sealed record is not in a format this brokerd reads")
        }
        let nonce = Array(sealed[1...Sodium.nonceLength])
        guard
            var plaintext = Sodium.open(
                sealed[(1 + Sodium.nonceLength)...], associatedData: associatedData(name: name, version: version),
                nonce: nonce, key: key)
        else {
            throw FleetError(
                "its sealed record does not open as this account at version \(version) under the fleet key"
                    + " (changed, copied from another account or version, or sealed with another key)")
        }
        defer { Sodium.wipe(&plaintext) }
        guard
            let record = SecretArena.shared.storing({ VaultJSONReader.decoded(AccountRecord.self, from: plaintext) })
        else { throw FleetError("its sealed record opened but is not understood") }
        guard record.name == name else { throw FleetError("its sealed record names another account") }
        return record.sanitized()
    }

    static func associatedData(name: String, version: Int64) -> [UInt8] {
        var data = label + [format] + Array(name.utf8) + [0]
        data.append(bigEndian: UInt64(bitPattern: version))
        return data
    }
}
