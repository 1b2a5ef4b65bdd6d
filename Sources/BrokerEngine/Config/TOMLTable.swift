import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault

/// A TOML document as `broker.toml` needs it: a strict subset of TOML 1.0, read in Swift (it
/// replaces TOMLKit, whose Swift layer imports Foundation and so links ICU, and whose C++
/// parser aborts on some malformed input). Every document it accepts means what TOML says it
/// means; what it does not read is refused with the line:
/// - table headers `[a.b."c"]` (not arrays of tables `[[a]]`),
/// - `key = value` with one bare or quoted key (no dotted keys),
/// - strings of all four kinds, integers (decimal, `0x`, `0o`, `0b`), floats (with `inf` and
///   `nan`), booleans, arrays (nested, over several lines, with comments and a trailing comma)
///   and inline tables (not dates or times).
///
/// One file for the whole reader: its parts share one cursor and one set of refusals, and a
/// reviewer checks it against the TOML grammar from top to bottom.
package struct TOMLTable: Sendable, Equatable {
    /// The keys in the order they were defined.
    private(set) var keys: [String] = []
    private var values: [String: TOMLValue] = [:]

    package subscript(key: String) -> TOMLValue? { values[key] }

    /// Parses a whole document.
    package init(parsing text: String) throws(TOMLError) {
        var parser = TOMLParser(bytes: Array(text.utf8))
        self = try parser.document()
    }

    package init() {}

    /// Adds `value` under a key not yet defined.
    fileprivate mutating func define(_ key: String, _ value: TOMLValue) -> Bool {
        guard values[key] == nil else { return false }
        keys.append(key)
        values[key] = value
        return true
    }

    /// Runs `body` on the table at `key`, created empty when absent; `false` when `key` holds
    /// something else.
    fileprivate mutating func withTable(_ key: String, _ body: (inout TOMLTable) throws(TOMLError) -> Void)
        throws(TOMLError) -> Bool
    {
        var table: TOMLTable
        switch values[key] {
        case nil:
            keys.append(key)
            table = TOMLTable()
        case .table(let existing):
            table = existing
        default:
            return false
        }
        values[key] = nil  // so `table` is not shared while it changes
        try body(&table)
        values[key] = .table(table)
        return true
    }
}

/// One TOML value.
package enum TOMLValue: Sendable, Equatable {
    case string(String)
    case integer(Int64)
    case float(Double)
    case boolean(Bool)
    case array([TOMLValue])
    case table(TOMLTable)

    package var string: String? {
        if case .string(let text) = self { return text }
        return nil
    }

    /// The value of an integer (not of a float).
    package var int: Int64? {
        if case .integer(let number) = self { return number }
        return nil
    }

    /// The value of a float (not of an integer).
    package var double: Double? {
        if case .float(let number) = self { return number }
        return nil
    }

    package var array: [TOMLValue]? {
        if case .array(let values) = self { return values }
        return nil
    }

    package var table: TOMLTable? {
        if case .table(let table) = self { return table }
        return nil
    }
}

/// Why a document was refused, and on which line (1-based).
package struct TOMLError: Error, Sendable, Equatable, CustomStringConvertible {
    package var line: Int
    package var reason: String

    package var description: String { reason }
}

/// A recursive-descent reader over the document's UTF-8 bytes.
private struct TOMLParser {
    /// Deepest nesting of arrays and inline tables read (deeper input is refused, not recursed into).
    static let maximumDepth = 32

    let bytes: [UInt8]
    var index = 0
    var line = 1
    var root = TOMLTable()
    /// The tables a header defined, by path; a second header for one is an error.
    var headers: Set<[String]> = []
    /// The paths `key = value` lines defined; no header may open or extend one (inline tables are whole).
    var assigned: Set<[String]> = []
    /// The table that `key = value` lines go into.
    var current: [String] = []

    init(bytes: [UInt8]) { self.bytes = bytes }

    var peek: UInt8? { index < bytes.count ? bytes[index] : nil }

    func peek(_ offset: Int) -> UInt8? { index + offset < bytes.count ? bytes[index + offset] : nil }

    func fail(_ reason: String) -> TOMLError { TOMLError(line: line, reason: reason) }

    mutating func document() throws(TOMLError) -> TOMLTable {
        while true {
            skipSpaces()
            guard let byte = peek else { return root }
            switch byte {
            case UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "#"): break
            case UInt8(ascii: "["): try header()
            default: try keyValue()
            }
            try endOfLine()
        }
    }

    // MARK: Lines

    mutating func header() throws(TOMLError) {
        index += 1
        if peek == UInt8(ascii: "[") { throw fail("arrays of tables ([[...]]) are not supported here") }
        var path: [String] = []
        repeat {
            skipSpaces()
            path.append(try key())
            skipSpaces()
        } while take(".")
        guard take("]") else { throw fail("a table header ends with ]") }
        guard headers.insert(path).inserted else {
            throw fail("the table [\(path.joined(separator: "."))] is defined twice")
        }
        if let length = (1...path.count).first(where: { assigned.contains(Array(path.prefix($0))) }) {
            throw fail("\(path.prefix(length).joined(separator: ".")) is already defined by a key = value line")
        }
        try root.open(path, line: line)
        current = path
    }

    mutating func keyValue() throws(TOMLError) {
        let name = try key()
        skipSpaces()
        if peek == UInt8(ascii: ".") { throw fail("dotted keys are not supported here; use a [table] header") }
        guard take("=") else { throw fail("expected = after the key \(name)") }
        skipSpaces()
        let value = try self.value(depth: 0)
        let line = line
        try root.open(current, line: line) { (table: inout TOMLTable) throws(TOMLError) in
            guard table.define(name, value) else {
                throw TOMLError(line: line, reason: "the key \(name) is defined twice")
            }
        }
        assigned.insert(current + [name])
    }

    /// Spaces, then a comment or nothing, then a newline or the end.
    mutating func endOfLine() throws(TOMLError) {
        skipSpaces()
        if peek == UInt8(ascii: "#") { try skipComment() }
        if take("\r") {
            guard peek == UInt8(ascii: "\n") else { throw fail("a carriage return must be followed by a newline") }
        }
        guard let byte = peek else { return }
        guard byte == UInt8(ascii: "\n") else { throw fail("expected the end of the line") }
        index += 1
        line += 1
    }

    mutating func skipComment() throws(TOMLError) {
        while let byte = peek, byte != UInt8(ascii: "\n") {
            if byte == UInt8(ascii: "\r"), peek(1) == UInt8(ascii: "\n") { return }
            if Self.isControl(byte) { throw fail("a control character in a comment") }
            index += 1
        }
    }

    mutating func skipSpaces() {
        while peek == UInt8(ascii: " ") || peek == UInt8(ascii: "\t") { index += 1 }
    }

    /// Spaces, newlines and comments (inside an array).
    mutating func skipBlank() throws(TOMLError) {
        while true {
            skipSpaces()
            switch peek {
            case UInt8(ascii: "#"): try skipComment()
            case UInt8(ascii: "\n"):
                index += 1
                line += 1
            case UInt8(ascii: "\r") where peek(1) == UInt8(ascii: "\n"):
                index += 2
                line += 1
            default: return
            }
        }
    }

    mutating func take(_ character: Unicode.Scalar) -> Bool {
        guard peek == UInt8(ascii: character) else { return false }
        index += 1
        return true
    }

    // MARK: Keys and values

    /// A bare key (ASCII letters, digits, `-`, `_`) or a one-line quoted one.
    mutating func key() throws(TOMLError) -> String {
        switch peek {
        case UInt8(ascii: "\""):
            if peek(1) == UInt8(ascii: "\""), peek(2) == UInt8(ascii: "\"") { throw fail("a key cannot be multi-line") }
            return try basicString()
        case UInt8(ascii: "'"):
            if peek(1) == UInt8(ascii: "'"), peek(2) == UInt8(ascii: "'") { throw fail("a key cannot be multi-line") }
            return try literalString()
        default:
            let start = index
            while let byte = peek, Self.isBareKey(byte) { index += 1 }
            guard index > start else { throw fail("expected a key (letters, digits, - and _, or a quoted key)") }
            return String(decoding: bytes[start..<index], as: UTF8.self)
        }
    }

    mutating func value(depth: Int) throws(TOMLError) -> TOMLValue {
        guard depth < Self.maximumDepth else { throw fail("arrays and tables are nested too deeply") }
        switch peek {
        case UInt8(ascii: "\""):
            if peek(1) == UInt8(ascii: "\""), peek(2) == UInt8(ascii: "\"") { return .string(try multiLineString()) }
            return .string(try basicString())
        case UInt8(ascii: "'"):
            if peek(1) == UInt8(ascii: "'"), peek(2) == UInt8(ascii: "'") { return .string(try multiLineString()) }
            return .string(try literalString())
        case UInt8(ascii: "["): return .array(try array(depth: depth))
        case UInt8(ascii: "{"): return .table(try inlineTable(depth: depth))
        case nil: throw fail("expected a value")
        default: return try scalar()
        }
    }

    mutating func array(depth: Int) throws(TOMLError) -> [TOMLValue] {
        index += 1
        var values: [TOMLValue] = []
        while true {
            try skipBlank()
            if take("]") { return values }
            values.append(try value(depth: depth + 1))
            try skipBlank()
            if take("]") { return values }
            guard take(",") else { throw fail("expected , or ] in an array") }
        }
    }

    mutating func inlineTable(depth: Int) throws(TOMLError) -> TOMLTable {
        index += 1
        var table = TOMLTable()
        skipSpaces()
        if take("}") { return table }
        while true {
            skipSpaces()
            let name = try key()
            skipSpaces()
            if peek == UInt8(ascii: ".") { throw fail("dotted keys are not supported here") }
            guard take("=") else { throw fail("expected = after the key \(name)") }
            skipSpaces()
            guard table.define(name, try value(depth: depth + 1)) else {
                throw fail("the key \(name) is defined twice")
            }
            skipSpaces()
            if take("}") { return table }
            guard take(",") else { throw fail("expected , or } in an inline table") }
        }
    }

    /// A boolean or a number: the bytes up to a delimiter, checked whole.
    mutating func scalar() throws(TOMLError) -> TOMLValue {
        let start = index
        while let byte = peek, !Self.isDelimiter(byte) { index += 1 }
        let text = String(decoding: bytes[start..<index], as: UTF8.self)
        switch text {
        case "true": return .boolean(true)
        case "false": return .boolean(false)
        case "inf", "+inf": return .float(.infinity)
        case "-inf": return .float(-.infinity)
        case "nan", "+nan", "-nan": return .float(.nan)
        default: break
        }
        if let number = TOMLNumber.integer(text) { return .integer(number) }
        if let number = TOMLNumber.float(text) { return .float(number) }
        if text.isEmpty { throw fail("expected a value") }
        if text.utf8.contains(UInt8(ascii: ":")) || text.utf8.dropFirst().contains(UInt8(ascii: "-")) {
            throw fail("dates and times are not supported here")
        }
        throw fail("not a TOML value: \(text.prefix(40))")
    }

    mutating func basicString() throws(TOMLError) -> String {
        index += 1
        var scalars = String.UnicodeScalarView()
        while true {
            guard let byte = peek, byte != UInt8(ascii: "\n") else { throw fail("a string is not closed on its line") }
            index += 1
            switch byte {
            case UInt8(ascii: "\""): return String(scalars)
            case UInt8(ascii: "\\"): scalars.append(try escape())
            default:
                guard !Self.isControl(byte) else { throw fail("a control character in a string") }
                scalars.append(contentsOf: try utf8Scalar(byte))
            }
        }
    }

    mutating func literalString() throws(TOMLError) -> String {
        index += 1
        let start = index
        while true {
            guard let byte = peek, byte != UInt8(ascii: "\n") else { throw fail("a string is not closed on its line") }
            if byte == UInt8(ascii: "'") { break }
            guard !Self.isControl(byte) else { throw fail("a control character in a string") }
            index += 1
        }
        defer { index += 1 }
        return String(decoding: bytes[start..<index], as: UTF8.self)
    }

    /// `"""..."""` or `'''...'''`: a newline right after the opening quotes is dropped; in the
    /// basic form a backslash at a line's end joins it to the next non-blank character.
    mutating func multiLineString() throws(TOMLError) -> String {
        let quote = bytes[index]
        let basic = quote == UInt8(ascii: "\"")
        let opened = line
        index += 3
        if take("\r") {
            guard take("\n") else { throw fail("a carriage return must be followed by a newline") }
            line += 1
        } else if take("\n") {
            line += 1
        }
        var scalars = String.UnicodeScalarView()
        while true {
            guard let byte = peek else {
                throw TOMLError(line: opened, reason: "the multi-line string opened here is not closed")
            }
            if byte == quote, peek(1) == quote, peek(2) == quote {
                // Up to two more quotes right before the closing three belong to the string.
                var extra = 0
                while extra < 2, peek(3 + extra) == quote { extra += 1 }
                scalars.append(
                    contentsOf: String(repeating: Character(Unicode.Scalar(quote)), count: extra).unicodeScalars)
                index += 3 + extra
                return String(scalars)
            }
            index += 1
            switch byte {
            case UInt8(ascii: "\n"):
                line += 1
                scalars.append("\n")
            case UInt8(ascii: "\r"):
                guard take("\n") else { throw fail("a carriage return must be followed by a newline") }
                line += 1
                scalars.append(contentsOf: "\r\n".unicodeScalars)
            case UInt8(ascii: "\\") where basic:
                if try joinsLines() { continue }
                scalars.append(try escape())
            default:
                guard !Self.isControl(byte) else { throw fail("a control character in a string") }
                scalars.append(contentsOf: try utf8Scalar(byte))
            }
        }
    }

    /// After a backslash: when only spaces are left on the line, skips them, the newlines and
    /// the blanks that follow, and says so.
    mutating func joinsLines() throws(TOMLError) -> Bool {
        var probe = index
        while probe < bytes.count, bytes[probe] == UInt8(ascii: " ") || bytes[probe] == UInt8(ascii: "\t") {
            probe += 1
        }
        guard probe < bytes.count, bytes[probe] == UInt8(ascii: "\n") || bytes[probe] == UInt8(ascii: "\r") else {
            return false
        }
        index = probe
        while let byte = peek {
            switch byte {
            case UInt8(ascii: " "), UInt8(ascii: "\t"): index += 1
            case UInt8(ascii: "\n"):
                index += 1
                line += 1
            case UInt8(ascii: "\r"):
                index += 1
                guard take("\n") else { throw fail("a carriage return must be followed by a newline") }
                line += 1
            default: return true
            }
        }
        return true
    }

    /// The character an escape (after its backslash) stands for.
    mutating func escape() throws(TOMLError) -> Unicode.Scalar {
        guard let byte = peek else { throw fail("a string is not closed") }
        index += 1
        switch byte {
        case UInt8(ascii: "b"): return "\u{08}"
        case UInt8(ascii: "t"): return "\t"
        case UInt8(ascii: "n"): return "\n"
        case UInt8(ascii: "f"): return "\u{0C}"
        case UInt8(ascii: "r"): return "\r"
        case UInt8(ascii: "\""): return "\""
        case UInt8(ascii: "\\"): return "\\"
        case UInt8(ascii: "u"), UInt8(ascii: "U"):
            let digits = byte == UInt8(ascii: "u") ? 4 : 8
            guard index + digits <= bytes.count,
                let value = UInt32(String(decoding: bytes[index..<index + digits], as: UTF8.self), radix: 16),
                bytes[index..<index + digits].allSatisfy({ Self.isHexDigit($0) }),
                let scalar = Unicode.Scalar(value)
            else { throw fail("an escape \\u or \\U names no Unicode character") }
            index += digits
            return scalar
        default: throw fail("an unknown escape in a string")
        }
    }

    /// The whole character whose UTF-8 encoding starts with `first` (already consumed).
    mutating func utf8Scalar(_ first: UInt8) throws(TOMLError) -> String.UnicodeScalarView {
        let length = first < 0x80 ? 1 : first >= 0xF0 ? 4 : first >= 0xE0 ? 3 : 2
        guard index + length - 1 <= bytes.count else { throw fail("a string is not closed") }
        defer { index += length - 1 }
        return String(decoding: bytes[index - 1..<index + length - 1], as: UTF8.self).unicodeScalars
    }

    // MARK: Bytes

    static func isBareKey(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
            || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
            || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || byte == UInt8(ascii: "-")
            || byte == UInt8(ascii: "_")
    }

    static func isHexDigit(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
            || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f"))
            || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "F"))
    }

    /// Control characters other than tab, which TOML allows in no string or comment.
    static func isControl(_ byte: UInt8) -> Bool { (byte < 0x20 && byte != UInt8(ascii: "\t")) || byte == 0x7F }

    /// Where a number or boolean ends.
    static func isDelimiter(_ byte: UInt8) -> Bool {
        [" ", "\t", "\n", "\r", "#", ",", "]", "}"].contains(Unicode.Scalar(byte))
    }
}

extension TOMLTable {
    /// Runs `body` on the table at `path` below this one, creating the tables missing on the
    /// way; refuses a path through a value that is not a table, or into an inline table.
    fileprivate mutating func open(
        _ path: [String], line: Int, _ body: (inout TOMLTable) throws(TOMLError) -> Void = { _ in }
    ) throws(TOMLError) {
        guard let first = path.first else { return try body(&self) }
        let opened = try withTable(first) { (table: inout TOMLTable) throws(TOMLError) in
            try table.open(Array(path.dropFirst()), line: line, body)
        }
        guard opened else { throw TOMLError(line: line, reason: "\(first) is not a table") }
    }
}

/// TOML's number syntax, checked before a conversion (underscores only between digits, no
/// leading zeros, exponents and fractions with digits on both sides).
private enum TOMLNumber {
    static func integer(_ text: String) -> Int64? {
        let bytes = Array(text.utf8)
        for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] where text.hasPrefix(prefix) {
            let digits = bytes.dropFirst(2)
            guard digitsWithUnderscores(digits, radix: radix) else { return nil }
            return Int64(String(decoding: digits.filter { $0 != UInt8(ascii: "_") }, as: UTF8.self), radix: radix)
        }
        let unsigned =
            bytes.first == UInt8(ascii: "+") || bytes.first == UInt8(ascii: "-") ? bytes.dropFirst() : bytes[...]
        guard digitsWithUnderscores(unsigned, radix: 10), unsigned.first != UInt8(ascii: "0") || unsigned.count == 1
        else { return nil }
        return Int64(String(decoding: bytes.filter { $0 != UInt8(ascii: "_") }, as: UTF8.self))
    }

    static func float(_ text: String) -> Double? {
        var bytes = Array(text.utf8)[...]
        if bytes.first == UInt8(ascii: "+") || bytes.first == UInt8(ascii: "-") { bytes = bytes.dropFirst() }
        let exponentAt = bytes.firstIndex { $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E") }
        let mantissa = bytes[..<(exponentAt ?? bytes.endIndex)]
        let dot = mantissa.firstIndex(of: UInt8(ascii: "."))
        let whole = mantissa[..<(dot ?? mantissa.endIndex)]
        guard digitsWithUnderscores(whole, radix: 10), whole.first != UInt8(ascii: "0") || whole.count == 1 else {
            return nil
        }
        if let dot { guard digitsWithUnderscores(mantissa[(dot + 1)...], radix: 10) else { return nil } }
        if let exponentAt {
            var exponent = bytes[(exponentAt + 1)...]
            if exponent.first == UInt8(ascii: "+") || exponent.first == UInt8(ascii: "-") {
                exponent = exponent.dropFirst()
            }
            guard digitsWithUnderscores(exponent, radix: 10) else { return nil }
        }
        guard dot != nil || exponentAt != nil else { return nil }
        return Double(String(decoding: text.utf8.filter { $0 != UInt8(ascii: "_") }, as: UTF8.self))
    }

    /// One or more digits of `radix`, with single underscores between digits.
    private static func digitsWithUnderscores(_ bytes: ArraySlice<UInt8>, radix: Int) -> Bool {
        guard let first = bytes.first, let last = bytes.last, first != UInt8(ascii: "_"), last != UInt8(ascii: "_")
        else { return false }
        var previousUnderscore = false
        for byte in bytes {
            if byte == UInt8(ascii: "_") {
                if previousUnderscore { return false }
                previousUnderscore = true
                continue
            }
            previousUnderscore = false
            guard let value = Int(String(Unicode.Scalar(byte)), radix: 36), value < radix else { return false }
        }
        return true
    }
}
