import BrokerIdP
import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// One save: accounts written whole and accounts removed, applied all or nothing.
package struct VaultChange: Equatable {
    package var changed: [AccountRecord]
    /// Records of `changed` that this release cannot read, as a log record holds them.
    package var damaged: [DamagedRecord] = []
    package var removed: [String]

    /// Applies the change to `accounts` and `damaged` (by name): removals first, then the
    /// records, each replacing whatever its name held.
    package func apply(to accounts: inout [String: AccountRecord], _ damaged: inout [String: DamagedRecord]) {
        for name in removed {
            accounts[name] = nil
            damaged[name] = nil
        }
        for record in changed {
            accounts[record.name] = record
            damaged[record.name] = nil
        }
        for record in self.damaged {
            damaged[record.name] = record
            accounts[record.name] = nil
        }
    }
}

/// The vault's log: the changes saved since its snapshot, one sealed record per save, appended.
///
/// Layout: a header of an 8-byte magic, a 2-byte big-endian format version, the 8-byte
/// generation and the 24-byte nonce of the snapshot it continues, its own 24-byte nonce and
/// the 16-byte tag that authenticates all of that. Then records: a 4-byte length of the
/// ciphertext, the same length with every bit flipped, an 8-byte sequence number (0, 1, ...),
/// a 24-byte nonce and the XChaCha20-Poly1305 ciphertext of one `VaultChange`. A record's
/// associated data is the log's header, the record's length fields and sequence number, and
/// the tag of the record before it (the header's for the first), so no record can be moved,
/// repeated, dropped from the middle or carried over from another log, snapshot or vault.
package enum VaultLog {
    package static let magic = Array("TKBVLOG\n".utf8)
    package static let formatVersion: UInt16 = 2
    package static let headerLength = magic.count + 2 + 8 + 2 * Sodium.nonceLength + Sodium.tagLength
    /// The bytes before a record's ciphertext.
    package static let recordPrefixLength = 4 + 4 + 8 + Sodium.nonceLength
    /// The longest ciphertext a record may have (a change to every account fits many times over).
    package static let maximumRecordLength = 1 << 30

    /// Where the log ends: what the next record is numbered and bound to.
    package struct Tail: Equatable {
        /// The next record's sequence number.
        package var sequence: UInt64 = 0
        /// The tag of the last record, or of the header.
        package var previousTag: [UInt8]
        /// The log's length in bytes.
        package var length: Int
    }

    /// A new log's header, continuing the snapshot `generation` with header nonce `snapshotNonce`,
    /// and the tail of a log holding only that header.
    package static func header(generation: UInt64, snapshotNonce: [UInt8], key: SecretKey) -> (
        bytes: [UInt8], tail: Tail
    ) {
        var header = magic
        header.append(bigEndian: formatVersion)
        header.append(bigEndian: generation)
        header += snapshotNonce
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        header += nonce
        header += Sodium.seal(Data(), associatedData: header, nonce: nonce, key: key)
        return (header, Tail(previousTag: Array(header.suffix(Sodium.tagLength)), length: header.count))
    }

    /// The record that appends `change` to the log with header `header` ending at `tail`, and
    /// the log's tail after it.
    package static func seal(_ change: VaultChange, header: [UInt8], after tail: Tail, key: SecretKey) throws -> (
        record: [UInt8], tail: Tail
    ) {
        var plaintext = try VaultJSONWriter.change(change)
        defer { Sodium.wipe(&plaintext) }
        guard plaintext.count + Sodium.tagLength <= maximumRecordLength else {
            throw VaultError("a change of \(change.changed.count) accounts is too large for one vault log record")
        }
        let length = UInt32(plaintext.count + Sodium.tagLength)
        let fields = lengthAndSequence(length, tail.sequence)
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        let ciphertext = Sodium.seal(
            plaintext, associatedData: header + fields + tail.previousTag, nonce: nonce, key: key)
        let record = fields + nonce + ciphertext
        let next = Tail(
            sequence: tail.sequence + 1, previousTag: Array(record.suffix(Sodium.tagLength)),
            length: tail.length + record.count)
        return (record, next)
    }

    /// What a log file holds for the snapshot it continues.
    package enum Reading: Equatable {
        /// Shorter than a header: a crash cut it off while it was being created, before its
        /// first record was saved.
        case unfinished
        /// It continued an older snapshot, which a newer one replaced with everything in it.
        case superseded
        /// The changes saved since the snapshot; `tail.length` is where the last complete
        /// record ends (before a record that a crash cut short, or zeros to the end).
        case changes([VaultChange], header: [UInt8], tail: Tail)
    }

    /// Reads the log `bytes` found at `path` (named in errors) beside `snapshot`. A record cut
    /// short at the end, and zeros to the end, are left out; anything else that does not authenticate, is out of
    /// order, or continues another snapshot is refused. `reader` reads the records' plaintext.
    package static func read(
        _ bytes: [UInt8], continuing snapshot: VaultSnapshot, path: String, key: SecretKey,
        reader: VaultJSONReader = VaultJSONReader()
    ) throws -> Reading {
        guard bytes.count >= headerLength else { return .unfinished }
        let refuse = { (reason: String) in VaultError("the vault log \(path) \(reason); the vault was left untouched") }
        guard bytes.starts(with: magic) else { throw refuse("is not a tokenbroker vault log (bad header)") }
        let version = bytes.bigEndian(UInt16.self, at: magic.count)
        guard version == formatVersion else {
            throw refuse("has format version \(version); this brokerd reads version \(formatVersion)")
        }
        let header = Array(bytes.prefix(headerLength))
        let sealedPart = header.count - Sodium.tagLength
        let nonce = Array(header[(sealedPart - Sodium.nonceLength)..<sealedPart])
        guard
            Sodium.open(
                Array(header.suffix(Sodium.tagLength)), associatedData: Array(header.prefix(sealedPart)),
                nonce: nonce, key: key) != nil
        else { throw refuse("cannot be decrypted: the key is wrong or the file was modified") }
        let generation = header.bigEndian(UInt64.self, at: magic.count + 2)
        let snapshotNonce = Array(header[(magic.count + 10)..<(magic.count + 10 + Sodium.nonceLength)])
        if generation < snapshot.generation { return .superseded }
        guard generation == snapshot.generation, snapshotNonce == snapshot.nonce else {
            throw refuse("continues another snapshot than the vault's (generation \(generation))")
        }

        var changes: [VaultChange] = []
        var tail = Tail(previousTag: Array(header.suffix(Sodium.tagLength)), length: headerLength)
        while bytes.count - tail.length >= recordPrefixLength {
            let start = tail.length
            let length = bytes.bigEndian(UInt32.self, at: start)
            // Zeros from a record's start to the end of the file end the log (protocol/VAULT.md,
            // "Reading"): room allocated ahead that a filesystem shows, not a record cut short.
            if length == 0, bytes[start...].allSatisfy({ $0 == 0 }) { break }
            guard bytes.bigEndian(UInt32.self, at: start + 4) == ~length else {
                throw refuse("has a damaged length at record \(tail.sequence)")
            }
            guard length >= Sodium.tagLength, length <= maximumRecordLength else {
                throw refuse("has an impossible length at record \(tail.sequence)")
            }
            let end = start + recordPrefixLength + Int(length)
            guard end <= bytes.count else { break }
            let sequence = bytes.bigEndian(UInt64.self, at: start + 8)
            guard sequence == tail.sequence else {
                throw refuse("holds record \(sequence) where record \(tail.sequence) belongs (moved or repeated)")
            }
            let nonce = Array(bytes[(start + 16)..<(start + recordPrefixLength)])
            let ciphertext = bytes[(start + recordPrefixLength)..<end]
            let associatedData = header + lengthAndSequence(length, sequence) + tail.previousTag
            guard var plaintext = Sodium.open(ciphertext, associatedData: associatedData, nonce: nonce, key: key)
            else {
                throw refuse("cannot be decrypted at record \(sequence): the key is wrong or the file was modified")
            }
            defer { Sodium.wipe(&plaintext) }
            guard let change = plaintext.withUnsafeBytes({ reader.change($0) }) else {
                throw refuse("decrypted but record \(sequence) is not understood")
            }
            changes.append(change)
            tail = Tail(sequence: sequence + 1, previousTag: Array(ciphertext.suffix(Sodium.tagLength)), length: end)
        }
        return .changes(changes, header: header, tail: tail)
    }

    /// A record's length, the length's complement and its sequence number, as stored.
    private static func lengthAndSequence(_ length: UInt32, _ sequence: UInt64) -> [UInt8] {
        var fields: [UInt8] = []
        fields.append(bigEndian: length)
        fields.append(bigEndian: ~length)
        fields.append(bigEndian: sequence)
        return fields
    }
}
