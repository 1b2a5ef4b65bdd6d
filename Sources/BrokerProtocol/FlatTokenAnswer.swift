/// A fast reader for the answer a token request usually gets, in the shape `PreparedToken`
/// writes it: `{"id":1,"ok":true,"result":{"account":"api","access_token":"…",…}}`.
///
/// It spares a client the decoder for the one answer scripts ask for most (`brokerctl token`).
/// It reads only what the full path (`ResponseHead`, then `ResultBody<TokenResult>`) would read
/// the same way: a strict RFC 8259 object with the keys `id` (a plain integer), `ok` (`true`)
/// and `result`, each once, whose `result` is one flat object holding every field
/// `TokenResult` requires with the right JSON type, none twice. Anything else yields `nil`, and
/// the line goes to the full path. The text of `expires_at` is not read as a date: its callers
/// want the token alone.
public struct FlatTokenAnswer: Equatable, Sendable {
    public var id: Int64
    public var accessToken: String

    /// Reads `bytes`; `nil` when the full path must decide.
    public static func parse(_ bytes: UnsafeRawBufferPointer) -> FlatTokenAnswer? {
        var lexer = JSONLexer(bytes)
        var id: Int64?
        var ok = false
        var accessToken: String?
        guard lexer.skip(JSONLexer.Byte.openBrace) else { return nil }
        repeat {
            guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon) else { return nil }
            switch key {
            case "id" where id == nil:
                guard let (text, isInteger) = lexer.number(), isInteger, let integer = Int64(text) else { return nil }
                id = integer
            case "ok" where !ok:
                guard lexer.literal("true") else { return nil }
                ok = true
            case "result" where accessToken == nil:
                guard let token = result(&lexer) else { return nil }
                accessToken = token
            default:
                return nil
            }
        } while lexer.skip(JSONLexer.Byte.comma)
        guard lexer.skip(JSONLexer.Byte.closeBrace), lexer.atEnd(), ok, let id, let accessToken else { return nil }
        return FlatTokenAnswer(id: id, accessToken: accessToken)
    }

    /// The keys of `TokenResult` a flat result holds: the required ones, then the optional ones.
    private static let stringKeys: [String] = ["account", "access_token", "token_type", "expires_at"]
    private static let optionalStringKeys: [String] = ["id_token", "scope"]

    /// The access token of a flat `result` object holding every required field once.
    private static func result(_ lexer: inout JSONLexer) -> String? {
        guard lexer.skip(JSONLexer.Byte.openBrace) else { return nil }
        var seen: [String] = []
        var accessToken: String?
        repeat {
            guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon), !seen.contains(key) else { return nil }
            seen.append(key)
            if key == "expires_in" {
                guard let (text, isInteger) = lexer.number(), isInteger, Int(text) != nil else { return nil }
            } else if stringKeys.contains(key) || optionalStringKeys.contains(key) {
                guard let text = lexer.string() else { return nil }
                if key == "access_token" { accessToken = text }
            } else {
                return nil
            }
        } while lexer.skip(JSONLexer.Byte.comma)
        guard lexer.skip(JSONLexer.Byte.closeBrace), seen.contains("expires_in"),
            stringKeys.allSatisfy(seen.contains)
        else { return nil }
        return accessToken
    }
}
