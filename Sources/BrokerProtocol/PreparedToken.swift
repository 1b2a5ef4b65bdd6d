import FoundationEssentials

/// A token result whose JSON is built once, so serving a cached token costs a
/// dictionary lookup and a few byte copies instead of a full JSON encode.
public struct PreparedToken: Sendable {
    public let result: TokenResult
    /// `"account":…,"access_token":…,…,"expires_at":"…"` without braces or `expires_in`.
    private let fields: [UInt8]

    public init(_ result: TokenResult) {
        self.result = result
        var text =
            "\"account\":\(JSONText.quote(result.account)),\"access_token\":\(JSONText.quote(result.accessToken))"
        text +=
            ",\"token_type\":\(JSONText.quote(result.tokenType)),\"expires_at\":\"\(Wire.rfc3339(result.expiresAt))\""
        if let idToken = result.idToken { text += ",\"id_token\":\(JSONText.quote(idToken))" }
        if let scope = result.scope { text += ",\"scope\":\(JSONText.quote(scope))" }
        fields = Array(text.utf8)
    }

    /// Seconds of validity left at `now`, rounded down.
    public func expiresIn(at now: Date) -> Int { Bounds.wholeSeconds(result.expiresAt.timeIntervalSince(now)) }

    /// The complete success line for request `id`, newline included.
    public func line(id: RequestID?, now: Date) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(fields.count + 64)
        bytes += #"{"id":"#.utf8
        bytes += JSONText.encode(id ?? .null).utf8
        bytes += #","ok":true,"result":{"#.utf8
        bytes += fields
        bytes += #","expires_in":"#.utf8
        bytes += String(expiresIn(at: now)).utf8
        bytes += "}}\n".utf8
        return bytes
    }
}

/// Minimal JSON text helpers for the hand-built hot-path lines.
public enum JSONText {
    /// `text` as a JSON string literal, quotes included, built byte by byte in one buffer
    /// (appending scalar by scalar to a `String` was the largest cost of a start with 1,000
    /// accounts).
    public static func quote(_ text: String) -> String {
        guard text.utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else {
            return "\"" + text + "\""
        }
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count + 2)
        out.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                out += [UInt8(ascii: "\\"), byte]
            case UInt8(ascii: "\n"): out += #"\n"#.utf8
            case UInt8(ascii: "\r"): out += #"\r"#.utf8
            case UInt8(ascii: "\t"): out += #"\t"#.utf8
            case ..<0x20:
                out += #"\u00"#.utf8
                out += [hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0xF)]]
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
        return String(decoding: out, as: UTF8.self)
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    /// A request id as JSON text.
    public static func encode(_ id: RequestID) -> String {
        switch id {
        case .string(let value): return quote(value)
        case .integer(let value): return String(value)
        case .number(let value):
            return value.isFinite ? "\(value)" : "null"
        case .null: return "null"
        }
    }
}
