/// A strict reader of JSON tokens (RFC 8259) over raw bytes.
///
/// Both readers of a request line stand on it, the fast path (`FlatRequest`) and the check
/// before the full decoder (`JSONLine`), so the two accept exactly one grammar: whitespace is
/// space, tab, LF and CR; strings are valid UTF-8 without raw control characters; numbers have
/// no leading zeros, no bare `.` and no sign but a leading `-`. The vault's reader of its own
/// plaintext (BrokerVault) stands on it too.
public struct JSONLexer {
    private let bytes: UnsafeRawBufferPointer
    private var index = 0

    public init(_ bytes: UnsafeRawBufferPointer) {
        self.bytes = bytes
    }

    /// How many bytes are consumed.
    public var offset: Int { index }

    /// The next byte after any whitespace, not consumed; `nil` at the end.
    public mutating func peek() -> UInt8? {
        while index < bytes.count, Self.isWhitespace(bytes[index]) { index += 1 }
        return index < bytes.count ? bytes[index] : nil
    }

    /// Whether only whitespace is left.
    public mutating func atEnd() -> Bool { peek() == nil }

    /// Consumes `byte` when it comes next (after whitespace).
    public mutating func skip(_ byte: UInt8) -> Bool {
        guard peek() == byte else { return false }
        index += 1
        return true
    }

    /// A string literal with its escapes decoded; `nil` when the next token is not a valid one.
    public mutating func string() -> String? {
        withString { String(decoding: $0, as: UTF8.self) }
    }

    /// Calls `body` with the UTF-8 of a string literal, its escapes decoded, and returns what
    /// `body` returns; `nil` (and `body` not called) when the next token is not a valid string.
    /// Without escapes, `body` sees the input's own bytes: no copy is made (for a secret that
    /// goes straight into guarded memory).
    public mutating func withString<T>(_ body: (UnsafeRawBufferPointer) -> T) -> T? {
        guard skip(Byte.quote) else { return nil }
        var runStart = index
        /// Set at the first escape: the text so far, decoded.
        var decoded: [UInt8]?
        /// Every byte of the literal OR-ed together: below 0x80 means ASCII, valid UTF-8.
        var bits: UInt8 = 0
        while index < bytes.count {
            let byte = bytes[index]
            if byte == Byte.quote {
                let run = UnsafeRawBufferPointer(rebasing: bytes[runStart..<index])
                index += 1
                guard var text = decoded else {
                    guard bits < 0x80 || Self.isUTF8(run) else { return nil }
                    return body(run)
                }
                text += run
                return text.withUnsafeBytes { text in
                    guard bits < 0x80 || Self.isUTF8(text) else { return nil }
                    return body(text)
                }
            }
            if byte < 0x20 { return nil }
            bits |= byte
            guard byte == Byte.backslash else {
                index += 1
                continue
            }
            var text = decoded ?? []
            text += bytes[runStart..<index]
            index += 1
            guard let scalar = escape() else { return nil }
            UTF8.encode(scalar) { text.append($0) }
            decoded = text
            runStart = index
        }
        return nil
    }

    /// Consumes one value of any kind (object and array contents included), nested at most
    /// `depth` deep; whether it was a valid value.
    public mutating func skipValue(depth: Int = 64) -> Bool {
        guard depth > 0, let next = peek() else { return false }
        switch next {
        case Byte.quote:
            return withString { _ in true } != nil
        case Byte.openBrace, Byte.openBracket:
            let isObject = next == Byte.openBrace
            index += 1
            if skip(isObject ? Byte.closeBrace : Byte.closeBracket) { return true }
            repeat {
                if isObject {
                    guard withString({ _ in true }) != nil, skip(Byte.colon) else { return false }
                }
                guard skipValue(depth: depth - 1) else { return false }
            } while skip(Byte.comma)
            return skip(isObject ? Byte.closeBrace : Byte.closeBracket)
        default:
            return number() != nil || literal()
        }
    }

    /// A number literal: its text, and whether it is a plain integer (no fraction, no exponent).
    /// Nothing is consumed when the next token is not a number.
    public mutating func number() -> (text: String, isInteger: Bool)? {
        guard peek() != nil else { return nil }
        let start = index
        guard let isInteger = numberGrammar() else {
            index = start
            return nil
        }
        return (String(decoding: bytes[start..<index], as: UTF8.self), isInteger)
    }

    /// Consumes `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`; whether it had neither
    /// fraction nor exponent, `nil` when the grammar fails.
    private mutating func numberGrammar() -> Bool? {
        _ = consume(Byte.minus)
        if !consume(UInt8(ascii: "0")) {
            guard digits() > 0 else { return nil }
        }
        var isInteger = true
        if consume(UInt8(ascii: ".")) {
            guard digits() > 0 else { return nil }
            isInteger = false
        }
        if consume(UInt8(ascii: "e")) || consume(UInt8(ascii: "E")) {
            _ = consume(UInt8(ascii: "+")) || consume(Byte.minus)
            guard digits() > 0 else { return nil }
            isInteger = false
        }
        return isInteger
    }

    /// One of the literals `true`, `false` and `null`.
    public mutating func literal() -> Bool {
        guard peek() != nil else { return false }
        for word in Self.literals where matches(word) {
            index += word.utf8CodeUnitCount
            return true
        }
        return false
    }

    /// Consumes the literal `word` (`true`, `false` or `null`) when it comes next.
    public mutating func literal(_ word: StaticString) -> Bool {
        guard peek() != nil, matches(word) else { return false }
        index += word.utf8CodeUnitCount
        return true
    }

    private static let literals: [StaticString] = ["true", "false", "null"]

    private func matches(_ word: StaticString) -> Bool {
        let count = word.utf8CodeUnitCount
        guard bytes.count - index >= count else { return false }
        return word.withUTF8Buffer { expected in
            expected.indices.allSatisfy { bytes[index + $0] == expected[$0] }
        }
    }

    /// The character after a backslash; a `\u` surrogate must come as a high-low pair.
    private mutating func escape() -> Unicode.Scalar? {
        guard index < bytes.count else { return nil }
        let byte = bytes[index]
        index += 1
        switch byte {
        case Byte.quote, Byte.backslash, UInt8(ascii: "/"): return Unicode.Scalar(byte)
        case UInt8(ascii: "b"): return "\u{08}"
        case UInt8(ascii: "f"): return "\u{0C}"
        case UInt8(ascii: "n"): return "\n"
        case UInt8(ascii: "r"): return "\r"
        case UInt8(ascii: "t"): return "\t"
        case UInt8(ascii: "u"):
            guard let unit = hexUnit() else { return nil }
            guard UTF16.isLeadSurrogate(unit) else { return Unicode.Scalar(unit) }
            guard consume(Byte.backslash), consume(UInt8(ascii: "u")), let low = hexUnit(), UTF16.isTrailSurrogate(low)
            else { return nil }
            return Unicode.Scalar(0x10000 + (UInt32(unit - 0xD800) << 10) + UInt32(low - 0xDC00))
        default: return nil
        }
    }

    /// Four hex digits.
    private mutating func hexUnit() -> UInt16? {
        guard bytes.count - index >= 4 else { return nil }
        var unit: UInt16 = 0
        for _ in 0..<4 {
            guard let digit = Self.hexValue(bytes[index]) else { return nil }
            unit = unit << 4 | UInt16(digit)
            index += 1
        }
        return unit
    }

    /// Consumes `byte` when it is the very next byte (no whitespace skipped).
    private mutating func consume(_ byte: UInt8) -> Bool {
        guard index < bytes.count, bytes[index] == byte else { return false }
        index += 1
        return true
    }

    /// Consumes a run of decimal digits and returns its length.
    private mutating func digits() -> Int {
        let start = index
        while index < bytes.count, Self.isDigit(bytes[index]) { index += 1 }
        return index - start
    }

    /// Whether `bytes` are valid UTF-8 (as `String(validating:)` requires).
    private static func isUTF8(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var iterator = bytes.makeIterator()
        var parser = Unicode.UTF8.ForwardParser()
        while true {
            switch parser.parseScalar(from: &iterator) {
            case .valid: continue
            case .emptyInput: return true
            case .error: return false
            }
        }
    }

    private static func isWhitespace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D
    }

    private static func isDigit(_ byte: UInt8) -> Bool {
        byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// The structural bytes of JSON.
    public enum Byte {
        public static let quote = UInt8(ascii: "\"")
        public static let backslash = UInt8(ascii: "\\")
        public static let minus = UInt8(ascii: "-")
        public static let colon = UInt8(ascii: ":")
        public static let comma = UInt8(ascii: ",")
        public static let openBrace = UInt8(ascii: "{")
        public static let closeBrace = UInt8(ascii: "}")
        public static let openBracket = UInt8(ascii: "[")
        public static let closeBracket = UInt8(ascii: "]")
    }
}
