import BrokerProtocol
import FoundationEssentials
import Testing

/// A request line is one RFC 8259 object with no key twice, whatever Foundation's decoder
/// would let through.
@Suite struct JSONLineTests {
    static func problem(_ bytes: [UInt8]) -> JSONLine.Problem? {
        bytes.withUnsafeBytes { JSONLine.problem(in: $0) }
    }

    static func problem(_ text: String) -> JSONLine.Problem? { problem(Array(text.utf8)) }

    @Test(arguments: [
        "{}",
        #"{"id":7,"op":"token","account":"api","min_ttl":60}"#,
        " \t{ \"op\" :\n\"add\", \"provider\": {\"kind\":\"exec\",\"command\":[\"a\", \"b\"]}, \"force\": false }\r\n",
        #"{"a":[],"b":{},"c":[[{"d":null}],true,-0.5e-3,"\u00e9\ud83d\ude00\/"]}"#,
        #"{"a":{"k":1},"b":{"k":2},"c":[{"k":1},{"k":2}]}"#,
    ])
    func acceptsJSONObjects(line: String) {
        #expect(Self.problem(line) == nil)
    }

    /// Lines Foundation's decoder accepts although they are not JSON, and lines that are not
    /// objects.
    @Test(arguments: [
        #"{"op":"status",}"#,
        "\u{FEFF}{\"op\":\"status\"}",
        "\u{0C}{\"op\":\"status\"}",
        "\u{A0}{\"op\":\"status\"}",
        #"{"op":"\ud800"}"#,
        #"{"op":"\udc00\ud83d"}"#,
        "{\"op\":\"a\u{01}\"}",
        #"{"op":"\x"}"#,
        #"{"a":[1,]}"#,
        #"{"a":1}{"b":2}"#,
        #"{"a":01}"#,
        #"{"a":.5}"#,
        #"{"a":tru}"#,
        #"{"a":-true}"#,
        #"{"a":-null}"#,
        #"{a:1}"#,
        #"[{"a":1}]"#,
        #""op""#,
        "",
    ])
    func refusesWhatIsNotOneJSONObject(line: String) {
        #expect(Self.problem(line) == .malformed)
    }

    @Test(arguments: [[0xFF], [0xC3], [0xED, 0xA0, 0x80], [0xC0, 0xAF]] as [[UInt8]])
    func refusesInvalidUTF8(bytes: [UInt8]) {
        #expect(Self.problem(Array(#"{"op":""#.utf8) + bytes + Array(#""}"#.utf8)) == .malformed)
    }

    @Test(arguments: [
        (#"{"op":"status","op":"token"}"#, ["op"]),
        (#"{"op":"status","\u006fp":"token"}"#, ["op"]),
        ("{\"K\":1,\"\u{212A}\":2}", ["K"]),
        (#"{"id":1,"provider":{"kind":"a","kind":"b"}}"#, ["provider", "kind"]),
        (#"{"a":[{"b":{"c":1,"c":2}}]}"#, ["a", "b", "c"]),
    ])
    func refusesRepeatedKeys(line: String, path: [String]) {
        #expect(Self.problem(line) == .duplicateKey(path: path))
    }

    @Test func refusesDeepNesting() {
        let depth = JSONLine.maximumDepth
        let fits = #"{"a":"# + String(repeating: "[", count: depth - 1) + String(repeating: "]", count: depth - 1) + "}"
        let tooDeep = #"{"a":"# + String(repeating: "[", count: depth) + String(repeating: "]", count: depth) + "}"
        #expect(Self.problem(fits) == nil)
        #expect(Self.problem(tooDeep) == .tooDeep)
        // A line of nothing but brackets, as long as a line may be, costs no recursion.
        #expect(Self.problem(#"{"a":"# + String(repeating: "[", count: maximumLineLength)) == .tooDeep)
    }
}
