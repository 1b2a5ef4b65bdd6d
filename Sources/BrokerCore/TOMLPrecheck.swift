/// Checks what TOMLKit's parser (toml++) must not see: toml++ asserts (and so aborts the whole
/// broker, at start or at `reload`) on some invalid input, such as a non-ASCII bare key
/// (`[é]`). TOML allows characters beyond ASCII only inside strings and comments, so this
/// refuses any other place, and NUL anywhere, before the parser runs.
enum TOMLPrecheck {
    /// The 1-based line of the first byte TOML forbids where it stands, or `nil` when there is none.
    static func firstForbiddenLine(_ text: String) -> Int? {
        let bytes = Array(text.utf8)
        var line = 1
        var index = 0
        /// The delimiter of the string being read (`"`, `'`, `"""` or `'''`), if any.
        var quote: [UInt8]?
        var inComment = false
        func starts(with delimiter: [UInt8]) -> Bool {
            index + delimiter.count <= bytes.count && Array(bytes[index..<index + delimiter.count]) == delimiter
        }
        while index < bytes.count {
            let byte = bytes[index]
            if byte == 0 { return line }
            if byte == UInt8(ascii: "\n") {
                line += 1
                inComment = false
                if let open = quote, open.count == 1 { quote = nil }  // a one-line string ends here (unterminated)
                index += 1
                continue
            }
            if inComment {
                index += 1
                continue
            }
            if let open = quote {
                if open.first == UInt8(ascii: "\""), byte == UInt8(ascii: "\\") {
                    index += 2  // an escape: the next byte is never the closing quote
                    continue
                }
                if starts(with: open) {
                    index += open.count
                    quote = nil
                    continue
                }
                index += 1
                continue
            }
            if byte >= 0x80 { return line }
            switch byte {
            case UInt8(ascii: "#"):
                inComment = true
                index += 1
            case UInt8(ascii: "\""), UInt8(ascii: "'"):
                let triple = [byte, byte, byte]
                quote = starts(with: triple) ? triple : [byte]
                index += quote!.count
            default:
                index += 1
            }
        }
        return nil
    }
}
