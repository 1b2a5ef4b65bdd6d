import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// Which token of an account a `token` request asks for: the account's own (no scope, no
/// resource), or one narrowed to a set of scopes (RFC 6749 section 6) and bound to a resource
/// (RFC 8707). Each key has its own cached token.
public struct TokenKey: Hashable, Sendable {
    /// The scope tokens asked for, sorted, each once; empty: the account's scope.
    public let scopes: [String]
    /// The absolute URI of the resource the token is for, if any.
    public let resource: String?

    /// The account's own token.
    public static let account = TokenKey(scopes: [], resource: nil)

    /// Longest `scope` text accepted, in bytes.
    public static let maximumScopeLength = 1024
    /// Most scope tokens in one request.
    public static let maximumScopeCount = 32
    /// Longest `resource` accepted, in bytes.
    public static let maximumResourceLength = 2048

    private init(scopes: [String], resource: String?) {
        self.scopes = scopes
        self.resource = resource
    }

    /// The key of a request's `scope` (space-separated; order and repeats do not matter) and
    /// `resource`, checked: each scope token in the RFC 6749 section 3.3 character set, the
    /// resource an absolute URI without a fragment (RFC 8707 section 2), both bounded.
    public static func checking(scope: String?, resource: String?) throws(BrokerFailure) -> TokenKey {
        TokenKey(scopes: try scope.map(checkedScopes) ?? [], resource: try resource.map(checkedResource))
    }

    /// Whether this is the account's own token.
    public var isAccount: Bool { scopes.isEmpty && resource == nil }

    /// The scope tokens as a `scope` parameter, or `nil` when none were asked for.
    public var scopeText: String? { scopes.isEmpty ? nil : scopes.joined(separator: " ") }

    private static func checkedScopes(_ text: String) throws(BrokerFailure) -> [String] {
        guard text.utf8.count <= maximumScopeLength else {
            throw .invalid("\"scope\" is longer than \(maximumScopeLength) bytes")
        }
        let tokens = text.utf8.split(separator: UInt8(ascii: " "))
        guard !tokens.isEmpty else { throw .invalid("\"scope\" names no scope") }
        // RFC 6749 section 3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E )
        guard tokens.allSatisfy({ $0.allSatisfy { $0 >= 0x21 && $0 <= 0x7E && $0 != 0x22 && $0 != 0x5C } }) else {
            throw .invalid("\"scope\" is scope tokens of printable ASCII (no \" or \\) separated by spaces")
        }
        let unique = Set(tokens.map { String(decoding: $0, as: UTF8.self) })
        guard unique.count <= maximumScopeCount else {
            throw .invalid("\"scope\" names more than \(maximumScopeCount) scopes")
        }
        return unique.sorted()
    }

    private static func checkedResource(_ text: String) throws(BrokerFailure) -> String {
        guard text.utf8.count <= maximumResourceLength else {
            throw .invalid("\"resource\" is longer than \(maximumResourceLength) bytes")
        }
        // RFC 3986 section 3.1: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then ":".
        let bytes = Array(text.utf8)
        let schemeEnd = bytes.firstIndex(of: UInt8(ascii: ":")) ?? 0
        let scheme = bytes[..<schemeEnd]
        let schemeIsValid =
            scheme.first.map(isLetter) == true
            && scheme.allSatisfy {
                isLetter($0) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2B || $0 == 0x2D || $0 == 0x2E
            }
        let uriCharacters = bytes.allSatisfy { $0 > 0x20 && $0 < 0x7F && !Self.notInURIs.contains($0) }
        guard schemeIsValid, schemeEnd + 1 < bytes.count, uriCharacters, URL(string: text)?.scheme != nil else {
            throw .invalid("\"resource\" must be an absolute URI (RFC 8707), such as https://api.example.com/")
        }
        guard !bytes.contains(UInt8(ascii: "#")) else {
            throw .invalid("\"resource\" must not have a fragment (RFC 8707)")
        }
        return text
    }

    /// Printable ASCII bytes that RFC 3986 never allows in a URI.
    private static let notInURIs = Set(#""<>\^`{|}"#.utf8)

    private static func isLetter(_ byte: UInt8) -> Bool {
        (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
    }
}
