import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// Writes the JSON the vault holds (a snapshot's accounts, a log record's change, a fleet row's
/// record), which `VaultJSONReader` reads: each account as `JSONEncoder` gives it, with the
/// members this release does not know put back at the end of their objects byte for byte, and
/// each damaged record as it was read (protocol/VAULT.md, "Records of other releases"). The
/// caller wipes what it is given.
package enum VaultJSONWriter {
    /// A snapshot's plaintext: generation `generation` holding `contents`.
    package static func snapshot(generation: UInt64, _ contents: VaultContents) throws -> [UInt8] {
        var json = Array(#"{"sequence":\#(generation),"accounts":"#.utf8)
        try append(contents.accounts, contents.damaged, to: &json)
        json.append(JSONLexer.Byte.closeBrace)
        return json
    }

    /// A log record's plaintext.
    package static func change(_ change: VaultChange) throws -> [UInt8] {
        var json = Array(#"{"changed":"#.utf8)
        try append(change.changed, change.damaged, to: &json)
        json += Array(#","removed":"#.utf8)
        json += try JSONEncoder().encode(change.removed)
        json.append(JSONLexer.Byte.closeBrace)
        return json
    }

    /// One account object (a fleet row's record).
    package static func account(_ record: AccountRecord) throws -> [UInt8] {
        var json: [UInt8] = []
        try append(record, encoder: JSONEncoder(), to: &json)
        return json
    }

    /// The array of `accounts` and then `damaged`.
    private static func append(_ accounts: [AccountRecord], _ damaged: [DamagedRecord], to json: inout [UInt8])
        throws
    {
        let encoder = JSONEncoder()
        json.append(JSONLexer.Byte.openBracket)
        for record in accounts {
            if json.last != JSONLexer.Byte.openBracket { json.append(JSONLexer.Byte.comma) }
            try append(record, encoder: encoder, to: &json)
        }
        for record in damaged {
            if json.last != JSONLexer.Byte.openBracket { json.append(JSONLexer.Byte.comma) }
            record.text.withUnsafeBytes { json += $0 }
        }
        json.append(JSONLexer.Byte.closeBracket)
    }

    /// `record` as `encoder` writes it, with its `provider` object as read while it keeps those
    /// settings, and the unknown members of the record, its `secrets` and its `token` before
    /// each one's closing brace.
    private static func append(_ record: AccountRecord, encoder: JSONEncoder, to json: inout [UInt8]) throws {
        var encoded = try encoder.encode(record)
        defer { Sodium.wipe(&encoded) }
        let provider = record.providerText.flatMap { $0.config == record.provider ? $0.text : nil }
        let nested = ["secrets": record.secrets.unknown, "token": record.token?.unknown].compactMapValues { $0 }
        guard record.unknown != nil || provider != nil || !nested.isEmpty else {
            json += encoded
            return
        }
        // Each edit writes `text` in place of the bytes at `place` (after a comma when `comma`).
        var edits: [(place: Range<Int>, text: SecretBytes, comma: Bool)] = []
        let read = encoded.withUnsafeBytes { bytes in
            var lexer = JSONLexer(bytes)
            guard lexer.skip(JSONLexer.Byte.openBrace) else { return false }
            repeat {
                guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon), lexer.peek() != nil else {
                    return false
                }
                let start = lexer.offset
                guard lexer.skipValue() else { return false }
                let end = lexer.offset
                if key == "provider", let provider { edits.append((start..<end, provider, false)) }
                if let members = nested[key] {
                    guard bytes[end - 1] == JSONLexer.Byte.closeBrace else { return false }
                    edits.append(((end - 1)..<(end - 1), members.text, bytes[end - 2] != JSONLexer.Byte.openBrace))
                }
            } while lexer.skip(JSONLexer.Byte.comma)
            guard lexer.peek() == JSONLexer.Byte.closeBrace else { return false }
            if let members = record.unknown {
                edits.append(
                    (lexer.offset..<lexer.offset, members.text, bytes[lexer.offset - 1] != JSONLexer.Byte.openBrace))
            }
            return true
        }
        guard read else {
            throw VaultError("an account's record could not be written with what this release does not know")
        }
        var written = 0
        for edit in edits {
            json += encoded[written..<edit.place.lowerBound]
            if edit.comma { json.append(JSONLexer.Byte.comma) }
            edit.text.withUnsafeBytes { json += $0 }
            written = edit.place.upperBound
        }
        json += encoded[written...]
    }
}
