import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// A shared account's record as its row holds it: sealed with the fleet key
/// (XChaCha20-Poly1305) with the account's name, its share's id and the row's version as
/// associated data, so that a row copied onto another account's name, put back at an older
/// version, or brought back from a share that was removed, does not open as the row it claims
/// to be (docs/fleet.md, "Rows").
///
/// Layout: a format byte (2), the 24-byte nonce, the ciphertext of the record's JSON with its
/// tag. The associated data is a fixed label, the format byte, the name's UTF-8, a zero byte,
/// the share id's UTF-8, a zero byte and the version in 8 big-endian bytes.
public enum SharedRecord {
    package static let format: UInt8 = 2
    package static let label = Array("tokenbroker shared record\u{0}".utf8)

    /// `record` sealed for the row of its name, of share `share`, at `version`.
    public static func seal(_ record: AccountRecord, share: String, version: Int64, key: SecretKey) throws -> [UInt8] {
        var plaintext = try VaultJSONWriter.account(record)
        defer { Sodium.wipe(&plaintext) }
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        let ciphertext = Sodium.seal(
            plaintext, associatedData: associatedData(name: record.name, share: share, version: version), nonce: nonce,
            key: key)
        return [format] + nonce + Array(ciphertext)
    }

    /// The record the row `name` of share `share` at `version` holds; refused (with the reason,
    /// never a secret) when it does not open under `key` as that name, share and version, or
    /// names another account.
    public static func open(_ sealed: [UInt8], name: String, share: String, version: Int64, key: SecretKey) throws
        -> AccountRecord
    {
        guard sealed.count > 1 + Sodium.nonceLength + Sodium.tagLength, sealed[0] == format else {
            throw FleetError("its sealed record is not in a format this brokerd reads")
        }
        let nonce = Array(sealed[1...Sodium.nonceLength])
        guard
            var plaintext = Sodium.open(
                sealed[(1 + Sodium.nonceLength)...],
                associatedData: associatedData(name: name, share: share, version: version), nonce: nonce, key: key)
        else {
            throw FleetError(
                "its sealed record does not open as this account at version \(version) under the fleet key"
                    + " (changed, copied from another account, share or version, or sealed with another key)")
        }
        defer { Sodium.wipe(&plaintext) }
        let read = SecretArena.shared.storing { plaintext.withUnsafeBytes { VaultJSONReader().account($0) } }
        guard let read else { throw FleetError("its sealed record opened but is not understood") }
        // The reason names members and causes, never a value (`DamagedRecord`).
        if case .damaged(let damaged) = read {
            throw FleetError("its sealed record is not understood: \(damaged.reason)")
        }
        guard case .record(let record) = read, record.name == name else {
            throw FleetError("its sealed record names another account")
        }
        return record.sanitized()
    }

    package static func associatedData(name: String, share: String, version: Int64) -> [UInt8] {
        var data = label + [format] + Array(name.utf8) + [0] + Array(share.utf8) + [0]
        data.append(bigEndian: UInt64(bitPattern: version))
        return data
    }

    /// A new share's id: 128 random bits in hex. Every share of an account (`brokerctl add
    /// --shared`, `share`) gets its own, so a row of a share that was removed is never taken for
    /// one of a later share of the same name.
    public static func newShareID() -> String {
        Sodium.hex(Sodium.randomBytes(16))
    }

    /// Whether `text` (a row's clear column) could be a share id: 1 to 64 lowercase hex digits.
    public static func isShareID(_ text: String) -> Bool {
        (1...64).contains(text.utf8.count)
            && text.utf8.allSatisfy {
                (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
                    || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains($0)
            }
    }
}
