import BrokerProtocol
import FoundationEssentials

/// Reads the JSON the vault writes (a snapshot's accounts, a log record's change) straight from
/// the decrypted bytes, several times faster than `JSONDecoder`: each secret is copied from
/// the plaintext into guarded memory with no `String` in between, and provider settings (whose
/// shapes the provider kinds own) are decoded by `JSONDecoder` once per distinct text, which
/// 1,000 accounts of a few providers share.
///
/// It reads the shapes `JSONEncoder` gives the vault's types, in any key order, skipping
/// unknown keys as `JSONDecoder` does. Anything else (a duplicate key, a number out of range, a
/// value of another type) gives `nil`: the caller then decodes with `JSONDecoder`, which has the
/// last word, so a vault is understood exactly when it was before. One reader serves one load:
/// the snapshot and every log record.
final class VaultJSONReader {
    /// Provider settings decoded so far, by their JSON text.
    private var providers: [[UInt8]: ProviderConfig] = [:]

    /// The `sequence` (generation) and accounts of a snapshot's plaintext.
    func snapshot(_ plaintext: UnsafeRawBufferPointer) -> (generation: UInt64?, accounts: [AccountRecord])? {
        var lexer = JSONLexer(plaintext)
        var generation: UInt64??
        var accounts: [AccountRecord]?
        let read = Self.object(&lexer) { key, lexer in
            switch key {
            case "sequence": return Self.once(&generation, Self.optional(&lexer) { Self.whole(&$0) })
            case "accounts": return Self.once(&accounts, records(&lexer, plaintext))
            default: return lexer.skipValue()
            }
        }
        guard read, lexer.atEnd(), let accounts else { return nil }
        return (generation ?? nil, accounts)
    }

    /// The change held by a log record's plaintext.
    func change(_ plaintext: UnsafeRawBufferPointer) -> VaultChange? {
        var lexer = JSONLexer(plaintext)
        var changed: [AccountRecord]?
        var removed: [String]?
        let read = Self.object(&lexer) { key, lexer in
            switch key {
            case "changed": return Self.once(&changed, records(&lexer, plaintext))
            case "removed": return Self.once(&removed, Self.array(&lexer) { $0.string() })
            default: return lexer.skipValue()
            }
        }
        guard read, lexer.atEnd(), let changed, let removed else { return nil }
        return VaultChange(changed: changed, removed: removed)
    }

    /// `JSONDecoder`'s reading of `plaintext`, for what the reader leaves to it; the copy it
    /// reads is wiped.
    static func decoded<T: Decodable>(_ type: T.Type, from plaintext: [UInt8]) -> T? {
        var data = Data(plaintext)
        defer { Sodium.wipe(&data) }
        return try? JSONDecoder().decode(type, from: data)
    }

    // MARK: The vault's types

    private func records(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> [AccountRecord]? {
        Self.array(&lexer) { record(&$0, plaintext) }
    }

    private func record(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> AccountRecord? {
        var name: String?
        var provider: ProviderConfig?
        var secrets: AccountSecrets?
        var token: AccessToken??
        var needsLogin: Bool?
        var loggedOut: Bool??
        var lastError: AccountError??
        var lastRefreshAt: Date??
        var declared: Bool??
        var grantedScope: String??
        var fleet: FleetMark??
        let read = Self.object(&lexer) { key, lexer in
            switch key {
            case "name": return Self.once(&name, lexer.string())
            case "provider": return Self.once(&provider, self.provider(&lexer, plaintext))
            case "secrets": return Self.once(&secrets, Self.secrets(&lexer))
            case "token": return Self.once(&token, Self.optional(&lexer) { Self.token(&$0) })
            case "needsLogin": return Self.once(&needsLogin, Self.bool(&lexer))
            case "loggedOut": return Self.once(&loggedOut, Self.optional(&lexer) { Self.bool(&$0) })
            case "lastError": return Self.once(&lastError, Self.optional(&lexer) { Self.error(&$0) })
            case "lastRefreshAt": return Self.once(&lastRefreshAt, Self.optional(&lexer) { Self.date(&$0) })
            case "declared": return Self.once(&declared, Self.optional(&lexer) { Self.bool(&$0) })
            case "grantedScope": return Self.once(&grantedScope, Self.optional(&lexer) { $0.string() })
            case "fleet": return Self.once(&fleet, Self.optional(&lexer) { Self.fleetMark(&$0) })
            default: return lexer.skipValue()
            }
        }
        guard read, let name, let provider, let secrets, let needsLogin else { return nil }
        return AccountRecord(
            name: name, provider: provider, secrets: secrets, token: token ?? nil, needsLogin: needsLogin,
            loggedOut: loggedOut ?? nil, lastError: lastError ?? nil, lastRefreshAt: lastRefreshAt ?? nil,
            declared: declared ?? nil, grantedScope: grantedScope ?? nil, fleet: fleet ?? nil)
    }

    private static func fleetMark(_ lexer: inout JSONLexer) -> FleetMark? {
        var step: FleetMark.Step?
        var version: Int64?
        var id: String??
        let read = object(&lexer) { key, lexer in
            switch key {
            case "step": return once(&step, lexer.string().flatMap(FleetMark.Step.init(rawValue:)))
            case "version": return once(&version, whole(&lexer).flatMap { Int64(exactly: $0) })
            case "id": return once(&id, optional(&lexer) { $0.string() })
            default: return lexer.skipValue()
            }
        }
        guard read, let step, let version else { return nil }
        return FleetMark(step: step, version: version, id: id ?? nil)
    }

    /// Provider settings: decoded by `JSONDecoder` the first time their text is met.
    private func provider(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> ProviderConfig? {
        guard lexer.peek() == JSONLexer.Byte.openBrace else { return nil }
        let start = lexer.offset
        guard lexer.skipValue() else { return nil }
        let text = [UInt8](plaintext[start..<lexer.offset])
        if let known = providers[text] { return known }
        guard let decoded = try? JSONDecoder().decode(ProviderConfig.self, from: Data(text)) else { return nil }
        providers[text] = decoded
        return decoded
    }

    private static func secrets(_ lexer: inout JSONLexer) -> AccountSecrets? {
        var refreshToken: SecretBytes??
        var refreshURL: SecretBytes??
        var refreshExpiresAt: Date??
        var clientSecret: SecretBytes??
        var dpopKey: DPoPKey??
        let read = object(&lexer) { key, lexer in
            switch key {
            case "refreshToken": return once(&refreshToken, optional(&lexer) { secret(&$0) })
            case "refreshURL": return once(&refreshURL, optional(&lexer) { secret(&$0) })
            case "refreshExpiresAt": return once(&refreshExpiresAt, optional(&lexer) { date(&$0) })
            case "clientSecret": return once(&clientSecret, optional(&lexer) { secret(&$0) })
            case "dpopKey": return once(&dpopKey, optional(&lexer) { secret(&$0).flatMap { try? DPoPKey(scalar: $0) } })
            default: return lexer.skipValue()
            }
        }
        guard read else { return nil }
        return AccountSecrets(
            refreshToken: refreshToken ?? nil, refreshURL: refreshURL ?? nil,
            refreshExpiresAt: refreshExpiresAt ?? nil, clientSecret: clientSecret ?? nil, dpopKey: dpopKey ?? nil)
    }

    private static func token(_ lexer: inout JSONLexer) -> AccessToken? {
        var value: SecretBytes?
        var type: String?
        var expiresAt: Date?
        var obtainedAt: Date?
        var idToken: SecretBytes??
        var scope: String??
        var pushed: Bool??
        let read = object(&lexer) { key, lexer in
            switch key {
            case "value": return once(&value, secret(&lexer))
            case "type": return once(&type, lexer.string())
            case "expiresAt": return once(&expiresAt, date(&lexer))
            case "obtainedAt": return once(&obtainedAt, date(&lexer))
            case "idToken": return once(&idToken, optional(&lexer) { secret(&$0) })
            case "scope": return once(&scope, optional(&lexer) { $0.string() })
            case "pushed": return once(&pushed, optional(&lexer) { bool(&$0) })
            default: return lexer.skipValue()
            }
        }
        guard read, let value, let type, let expiresAt, let obtainedAt else { return nil }
        return AccessToken(
            value: value, type: type, expiresAt: expiresAt, obtainedAt: obtainedAt, idToken: idToken ?? nil,
            scope: scope ?? nil, pushed: pushed ?? nil)
    }

    private static func error(_ lexer: inout JSONLexer) -> AccountError? {
        var code: String?
        var message: String?
        var at: Date?
        let read = object(&lexer) { key, lexer in
            switch key {
            case "code": return once(&code, lexer.string())
            case "message": return once(&message, lexer.string())
            case "at": return once(&at, date(&lexer))
            default: return lexer.skipValue()
            }
        }
        guard read, let code, let message, let at else { return nil }
        return AccountError(code: code, message: message, at: at)
    }

    // MARK: JSON values

    /// Reads an object, handing each key to `field`, which reads its value; whether the object
    /// and every value were read.
    private static func object(_ lexer: inout JSONLexer, _ field: (String, inout JSONLexer) -> Bool) -> Bool {
        guard lexer.skip(JSONLexer.Byte.openBrace) else { return false }
        if lexer.skip(JSONLexer.Byte.closeBrace) { return true }
        repeat {
            guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon), field(key, &lexer) else { return false }
        } while lexer.skip(JSONLexer.Byte.comma)
        return lexer.skip(JSONLexer.Byte.closeBrace)
    }

    private static func array<T>(_ lexer: inout JSONLexer, _ element: (inout JSONLexer) -> T?) -> [T]? {
        var elements: [T] = []
        guard lexer.skip(JSONLexer.Byte.openBracket) else { return nil }
        if lexer.skip(JSONLexer.Byte.closeBracket) { return elements }
        repeat {
            guard let value = element(&lexer) else { return nil }
            elements.append(value)
        } while lexer.skip(JSONLexer.Byte.comma)
        return lexer.skip(JSONLexer.Byte.closeBracket) ? elements : nil
    }

    /// Stores `value` in `slot` the first time; whether it was read and the key was new.
    private static func once<T>(_ slot: inout T?, _ value: T?) -> Bool {
        guard slot == nil, let value else { return false }
        slot = value
        return true
    }

    /// `null` as `.some(nil)`, else what `read` reads; `nil` when neither.
    private static func optional<T>(_ lexer: inout JSONLexer, _ read: (inout JSONLexer) -> T?) -> T?? {
        if lexer.literal("null") { return .some(nil) }
        return read(&lexer).map { .some($0) }
    }

    private static func bool(_ lexer: inout JSONLexer) -> Bool? {
        if lexer.literal("true") { return true }
        return lexer.literal("false") ? false : nil
    }

    /// A date as `JSONEncoder` writes it by default: seconds since 2001, finite.
    private static func date(_ lexer: inout JSONLexer) -> Date? {
        guard let number = lexer.number(), let seconds = Double(number.text), seconds.isFinite else { return nil }
        return Date(timeIntervalSinceReferenceDate: seconds)
    }

    /// A whole number in `UInt64`.
    private static func whole(_ lexer: inout JSONLexer) -> UInt64? {
        guard let number = lexer.number(), number.isInteger else { return nil }
        return UInt64(number.text)
    }

    /// A string copied straight into guarded memory (`nil` too when none can be had: then
    /// `JSONDecoder`, which needs it as well, refuses the vault).
    private static func secret(_ lexer: inout JSONLexer) -> SecretBytes? {
        lexer.withString { try? SecretBytes(bytes: $0) } ?? nil
    }
}
