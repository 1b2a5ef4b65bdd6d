import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// The request a program asks a proof for (`token` with `dpop`, `protocol/PROTOCOL.md`): its
/// method, its URL and the resource server's nonce, each checked before anything is signed, so
/// that a proof never says what its caller did not mean (a method that is no HTTP token, a
/// URL the broker would not call itself, a header-breaking nonce).
public struct DPoPTarget: Sendable, Equatable {
    /// The longest `htu` taken, in bytes.
    public static let urlLimit = 2048
    /// The longest `htm`: longer than any registered method, short enough to bound the proof.
    public static let methodLimit = 32
    /// The longest nonce, from a program or an IdP.
    public static let nonceLimit = 1024

    public let method: String
    /// The URL without its query and fragment (RFC 9449 section 4.2: `htu`), in normal form:
    /// written once, here, for the check and the proof.
    public let url: String
    /// The URL as it is compared and signed (`NormalizedURL`).
    public let normalized: NormalizedURL
    public let nonce: String?

    /// Checks the three fields; `BrokerFailure.invalid` (`bad_request`) names the one refused.
    public init(method: String?, url: String?, nonce: String?) throws(BrokerFailure) {
        guard let method, !method.isEmpty, method.utf8.count <= Self.methodLimit,
            method.utf8.allSatisfy(Self.isTokenCharacter)
        else {
            throw .invalid(
                "\"dpop\" needs \"htm\": an HTTP method such as GET (at most \(Self.methodLimit) characters)")
        }
        guard let url, let checked = Self.checkedURL(url) else {
            throw .invalid(
                "\"dpop\" needs \"htu\": an absolute https URL (http only for loopback) of at most \(Self.urlLimit) bytes, "
                    + "each % starting an escape"
            )
        }
        if let nonce, !Self.isNonce(nonce) {
            throw .invalid(
                "\"dpop\" \"nonce\" must be 1 to \(Self.nonceLimit) printable ASCII characters without quotes")
        }
        self.method = method
        self.normalized = checked.normalized
        self.url = checked.text
        self.nonce = nonce
    }

    /// `text` without query and fragment in normal form, and written out, when it is an absolute
    /// URL the broker would call (`EndpointPolicy`), without user information, in printable
    /// ASCII; `nil` otherwise.
    package static func checkedURL(_ text: String) -> (normalized: NormalizedURL, text: String)? {
        guard text.utf8.count <= urlLimit, text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }),
            let normalized = NormalizedURL(text)
        else { return nil }
        let written = normalized.description
        // RFC 9110 section 4.2.4: http(s) URIs carry no user information.
        guard let url = URL(string: written), EndpointPolicy.isAllowed(url), url.user == nil, url.password == nil
        else { return nil }
        return (normalized, written)
    }

    /// `text` up to its first `?` or `#`.
    package static func withoutQueryAndFragment(_ text: String) -> String {
        String(text[..<(text.firstIndex { $0 == "?" || $0 == "#" } ?? text.endIndex)])
    }

    /// A nonce as RFC 9449 section 8.1 writes it (`1*NQCHAR`), bounded.
    package static func isNonce(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.count <= nonceLimit
            && text.utf8.allSatisfy { $0 >= 0x21 && $0 <= 0x7E && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }
    }

    /// The symbols among RFC 9110's `tchar`s.
    private static let symbols = Set("!#$%&'*+-.^_`|~".utf8)

    /// RFC 9110 section 5.6.2 `tchar`.
    private static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "A")...UInt8(ascii: "Z"):
            return true
        default: return symbols.contains(byte)
        }
    }
}
