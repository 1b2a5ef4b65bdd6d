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
    /// `text` as a JSON string literal, quotes included.
    public static func quote(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out +=
                    "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                    + String(scalar.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

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
