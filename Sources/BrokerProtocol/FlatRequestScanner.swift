/// A fast, allocation-light reader for the common request shape: one flat JSON object whose
/// values are plain strings (no escapes) or numbers, such as
/// `{"id":7,"op":"token","account":"api","min_ttl":60}`.
///
/// It only gates the hot path: anything it does not understand (nested values, escapes,
/// literals, malformed text) yields `nil`, and the caller falls back to the full decoder.
public struct FlatRequest: Equatable, Sendable {
    public var id: RequestID?
    public var op: String?
    public var account: String?
    public var minTTL: Double?

    /// Parses `bytes`; `nil` when the line is not a flat object of plain strings and numbers.
    public static func parse(_ bytes: UnsafeRawBufferPointer) -> FlatRequest? {
        var scanner = Scanner(bytes: bytes)
        var request = FlatRequest()
        guard scanner.skip(UInt8(ascii: "{")) else { return nil }
        if scanner.skip(UInt8(ascii: "}")) { return scanner.atEnd ? request : nil }
        repeat {
            guard let key = scanner.plainString(), scanner.skip(UInt8(ascii: ":")) else { return nil }
            if scanner.peek == UInt8(ascii: "\"") {
                guard let value = scanner.plainString() else { return nil }
                switch key {
                case "id": request.id = .string(value)
                case "op": request.op = value
                case "account": request.account = value
                case "min_ttl": return nil
                default: break
                }
            } else {
                guard let (number, integer) = scanner.number() else { return nil }
                switch key {
                case "id": request.id = integer.map { .integer($0) } ?? .number(number)
                case "min_ttl": request.minTTL = number
                case "op", "account": return nil
                default: break
                }
            }
        } while scanner.skip(UInt8(ascii: ","))
        guard scanner.skip(UInt8(ascii: "}")), scanner.atEnd else { return nil }
        return request
    }

    private struct Scanner {
        let bytes: UnsafeRawBufferPointer
        var index = 0

        var peek: UInt8? {
            mutating get {
                skipWhitespace()
                return index < bytes.count ? bytes[index] : nil
            }
        }

        var atEnd: Bool {
            mutating get { peek == nil }
        }

        mutating func skipWhitespace() {
            while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x09 || bytes[index] == 0x0D {
                index += 1
            }
        }

        mutating func skip(_ byte: UInt8) -> Bool {
            guard peek == byte else { return false }
            index += 1
            return true
        }

        /// A string with no escapes and no control characters.
        mutating func plainString() -> String? {
            guard skip(UInt8(ascii: "\"")) else { return nil }
            let start = index
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    index += 1
                    return String(validating: bytes[start..<index - 1], as: UTF8.self)
                }
                if byte == UInt8(ascii: "\\") || byte < 0x20 { return nil }
                index += 1
            }
            return nil
        }

        /// A JSON number; the second value is set when it is an integer that fits in 64 bits.
        mutating func number() -> (Double, Int64?)? {
            skipWhitespace()
            let start = index
            var integral = true
            while index < bytes.count {
                switch bytes[index] {
                case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"): index += 1
                case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"), UInt8(ascii: "+"):
                    integral = false
                    index += 1
                default:
                    return Self.convert(bytes[start..<index], integral: integral)
                }
            }
            return Self.convert(bytes[start..<index], integral: integral)
        }

        private static func convert(_ slice: Slice<UnsafeRawBufferPointer>, integral: Bool) -> (Double, Int64?)? {
            guard !slice.isEmpty, slice.first != UInt8(ascii: "+"), let text = String(validating: slice, as: UTF8.self),
                let value = Double(text), value.isFinite
            else { return nil }
            // JSON forbids leading zeros ("01", "-01"), which Double(_:) would accept.
            let digits = slice.first == UInt8(ascii: "-") ? slice.dropFirst() : slice[...]
            if digits.count > 1, digits.first == UInt8(ascii: "0"),
                let next = digits.dropFirst().first, next >= UInt8(ascii: "0"), next <= UInt8(ascii: "9")
            {
                return nil
            }
            return (value, integral ? Int64(text) : nil)
        }
    }
}
