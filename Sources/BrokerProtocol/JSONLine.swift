/// The check a request line passes before the full decoder reads it.
///
/// Foundation's decoder is lenient where a careful reader is not: it takes a trailing comma,
/// skips a byte-order mark, replaces invalid UTF-8 with U+FFFD, and keeps the first of two
/// equal keys. A line must
/// be one JSON object exactly as RFC 8259 writes it, in UTF-8, with no key twice in any object
/// (keys compared as the decoder compares them, after escapes and as Swift strings), so that
/// the fast path (`FlatRequest`) and the decoder cannot read one line two ways.
public enum JSONLine {
    /// Why a line is refused.
    public enum Problem: Error, Equatable, Sendable {
        /// Not one JSON object in UTF-8.
        case malformed
        /// Objects nested deeper than `maximumDepth`.
        case tooDeep
        /// A key that appears twice in one object, with the keys of the objects around it.
        case duplicateKey(path: [String])
    }

    /// How deep objects and arrays may nest; the protocol itself needs three levels.
    public static let maximumDepth = 32

    /// What is wrong with `bytes`, or `nil` when it is one well-formed JSON object.
    public static func problem(in bytes: UnsafeRawBufferPointer) -> Problem? {
        var lexer = JSONLexer(bytes)
        guard lexer.peek() == JSONLexer.Byte.openBrace else { return .malformed }
        var open: [Container] = []
        // Each turn reads one value, then closes every container that ends after it.
        while true {
            switch lexer.peek() {
            case JSONLexer.Byte.openBrace?, JSONLexer.Byte.openBracket?:
                guard open.count < maximumDepth else { return .tooDeep }
                let container = Container(
                    isObject: lexer.peek() == JSONLexer.Byte.openBrace, path: open.last?.childPath ?? [])
                _ = lexer.skip(container.opening)
                if !lexer.skip(container.closing) {
                    open.append(container)
                    if container.isObject, let problem = readKey(&lexer, into: &open[open.count - 1]) { return problem }
                    continue
                }
            case JSONLexer.Byte.quote?:
                guard lexer.string() != nil else { return .malformed }
            default:
                guard lexer.number() != nil || lexer.literal() else { return .malformed }
            }
            // One value is complete: close containers until one goes on with a comma.
            while let container = open.last {
                if lexer.skip(JSONLexer.Byte.comma) {
                    if container.isObject, let problem = readKey(&lexer, into: &open[open.count - 1]) { return problem }
                    break
                }
                guard lexer.skip(container.closing) else { return .malformed }
                open.removeLast()
            }
            if open.isEmpty { return lexer.atEnd() ? nil : .malformed }
        }
    }

    /// Reads a key and its colon into `object`.
    private static func readKey(_ lexer: inout JSONLexer, into object: inout Container) -> Problem? {
        guard let key = lexer.string(), lexer.skip(JSONLexer.Byte.colon) else { return .malformed }
        guard object.keys.insert(key).inserted else { return .duplicateKey(path: object.path + [key]) }
        object.lastKey = key
        return nil
    }

    /// An object or array not yet closed.
    private struct Container {
        let isObject: Bool
        /// The keys that lead to this container (arrays add none).
        let path: [String]
        /// An object's keys so far.
        var keys: Set<String> = []
        /// The key whose value is being read.
        var lastKey: String?

        var opening: UInt8 { isObject ? JSONLexer.Byte.openBrace : JSONLexer.Byte.openBracket }
        var closing: UInt8 { isObject ? JSONLexer.Byte.closeBrace : JSONLexer.Byte.closeBracket }

        /// The path of a container that is a value inside this one.
        var childPath: [String] { lastKey.map { path + [$0] } ?? path }
    }
}
