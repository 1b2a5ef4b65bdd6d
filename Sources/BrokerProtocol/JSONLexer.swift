/// A strict reader of JSON tokens (RFC 8259) over raw bytes.
///
/// Both readers of a request line stand on it, the fast path (`FlatRequest`) and the check
/// before the full decoder (`JSONLine`), so the two accept exactly one grammar: whitespace is
/// space, tab, LF and CR; strings are valid UTF-8 without raw control characters; numbers have
/// no leading zeros, no bare `.` and no sign but a leading `-`.
struct JSONLexer {
    private let bytes: UnsafeRawBufferPointer
    private var index = 0

    init(_ bytes: UnsafeRawBufferPointer) {
        self.bytes = bytes
    }

    /// The next byte after any whitespace, not consumed; `nil` at the end.
    mutating func peek() -> UInt8? {
        while index < bytes.count, Self.isWhitespace(bytes[index]) { index += 1 }
        return index < bytes.count ? bytes[index] : nil
    }

    /// Whether only whitespace is left.
    mutating func atEnd() -> Bool { peek() == nil }

    /// Consumes `byte` when it comes next (after whitespace).
    mutating func skip(_ byte: UInt8) -> Bool {
        guard peek() == byte else { return false }
        index += 1
        return true
    }

    /// A string literal with its escapes decoded; `nil` when the next token is not a valid one.
    mutating func string() -> String? {
        guard skip(Byte.quote) else { return nil }
        var runStart = index
        /// Set at the first escape: the text so far, decoded.
        var decoded: [UInt8]?
        /// Every byte of the text OR-ed together: below 0x80 when it is all ASCII.
        var highBits: UInt8 = 0
        while index < bytes.count {
            let byte = bytes[index]
            if byte == Byte.quote {
                let run = UnsafeRawBufferPointer(rebasing: bytes[runStart..<index])
                index += 1
                guard var text = decoded else { return Self.text(run, isASCII: highBits < 0x80) }
                text += run
                return String(validating: text, as: UTF8.self)
            }
            if byte < 0x20 { return nil }
            highBits |= byte
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

    /// `run` as text when it is valid UTF-8. ASCII, valid as it is, skips the generic validator:
    /// reading the strings of a request line was the largest cost of a cached token.
    private static func text(_ run: UnsafeRawBufferPointer, isASCII: Bool) -> String? {
        guard isASCII else { return String(validating: run, as: UTF8.self) }
        return String(decoding: run.assumingMemoryBound(to: UInt8.self), as: UTF8.self)
    }

    /// A number literal: its text, and whether it is a plain integer (no fraction, no exponent).
    /// Nothing is consumed when the next token is not a number.
    mutating func number() -> (text: String, isInteger: Bool)? {
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
    mutating func literal() -> Bool {
        guard peek() != nil else { return false }
        for word in Self.literals where matches(word) {
            index += word.utf8CodeUnitCount
            return true
        }
        return false
    }

    /// Consumes the literal `word` (`true`, `false` or `null`) when it comes next.
    mutating func literal(_ word: StaticString) -> Bool {
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
    enum Byte {
        static let quote = UInt8(ascii: "\"")
        static let backslash = UInt8(ascii: "\\")
        static let minus = UInt8(ascii: "-")
        static let colon = UInt8(ascii: ":")
        static let comma = UInt8(ascii: ",")
        static let openBrace = UInt8(ascii: "{")
        static let closeBrace = UInt8(ascii: "}")
        static let openBracket = UInt8(ascii: "[")
        static let closeBracket = UInt8(ascii: "]")
    }
}
