/// Checks what TOMLKit's parser (toml++) must not see. toml++ asserts, and so aborts the whole
/// broker at start or at `reload`, when a table header does not start with a key (`[.a]`,
/// `[=]`, `[é]`) or an array holds a `}` where a value belongs (`a = [}`): both found by
/// fuzzing; SwiftPM builds it without `NDEBUG`. This refuses such a header, a bracket that
/// closes what it did not open, any character beyond ASCII outside strings and comments (TOML
/// allows none there), and NUL anywhere, before the parser runs; everything else is left to the
/// parser's own errors.
enum TOMLPrecheck {
    /// The 1-based line of the first thing refused, or `nil` when there is none.
    static func firstForbiddenLine(_ text: String) -> Int? {
        var scanner = Scanner(bytes: Array(text.utf8))
        return scanner.firstForbiddenLine()
    }

    private struct Scanner {
        let bytes: [UInt8]
        var index = 0
        var line = 1
        /// Only spaces and tabs so far on this line.
        var atLineStart = true
        /// The arrays and inline tables open in a value (`[` or `{`); a `[` at a line start
        /// outside any is a table header.
        var open: [UInt8] = []

        mutating func firstForbiddenLine() -> Int? {
            while index < bytes.count {
                let byte = bytes[index]
                if byte == 0 || byte >= 0x80 { return line }
                switch byte {
                case UInt8(ascii: "\n"):
                    line += 1
                    atLineStart = true
                    index += 1
                case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\r"):
                    index += 1
                case UInt8(ascii: "#"):
                    while index < bytes.count, bytes[index] != UInt8(ascii: "\n") {
                        if bytes[index] == 0 { return line }
                        index += 1
                    }
                case UInt8(ascii: "\""), UInt8(ascii: "'"):
                    atLineStart = false
                    if !skipString() { return line }
                case UInt8(ascii: "[") where atLineStart && open.isEmpty:
                    atLineStart = false
                    if !headerStartsWithAKey() { return line }
                case UInt8(ascii: "["), UInt8(ascii: "{"):
                    atLineStart = false
                    open.append(byte)
                    index += 1
                case UInt8(ascii: "]"), UInt8(ascii: "}"):
                    // With nothing open, a header's own `]` (the parser judges the rest).
                    atLineStart = false
                    let opener = byte == UInt8(ascii: "]") ? UInt8(ascii: "[") : UInt8(ascii: "{")
                    if let innermost = open.popLast(), innermost != opener { return line }
                    index += 1
                default:
                    atLineStart = false
                    index += 1
                }
            }
            return nil
        }

        /// At `[` or `[[`: whether spaces and then a bare-key character, a quote or `]` follow
        /// (what toml++ checks itself). Leaves `index` at that character.
        mutating func headerStartsWithAKey() -> Bool {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "[") { index += 1 }
            while index < bytes.count, bytes[index] == UInt8(ascii: " ") || bytes[index] == UInt8(ascii: "\t") {
                index += 1
            }
            guard index < bytes.count else { return true }  // the parser reports the end of the file
            let byte = bytes[index]
            let bareKey =
                (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
                || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
                || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
            return bareKey || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "'") || byte == UInt8(ascii: "]")
        }

        /// Skips a string (basic, literal, or either multi-line form), counting its lines;
        /// `false` when it holds NUL. An unterminated one-line string ends at the line's end.
        mutating func skipString() -> Bool {
            let quote = bytes[index]
            let triple = index + 2 < bytes.count && bytes[index + 1] == quote && bytes[index + 2] == quote
            index += triple ? 3 : 1
            while index < bytes.count {
                let byte = bytes[index]
                if byte == 0 { return false }
                if byte == UInt8(ascii: "\n") {
                    if !triple { return true }
                    line += 1
                } else if quote == UInt8(ascii: "\""), byte == UInt8(ascii: "\\") {
                    index += 1  // an escaped character is never the closing quote
                    if index < bytes.count, bytes[index] == UInt8(ascii: "\n") { line += 1 }
                } else if byte == quote {
                    if !triple {
                        index += 1
                        return true
                    }
                    if index + 2 < bytes.count, bytes[index + 1] == quote, bytes[index + 2] == quote {
                        index += 3
                        return true
                    }
                }
                index += 1
            }
            return true
        }
    }
}
