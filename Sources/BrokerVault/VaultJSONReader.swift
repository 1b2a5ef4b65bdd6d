import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// Reads the JSON the vault writes (a snapshot's accounts, a log record's change, a fleet row's
/// record) straight from the decrypted bytes, several times faster than `JSONDecoder`: each
/// secret is copied from the plaintext into guarded memory with no `String` in between, and
/// provider settings (whose shapes the provider kinds own) are decoded by `JSONDecoder` once
/// per distinct text, which 1,000 accounts of a few providers share.
///
/// It reads the shapes `JSONEncoder` gives the vault's types, in any key order. The members of
/// an account object, its `secrets` and its `token` that it does not know (a later release's)
/// are kept byte for byte (`UnknownMembers`), and an account object it cannot read (a value of
/// another type, a repeated key, a DPoP key that does not decode, no guarded memory left) is
/// kept whole as a `DamagedRecord`: protocol/VAULT.md, "Records of other releases". Anything
/// else (malformed JSON, the wrong shape around the accounts) gives `nil`. One reader serves
/// one load: the snapshot and every log record.
package final class VaultJSONReader {
    /// One account object as read.
    package enum Entry {
        case record(AccountRecord)
        /// Valid JSON that is not a record this release reads.
        case damaged(DamagedRecord)
    }

    /// Provider settings decoded so far, by their JSON text, with that text when this release
    /// would write them otherwise.
    private var providers: [[UInt8]: (config: ProviderConfig, text: ProviderText?)] = [:]
    /// Why the account object being read is not understood: the first member that failed, and
    /// how (never a value).
    private var problem: String?

    /// A reader with nothing decoded yet.
    package init() {}

    /// The `sequence` (generation) and accounts of a snapshot's plaintext.
    package func snapshot(_ plaintext: UnsafeRawBufferPointer) -> (generation: UInt64?, contents: VaultContents)? {
        var lexer = JSONLexer(plaintext)
        var generation: UInt64??
        var contents: VaultContents?
        let read = Self.object(&lexer) { key, lexer in
            switch key {
            case "sequence": return Self.once(&generation, Self.optional(&lexer) { Self.whole(&$0) })
            case "accounts": return Self.once(&contents, records(&lexer, plaintext))
            default: return nil
            }
        }
        guard read != nil, lexer.atEnd(), let contents else { return nil }
        return (generation ?? nil, contents)
    }

    /// The change held by a log record's plaintext.
    package func change(_ plaintext: UnsafeRawBufferPointer) -> VaultChange? {
        var lexer = JSONLexer(plaintext)
        var changed: VaultContents?
        var removed: [String]?
        let read = Self.object(&lexer) { key, lexer in
            switch key {
            case "changed": return Self.once(&changed, records(&lexer, plaintext))
            case "removed": return Self.once(&removed, Self.array(&lexer) { $0.string() })
            default: return nil
            }
        }
        guard read != nil, lexer.atEnd(), let changed, let removed else { return nil }
        return VaultChange(changed: changed.accounts, damaged: changed.damaged, removed: removed)
    }

    /// The one account object `plaintext` holds (a fleet row's), or why it is not understood.
    package func account(_ plaintext: UnsafeRawBufferPointer) -> Entry? {
        var lexer = JSONLexer(plaintext)
        guard let read = entry(&lexer, plaintext), lexer.atEnd() else { return nil }
        return read
    }

    // MARK: The vault's types

    private func records(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> VaultContents? {
        var contents = VaultContents(accounts: [])
        let entries = Self.array(&lexer) { entry(&$0, plaintext) }
        for entry in entries ?? [] {
            switch entry {
            case .record(let record): contents.accounts.append(record)
            case .damaged(let damaged): contents.damaged.append(damaged)
            }
        }
        return entries == nil ? nil : contents
    }

    /// One account object: read, or kept whole as damaged when it is valid JSON that does not
    /// read; `nil` when it is not valid JSON (or no guarded memory can hold it).
    private func entry(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> Entry? {
        _ = lexer.peek()
        let start = lexer.offset
        var attempt = lexer
        problem = nil
        if let record = record(&attempt, plaintext) {
            lexer = attempt
            return .record(record)
        }
        guard lexer.skipValue() else { return nil }
        let text = UnsafeRawBufferPointer(rebasing: plaintext[start..<lexer.offset])
        return (try? DamagedRecord(text: text, reason: problem ?? "it is not an account object")).map { .damaged($0) }
    }

    private func record(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> AccountRecord? {
        var name: String?
        var provider: (config: ProviderConfig, text: ProviderText?)?
        var secrets: AccountSecrets?
        var token: AccessToken??
        var needsLogin: Bool?
        var loggedOut: Bool??
        var lastError: AccountError??
        var lastRefreshAt: Date??
        var declared: Bool??
        var grantedScope: String??
        var fleet: FleetMark??
        let unknown = members(&lexer, plaintext, in: "") { key, lexer in
            switch key {
            case "name": return Self.once(&name, lexer.string())
            case "provider": return Self.once(&provider, self.provider(&lexer, plaintext))
            case "secrets": return Self.once(&secrets, self.secrets(&lexer, plaintext))
            case "token": return Self.once(&token, Self.optional(&lexer) { self.token(&$0, plaintext) })
            case "needsLogin": return Self.once(&needsLogin, Self.bool(&lexer))
            case "loggedOut": return Self.once(&loggedOut, Self.optional(&lexer) { Self.bool(&$0) })
            case "lastError": return Self.once(&lastError, Self.optional(&lexer) { Self.error(&$0) })
            case "lastRefreshAt": return Self.once(&lastRefreshAt, Self.optional(&lexer) { Self.date(&$0) })
            case "declared": return Self.once(&declared, Self.optional(&lexer) { Self.bool(&$0) })
            case "grantedScope": return Self.once(&grantedScope, Self.optional(&lexer) { $0.string() })
            case "fleet": return Self.once(&fleet, Self.optional(&lexer) { Self.fleetMark(&$0) })
            default: return nil
            }
        }
        guard let unknown else { return nil }
        guard let name, let provider, let secrets, let needsLogin else {
            problem = "it lacks `name`, `provider`, `secrets` or `needsLogin`"
            return nil
        }
        return AccountRecord(
            name: name, provider: provider.config, secrets: secrets, token: token ?? nil, needsLogin: needsLogin,
            loggedOut: loggedOut ?? nil, lastError: lastError ?? nil, lastRefreshAt: lastRefreshAt ?? nil,
            declared: declared ?? nil, grantedScope: grantedScope ?? nil, fleet: fleet ?? nil, unknown: unknown,
            providerText: provider.text)
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
            default: return nil
            }
        }
        guard read != nil, let step, let version else { return nil }
        return FleetMark(step: step, version: version, id: id ?? nil)
    }

    /// Provider settings: decoded by `JSONDecoder` the first time their text is met, and the
    /// text kept when what `JSONEncoder` writes of them holds other values (a member the kind
    /// does not know, an older shape).
    private func provider(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> (
        config: ProviderConfig, text: ProviderText?
    )? {
        guard lexer.peek() == JSONLexer.Byte.openBrace else { return nil }
        let start = lexer.offset
        guard lexer.skipValue() else { return nil }
        let text = [UInt8](plaintext[start..<lexer.offset])
        if let known = providers[text] { return known }
        guard let decoded = try? JSONDecoder().decode(ProviderConfig.self, from: Data(text)) else { return nil }
        var kept: ProviderText?
        let again = (try? JSONEncoder().encode(decoded)).flatMap { try? JSONDecoder().decode(JSONValue.self, from: $0) }
        if again == nil || again != (try? JSONDecoder().decode(JSONValue.self, from: Data(text))) {
            guard
                let stored = try? text.withUnsafeBytes({ bytes throws(BrokerFailure) in try SecretBytes(bytes: bytes) })
            else {
                problem = "no guarded memory was left to hold its `provider`"
                return nil
            }
            kept = ProviderText(config: decoded, text: stored)
        }
        providers[text] = (decoded, kept)
        return (decoded, kept)
    }

    private func secrets(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> AccountSecrets? {
        var refreshToken: SecretBytes??
        var refreshURL: SecretBytes??
        var refreshExpiresAt: Date??
        var clientSecret: SecretBytes??
        var dpopKey: DPoPKey??
        let unknown = members(&lexer, plaintext, in: "secrets.") { key, lexer in
            switch key {
            case "refreshToken": return Self.once(&refreshToken, Self.optional(&lexer) { self.secret(&$0) })
            case "refreshURL": return Self.once(&refreshURL, Self.optional(&lexer) { self.secret(&$0) })
            case "refreshExpiresAt": return Self.once(&refreshExpiresAt, Self.optional(&lexer) { Self.date(&$0) })
            case "clientSecret": return Self.once(&clientSecret, Self.optional(&lexer) { self.secret(&$0) })
            case "dpopKey":
                return Self.once(&dpopKey, Self.optional(&lexer) { self.secret(&$0).flatMap(self.dpopKey) })
            default: return nil
            }
        }
        guard let unknown else { return nil }
        return AccountSecrets(
            refreshToken: refreshToken ?? nil, refreshURL: refreshURL ?? nil,
            refreshExpiresAt: refreshExpiresAt ?? nil, clientSecret: clientSecret ?? nil, dpopKey: dpopKey ?? nil,
            unknown: unknown)
    }

    /// The DPoP key a stored scalar makes; notes why in `problem` when it makes none.
    private func dpopKey(_ scalar: SecretBytes) -> DPoPKey? {
        do {
            return try DPoPKey(scalar: scalar)
        } catch {
            problem =
                problem
                ?? (error == .outOfGuardedMemory
                    ? "OpenSSL's secure heap had no room for its DPoP key"
                    : "its DPoP key (`secrets.dpopKey`) is not a P-256 private key")
            return nil
        }
    }

    private func token(_ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer) -> AccessToken? {
        var value: SecretBytes?
        var type: String?
        var expiresAt: Date?
        var obtainedAt: Date?
        var idToken: SecretBytes??
        var scope: String??
        var pushed: Bool??
        let unknown = members(&lexer, plaintext, in: "token.") { key, lexer in
            switch key {
            case "value": return Self.once(&value, self.secret(&lexer))
            case "type": return Self.once(&type, lexer.string())
            case "expiresAt": return Self.once(&expiresAt, Self.date(&lexer))
            case "obtainedAt": return Self.once(&obtainedAt, Self.date(&lexer))
            case "idToken": return Self.once(&idToken, Self.optional(&lexer) { self.secret(&$0) })
            case "scope": return Self.once(&scope, Self.optional(&lexer) { $0.string() })
            case "pushed": return Self.once(&pushed, Self.optional(&lexer) { Self.bool(&$0) })
            default: return nil
            }
        }
        guard let unknown else { return nil }
        guard let value, let type, let expiresAt, let obtainedAt else {
            problem = "its `token` lacks `value`, `type`, `expiresAt` or `obtainedAt`"
            return nil
        }
        return AccessToken(
            value: value, type: type, expiresAt: expiresAt, obtainedAt: obtainedAt, idToken: idToken ?? nil,
            scope: scope ?? nil, pushed: pushed ?? nil, unknown: unknown)
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
            default: return nil
            }
        }
        guard read != nil, let code, let message, let at else { return nil }
        return AccountError(code: code, message: message, at: at)
    }

    // MARK: JSON values

    /// Reads an object, handing each key to `field`, which reads its value and says whether it
    /// did, or answers `nil` for a key it does not know (its value is skipped); the places of
    /// those members (from the key's quote to the value's end), in order; `nil` when the object
    /// or a value was not read.
    private static func object(_ lexer: inout JSONLexer, _ field: (String, inout JSONLexer) -> Bool?) -> [Range<Int>]? {
        var unknown: [Range<Int>] = []
        guard lexer.skip(JSONLexer.Byte.openBrace) else { return nil }
        if lexer.skip(JSONLexer.Byte.closeBrace) { return unknown }
        repeat {
            _ = lexer.peek()
            let start = lexer.offset
            guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon) else { return nil }
            switch field(key, &lexer) {
            case true?: continue
            case false?: return nil
            case nil:
                guard lexer.skipValue() else { return nil }
                unknown.append(start..<lexer.offset)
            }
        } while lexer.skip(JSONLexer.Byte.comma)
        return lexer.skip(JSONLexer.Byte.closeBrace) ? unknown : nil
    }

    /// Reads an object of the record (at `path`, named in `problem`) as `object` does, keeping
    /// the members it does not know byte for byte; `nil` when it was not read (`problem` says
    /// why), `.some(nil)` when every member was known.
    private func members(
        _ lexer: inout JSONLexer, _ plaintext: UnsafeRawBufferPointer, in path: String,
        _ field: (String, inout JSONLexer) -> Bool?
    ) -> UnknownMembers?? {
        let places = Self.object(&lexer) { key, lexer in
            let read = field(key, &lexer)
            if read == false, problem == nil {
                problem = "its `\(path)\(key)` is repeated or holds a value of another type"
            }
            return read
        }
        guard let places else {
            problem = problem ?? "its `\(path.isEmpty ? "record" : String(path.dropLast()))` is not an object"
            return nil
        }
        guard !places.isEmpty else { return .some(nil) }
        do {
            return .some(try UnknownMembers(places.map { UnsafeRawBufferPointer(rebasing: plaintext[$0]) }))
        } catch {
            problem = "no guarded memory was left to hold the members this release does not know"
            return nil
        }
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

    /// A string copied straight into guarded memory; `nil` when it is not a string, or when no
    /// guarded memory can be had (noted in `problem`).
    private func secret(_ lexer: inout JSONLexer) -> SecretBytes? {
        let stored = lexer.withString { bytes in Result { () throws(BrokerFailure) in try SecretBytes(bytes: bytes) } }
        if case .failure? = stored { problem = problem ?? "no guarded memory was left to hold its secrets" }
        return try? stored?.get()
    }
}
