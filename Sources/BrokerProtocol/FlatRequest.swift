/// A fast, allocation-light reader for the common request shape: one flat JSON object whose
/// values are strings, numbers or literals, such as
/// `{"id":7,"op":"token","account":"api","min_ttl":60}`.
///
/// It only gates the hot path, and never disagrees with the full path (`JSONLine.problem(in:)`
/// then the decoder over `Request`): whatever it returns, the full path would read the same
/// `id`, `op`, `account`, `min_ttl` and `access_token` from the same line. Anything it cannot
/// vouch for yields `nil` and the full path decides: text outside RFC 8259, nested values (but a
/// `dpop` object of strings), a repeated key, a
/// field of `Request` it does not read, a value of the wrong type, an `id` number that is not
/// a plain integer within 64 bits (the decoder turns `1.0` into `1` and `1e2` into `100`).
public struct FlatRequest: Equatable, Sendable {
    public var id: RequestID?
    public var op: String?
    public var account: String?
    public var minTTL: Double?
    /// The token a `reject` names.
    public var accessToken: String?
    /// The request a `token` wants a DPoP proof for: a flat object of strings.
    public var dpop: DPoPRequest?

    /// The fields the fast path reads, as the full path read them from `request`.
    public init(_ request: Request) {
        id = request.id
        op = request.op
        account = request.account
        minTTL = request.minTTL
        accessToken = request.accessToken
        dpop = request.dpop
    }

    private init() {}

    /// Equal when no answer could tell them apart: the same id text (`-0.0` is not `0`), the
    /// same strings and the same `min_ttl` bits.
    public static func == (lhs: FlatRequest, rhs: FlatRequest) -> Bool {
        lhs.id.map(JSONText.encode) == rhs.id.map(JSONText.encode) && lhs.op == rhs.op && lhs.account == rhs.account
            && lhs.minTTL?.bitPattern == rhs.minTTL?.bitPattern && lhs.accessToken == rhs.accessToken
            && lhs.dpop == rhs.dpop
    }

    /// Lines with more unknown members than this are left to the full path, which keeps the
    /// check for their repeated keys short.
    static let maximumUnknownMembers = 16

    /// Parses `bytes`; `nil` when the full path must decide.
    public static func parse(_ bytes: UnsafeRawBufferPointer) -> FlatRequest? {
        var lexer = JSONLexer(bytes)
        var request = FlatRequest()
        guard lexer.skip(JSONLexer.Byte.openBrace) else { return nil }
        if !lexer.skip(JSONLexer.Byte.closeBrace) {
            // One bit per field read, so the usual line finds a repeated key without allocating;
            // the keys of unknown members (which the decoder ignores) are kept in a short list.
            var seen: UInt8 = 0
            var unknown: [String] = []
            repeat {
                guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon), let value = Value(&lexer) else {
                    return nil
                }
                if let field = Self.field(named: key) {
                    guard let bit = Self.bit(of: field), seen & bit == 0, request.set(field, to: value) else {
                        return nil
                    }
                    seen |= bit
                } else {
                    guard unknown.count < maximumUnknownMembers, !unknown.contains(key) else { return nil }
                    unknown.append(key)
                }
            } while lexer.skip(JSONLexer.Byte.comma)
            guard lexer.skip(JSONLexer.Byte.closeBrace) else { return nil }
        }
        return lexer.atEnd() ? request : nil
    }

    /// The field of `Request` named `key`; the keys of a `token` request are compared first,
    /// as short strings, before the generic lookup.
    private static func field(named key: String) -> Request.CodingKeys? {
        switch key {
        case "id": return .id
        case "op": return .op
        case "account": return .account
        case "min_ttl": return .minTTL
        default: return Request.CodingKeys(stringValue: key)
        }
    }

    /// A member's value as the scanner reads it.
    private enum Value {
        case string(String)
        case number(String, isInteger: Bool)
        case literal
        case dpop(DPoPRequest)

        init?(_ lexer: inout JSONLexer) {
            if lexer.peek() == JSONLexer.Byte.openBrace {
                guard let dpop = Self.dpop(&lexer) else { return nil }
                self = .dpop(dpop)
            } else if lexer.peek() == JSONLexer.Byte.quote {
                guard let text = lexer.string() else { return nil }
                self = .string(text)
            } else if let (text, isInteger) = lexer.number() {
                self = .number(text, isInteger: isInteger)
            } else if lexer.literal() {
                self = .literal
            } else {
                return nil
            }
        }

        /// An object whose members are `htm`, `htu` and `nonce`, strings, each at most once;
        /// `nil` for any other object, which the full path reads.
        private static func dpop(_ lexer: inout JSONLexer) -> DPoPRequest? {
            guard lexer.skip(JSONLexer.Byte.openBrace) else { return nil }
            var dpop = DPoPRequest(htm: nil, htu: nil)
            if lexer.skip(JSONLexer.Byte.closeBrace) { return dpop }
            repeat {
                guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon),
                    lexer.peek() == JSONLexer.Byte.quote, let value = lexer.string()
                else { return nil }
                switch key {
                case "htm" where dpop.htm == nil: dpop.htm = value
                case "htu" where dpop.htu == nil: dpop.htu = value
                case "nonce" where dpop.nonce == nil: dpop.nonce = value
                default: return nil
                }
            } while lexer.skip(JSONLexer.Byte.comma)
            return lexer.skip(JSONLexer.Byte.closeBrace) ? dpop : nil
        }
    }

    /// The bit of a field the scanner reads; `nil` for the others, which the full path reads.
    private static func bit(of field: Request.CodingKeys) -> UInt8? {
        switch field {
        case .id: return 1
        case .op: return 2
        case .account: return 4
        case .minTTL: return 8
        case .client: return 16
        case .accessToken: return 32
        case .dpop: return 64
        default: return nil
        }
    }

    /// Stores `value` under `field` as the decoder would; `false` when the decoder must decide.
    private mutating func set(_ field: Request.CodingKeys, to value: Value) -> Bool {
        switch (field, value) {
        case (.id, .string(let text)): id = .string(text)
        case (.id, .number(let text, isInteger: true)):
            guard let integer = Int64(text) else { return false }
            id = .integer(integer)
        case (.op, .string(let text)): op = text
        case (.account, .string(let text)): account = text
        case (.minTTL, .number(let text, let isInteger)):
            // The decoder refuses a literal that only rounds to zero (`1e-400`), so the one zero
            // taken here is a plain `0`.
            guard let seconds = Double(text), seconds.isFinite, seconds != 0 || isInteger else { return false }
            minTTL = seconds
        case (.accessToken, .string(let text)): accessToken = text
        case (.dpop, .dpop(let request)): dpop = request
        case (.client, .string): break
        default: return false
        }
        return true
    }
}

extension FlatRequest {
    /// The line of `request` with `id`, newline included, written by hand when the request has
    /// only the fields this type reads and they are plain values (no encoder to set up for the
    /// usual `token` request); `nil` otherwise, for the encoder to write.
    public static func line(of request: Request, id: RequestID) -> [UInt8]? {
        guard request.accounts == nil, request.accessToken == nil, request.versions == nil, request.client == nil,
            request.provider == nil, request.tokens == nil, request.force == nil, request.flow == nil,
            request.secretsFile == nil, request.redirectPort == nil, request.timeout == nil, request.idToken == nil,
            request.passphrase == nil, request.to == nil, request.scope == nil, request.resource == nil,
            request.shared == nil, request.dpop == nil, request.changes == nil, let op = request.op
        else { return nil }
        return line(op: op, account: request.account, minTTL: request.minTTL, id: id)
    }

    /// The line `{"id":…,"op":…,"account":…,"min_ttl":…}` with the fields given, newline
    /// included; `nil` when `minTTL` is not finite. `BlockingBrokerClient` writes its token
    /// request with it without building a `Request`.
    public static func line(op: String, account: String?, minTTL: Double?, id: RequestID) -> [UInt8]? {
        var text = "{\"id\":\(JSONText.encode(id)),\"op\":\(JSONText.quote(op))"
        if let account { text += ",\"account\":\(JSONText.quote(account))" }
        if let minTTL {
            guard minTTL.isFinite else { return nil }
            text += ",\"min_ttl\":\(minTTL)"
        }
        return Array((text + "}\n").utf8)
    }
}
