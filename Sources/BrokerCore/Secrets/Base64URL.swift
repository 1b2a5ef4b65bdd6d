import FoundationEssentials

/// base64url without padding (RFC 4648 section 5), as PKCE, JWTs and DPoP
/// proofs write it.
enum Base64URL {
    static func encode(_ bytes: [UInt8]) -> String {
        var text = Data(bytes).base64EncodedString()
        text = text.replacing("+", with: "-").replacing("/", with: "_")
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }

    /// The bytes of `text` (padding optional); `nil` when it is not base64url.
    static func decode(_ text: some StringProtocol) -> Data? {
        guard text.utf8.allSatisfy({ $0 < 0x80 && $0 != UInt8(ascii: "+") && $0 != UInt8(ascii: "/") }) else {
            return nil
        }
        var standard = String(text).replacing("-", with: "+").replacing("_", with: "/")
        while standard.utf8.count % 4 != 0 { standard += "=" }
        return Data(base64Encoded: standard)
    }
}
