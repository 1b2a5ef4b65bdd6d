import FoundationEssentials

/// Minimal JSON text helpers for the hand-built hot-path lines.
public enum JSONText {
    /// `text` as a JSON string literal, quotes included, built byte by byte in one buffer
    /// (appending scalar by scalar to a `String` was the largest cost of a start with 1,000
    /// accounts).
    public static func quote(_ text: String) -> String {
        guard text.utf8.contains(where: needsEscape) else { return "\"" + text + "\"" }
        var out: [UInt8] = []
        appendQuoted(text.utf8, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends `bytes` (UTF-8) to `out` as a JSON string literal, quotes included: runs that
    /// need no escape are copied whole. Inlinable, so a caller in another module gets it
    /// specialized for its collection (unspecialized, every byte cost a call through the
    /// iterator's witness table: a sixth of a start with 1,000 accounts).
    @inlinable
    public static func appendQuoted(_ bytes: some Collection<UInt8>, to out: inout [UInt8]) {
        out.reserveCapacity(out.count + bytes.count + 2)
        out.append(UInt8(ascii: "\""))
        var runStart = bytes.startIndex
        var index = bytes.startIndex
        while index != bytes.endIndex {
            let byte = bytes[index]
            guard needsEscape(byte) else {
                bytes.formIndex(after: &index)
                continue
            }
            out += bytes[runStart..<index]
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                out += [UInt8(ascii: "\\"), byte]
            case UInt8(ascii: "\n"): out += #"\n"#.utf8
            case UInt8(ascii: "\r"): out += #"\r"#.utf8
            case UInt8(ascii: "\t"): out += #"\t"#.utf8
            default:
                out += #"\u00"#.utf8
                out += [hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0xF)]]
            }
            bytes.formIndex(after: &index)
            runStart = index
        }
        out += bytes[runStart..<index]
        out.append(UInt8(ascii: "\""))
    }

    @usableFromInline static func needsEscape(_ byte: UInt8) -> Bool {
        byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\")
    }

    @usableFromInline static let hexDigits = Array("0123456789abcdef".utf8)

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
