import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// An account object in the vault that this release cannot read (a value of another type, a
/// DPoP key that does not decode, no guarded memory left for a secret): kept byte for byte, in
/// guarded memory, through every rewrite until `remove` deletes it, while the other accounts
/// are served (protocol/VAULT.md, "Records of other releases").
public struct DamagedRecord: Sendable, Equatable {
    /// Its `name`; when that cannot be read or is not an account name, `unreadable-` and 16
    /// hex digits of the SHA-256 of its text, which stays the same from start to start.
    public let name: String
    /// What could not be read, for people: members and causes, never a value.
    public let reason: String
    /// The object's JSON text as the vault held it.
    package let text: SecretBytes

    /// The account object whose JSON text is `text`, which did not read for `reason`.
    package init(text: UnsafeRawBufferPointer, reason: String) throws(BrokerFailure) {
        self.text = try SecretBytes(bytes: text)
        self.reason = reason
        name = Self.name(in: text) ?? "unreadable-" + Sodium.hex(Sodium.sha256(text).prefix(8))
    }

    /// The `name` member of the object `text`, when it is a string that makes an account name.
    private static func name(in text: UnsafeRawBufferPointer) -> String? {
        var lexer = JSONLexer(text)
        guard lexer.skip(JSONLexer.Byte.openBrace), !lexer.skip(JSONLexer.Byte.closeBrace) else { return nil }
        repeat {
            guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon) else { return nil }
            if key == "name" { return lexer.string().flatMap { try? AccountName($0).rawValue } }
            guard lexer.skipValue() else { return nil }
        } while lexer.skip(JSONLexer.Byte.comma)
        return nil
    }
}
