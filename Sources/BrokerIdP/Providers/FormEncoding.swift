import BrokerModel
import BrokerSecrets

/// `application/x-www-form-urlencoded` bodies (RFC 6749 appendix B): what `oauth2` sends, and
/// how a secret looks when an IdP echoes a request body (so it can be redacted in that form too).
package enum FormEncoding {
    private static let unreserved = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~".utf8)

    /// `text` with every UTF-8 byte outside the unreserved characters written `%XX`.
    package static func escape(_ text: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var escaped: [UInt8] = []
        escaped.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            if unreserved.contains(byte) {
                escaped.append(byte)
            } else {
                escaped += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
            }
        }
        return String(decoding: escaped, as: UTF8.self)
    }

    package static func encode(_ pairs: [(String, String)]) -> String {
        pairs.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }
}
