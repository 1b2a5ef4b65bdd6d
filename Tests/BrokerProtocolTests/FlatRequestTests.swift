import BrokerProtocol
import FoundationEssentials
import Testing

/// The hot-path scanner agrees with the full path (`JSONLine`, then the decoder) wherever it
/// answers, and declines the rest.
@Suite struct FlatRequestTests {
    static func parse(_ text: String) -> FlatRequest? {
        Array(text.utf8).withUnsafeBytes { FlatRequest.parse($0) }
    }

    @Test(arguments: [
        #"{"id":7,"op":"token","account":"api","min_ttl":60}"#,
        #"  { "op" : "token" , "account" : "api" , "id" : "abc" }  "#,
        "{\"op\":\"token\",\n\"account\":\"api\"\r}\r",
        #"{"id":-3,"op":"token","account":"a.b@c","min_ttl":0.5,"client":"x"}"#,
        #"{"id":125,"op":"hello","extra":1.25}"#,
        #"{"op":"token","account":"ünïcode"}"#,
        #"{"op":"token","account":"a\"b\u00e9\ud83d\ude00","flag":true,"none":null}"#,
        #"{"id":-0,"op":"token","account":"api","min_ttl":-0}"#,
        #"{"id":9223372036854775807,"op":"token","account":"api","min_ttl":1e-300}"#,
        #"{"id":-9223372036854775808,"op":"token","account":"api","min_ttl":0}"#,
        #"{"id":2,"op":"token","account":"api","dpop":{"htm":"GET","htu":"https://api.example/v1?q=1"}}"#,
        #"{"id":3,"op":"token","account":"api","dpop":{"nonce":"n-1","htu":"x","htm":"POST"},"min_ttl":5}"#,
        #"{"id":4,"op":"token","account":"api","dpop":{}}"#,
        "{}",
    ])
    func agreesWithTheFullPath(line: String) throws {
        let flat = try #require(Self.parse(line))
        let full = try #require(FullPath.read(Array(line.utf8)))
        #expect(flat == FlatRequest(full))
    }

    @Test(arguments: [
        #"{"id":1,"op":"add","provider":{"kind":"static"}}"#,
        // The id-token answer is the full path's: the scanner must not answer it with the access token.
        #"{"id":1,"op":"token","account":"api","id_token":true}"#,
        #"{"id":1,"op":"token","account":"api","id_token":false}"#,
        // A `dpop` object the scanner cannot vouch for: another member, another type, a repeat.
        #"{"id":1,"op":"token","account":"api","dpop":{"htm":"GET","htu":"https://a/","x":1}}"#,
        #"{"id":1,"op":"token","account":"api","dpop":{"htm":"GET","htm":"PUT"}}"#,
        #"{"id":1,"op":"token","account":"api","dpop":{"htm":7}}"#,
        #"{"id":1,"op":"token","account":"api","dpop":{"htm":null}}"#,
        #"{"id":1,"op":"token","account":"api","dpop":null}"#,
        #"{"id":1,"op":"token","account":"api","dpop":"GET"}"#,
        #"{"id":1,"op":"login","account":"api","flow":"device","timeout":60}"#,
        #"{"id":true,"op":"token"}"#,
        #"{"id":null,"op":"token"}"#,
        #"{"id":1,"op":"token","min_ttl":"60"}"#,
        #"{"id":1,"op":7}"#,
        #"{"id":1,"op":"token",}"#,
        #"{"id":01,"op":"token"}"#,
        #"{"id":1,"op":"token"} trailing"#,
        #"{"id":1,"op":"token"}{}"#,
        #"[1,2]"#,
        #"{"id":1,"op":"token""#,
        "not json",
        "",
    ])
    func declinesWhatItDoesNotFullyUnderstand(line: String) {
        #expect(Self.parse(line) == nil)
    }

    /// Lines the two readers once read differently: a repeated key was read last-wins here and first-wins
    /// by the decoder.
    @Test(arguments: [
        #"{"op":"status","op":"token","account":"api"}"#,
        #"{"op":"token","account":"other","account":"api"}"#,
        #"{"op":"token","account":"api","min_ttl":99999,"min_ttl":0}"#,
        #"{"id":1,"id":2,"op":"token","account":"api"}"#,
        #"{"op":"token","account":"api","x":1,"x":2}"#,
        "{\"op\":\"token\",\"account\":\"api\",\"K\":1,\"\u{212A}\":2}",
    ])
    func declinesRepeatedKeys(line: String) {
        #expect(Self.parse(line) == nil)
        #expect(FullPath.read(Array(line.utf8)) == nil)
    }

    /// Number forms that are not JSON (RFC 8259), in both number fields the scanner reads.
    @Test(arguments: [
        ".5", "1.", "1e", "1E", "1e+", "-", "--1", "-.5", "01.5", "-01", "00", "1.e5", "+1", "0x10",
        "1.5.5", "1e5e5", "1-2", "- 1", "Infinity", "-Infinity", "NaN", "1_000", "１", "-true", "-null", "1true",
    ])
    func declinesNumbersOutsideTheJSONGrammar(number: String) {
        for line in [
            #"{"op":"token","account":"api","min_ttl":\#(number)}"#, #"{"id":\#(number),"op":"token","account":"api"}"#,
        ] {
            #expect(Self.parse(line) == nil, "\(line)")
            #expect(FullPath.read(Array(line.utf8)) == nil, "\(line)")
        }
    }

    /// Ids and lifetimes the decoder reads differently from their text (`1.0` becomes the integer
    /// 1, `-0.0` the integer 0, `1e-400` is refused): the scanner leaves them to it.
    @Test(arguments: [
        #"{"id":1.0,"op":"token","account":"api"}"#,
        #"{"id":1e2,"op":"token","account":"api"}"#,
        #"{"id":-0.0,"op":"token","account":"api"}"#,
        #"{"id":12e-1,"op":"token","account":"api"}"#,
        #"{"id":1e400,"op":"token","account":"api"}"#,
        #"{"id":9223372036854775808,"op":"token","account":"api"}"#,
        #"{"id":-9223372036854775809,"op":"token","account":"api"}"#,
        #"{"op":"token","account":"api","min_ttl":1e-400}"#,
        #"{"op":"token","account":"api","min_ttl":1e400}"#,
    ])
    func leavesNumbersTheDecoderRewritesToIt(line: String) {
        #expect(Self.parse(line) == nil)
    }

    /// A field of `Request` the scanner does not read, or one of the wrong type, fails the
    /// whole line in the decoder, so the scanner may not answer it.
    @Test(arguments: [
        #"{"op":"token","account":"api","client":5}"#,
        #"{"op":"token","account":"api","access_token":5}"#,
        #"{"op":"token","account":"api","force":1}"#,
        #"{"op":"token","account":"api","accounts":"api"}"#,
        #"{"op":"token","account":"api","versions":1}"#,
        #"{"op":"token","account":"api","tokens":"x"}"#,
        #"{"op":"token","account":"api","provider":1}"#,
        #"{"op":"token","account":"api","scope":"read"}"#,
        #"{"op":"token","account":"api","resource":"https://api.example/"}"#,
    ])
    func declinesFieldsItDoesNotCheck(line: String) {
        #expect(Self.parse(line) == nil)
    }

    /// An `update` request's changes are written by the encoder: the hand-written line has none.
    @Test func leavesUpdatesToTheEncoder() throws {
        var request = Request(id: nil, op: "update", account: "api")
        request.changes = ["scope": .string("read"), "revocation_endpoint": .null]
        #expect(FlatRequest.line(of: request, id: .integer(1)) == nil)
        let decoded = try Wire.makeDecoder().decode(Request.self, from: try Wire.makeEncoder().encode(request))
        #expect(decoded.changes == ["scope": .string("read"), "revocation_endpoint": .null])
    }

    /// A token request narrowed to a scope or bound to a resource is written by the encoder:
    /// the hand-written line has neither field.
    @Test func leavesNarrowedRequestsToTheEncoder() throws {
        var request = Request(id: nil, op: "token", account: "api")
        request.scope = "read"
        #expect(FlatRequest.line(of: request, id: .integer(1)) == nil)
        request.scope = nil
        request.resource = "https://api.example/"
        #expect(FlatRequest.line(of: request, id: .integer(1)) == nil)
        let line = try Wire.makeEncoder().encode(request)
        let decoded = try Wire.makeDecoder().decode(Request.self, from: line)
        #expect(decoded.resource == "https://api.example/" && decoded.scope == nil)
    }

    /// Many generated lines, near the request shape and broken in small ways: wherever the
    /// scanner answers, the full path reads the same request.
    @Test func agreesWithTheFullPathOnGeneratedLines() {
        var generator = LineGenerator(seed: 0x7B1D_5EED)
        var answered = 0
        var declinedValid = 0
        for _ in 0..<20_000 {
            let line = generator.line()
            let full = FullPath.read(line)
            guard let flat = line.withUnsafeBytes({ FlatRequest.parse($0) }) else {
                if full != nil { declinedValid += 1 }
                continue
            }
            answered += 1
            let text = String(decoding: line, as: UTF8.self).debugDescription
            guard let full else {
                Issue.record("the scanner read \(text), the full path refused it")
                continue
            }
            if flat != FlatRequest(full) {
                Issue.record("\(text): the scanner read \(flat), the full path \(FlatRequest(full))")
            }
        }
        // The generator reaches both outcomes often, or the comparison proves little.
        #expect(answered > 2_000)
        #expect(declinedValid > 500)
    }
}

/// The full path of `RequestDispatcher.decide`: the line check, then the decoder.
enum FullPath {
    static func read(_ line: [UInt8]) -> Request? {
        guard line.withUnsafeBytes({ JSONLine.problem(in: $0) }) == nil else { return nil }
        return try? Wire.makeDecoder().decode(Request.self, from: Data(line))
    }
}

/// Request-like lines from pieces that are valid, nearly valid or tricky, with one byte
/// changed now and then; seeded (SplitMix64), so a failure names a reproducible line.
struct LineGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    /// Keys, each with values of the type the decoder wants for it (unknown keys take any).
    private static let fields: [(key: String, values: [String])] = [
        (
            "id",
            [
                #""a""#, #""\u00e9""#, "0", "-0", "7", "-9223372036854775808", "9223372036854775807", "1.0", "1e2",
                "-0.0",
                "9223372036854775808", "9007199254740993.0", "null",
            ]
        ),
        ("op", [#""token""#, #""status""#, #""\u0074oken""#]),
        ("account", [#""api""#, #""""#, #""a\"b""#, "\"e\u{301}\"", #""\ud83d\ude00""#, "\"\u{7F}\"", "null"]),
        (
            "min_ttl",
            [
                "0", "-0", "60", "0.5", "1e2", "-1", "1e-400", "4.9406564584124654e-324", "1.7976931348623157e308",
                "0.0", "0e5",
            ]
        ),
        (
            "dpop",
            [
                #"{"htm":"GET","htu":"https://a.example/p"}"#, #"{"nonce":"n","htm":"PUT"}"#, "{}",
                #"{"htm":"GET","htm":"PUT"}"#, #"{"htm":1}"#, #"{"htu":"u","y":"z"}"#, "null", #""GET""#,
            ]
        ),
        ("client", [#""x""#]), ("access_token", [#""at""#]), ("force", ["true"]), ("accounts", [#"["a"]"#, "[]"]),
        ("x", ["[1,2]", #"{"a":1}"#, "{}", "false", "2.5e-3", "9007199254740993"]), ("", ["1"]), ("K", ["1"]),
        ("\u{212A}", ["2"]), (#"\u006fp"#, [#""token""#]), (#"op\n"#, ["1"]), ("ID", ["1"]),
    ]
    /// Text that is not JSON, or that Foundation's decoder reads leniently.
    private static let oddValues = [
        #""\ud800""#, "\"\u{01}\"", #""\q""#, "1e400", ".5", "1.", "1e", "-", "01", "01.5", "1.e5", "--1", "+1", "1e+",
        "0x10", "Infinity", "NaN", "nul", #"{"a":1,"a":2}"#, "[1,]",
    ]
    private static let spaces = ["", "", "", " ", "\t", "\n", "\r"]
    /// Whitespace to JSON's eye (space, tab, LF, CR) and now and then some that is not.
    private mutating func space() -> String {
        next() % 32 == 0 ? pick(["\u{0B}", "\u{0C}", "\u{A0}"]) : pick(Self.spaces)
    }
    private static let noise = Array(#"{}[],:"\ 0-.e"#.utf8) + [0x00, 0x80, 0xC3, 0xFF]

    mutating func line() -> [UInt8] {
        var text = space() + "{"
        for member in 0..<Int(next() % 6) {
            if member > 0 { text += space() + "," }
            let field = pick(Self.fields)
            text += space() + "\"" + field.key + "\"" + space() + ":" + space()
            switch next() % 8 {
            case 0: text += pick(Self.oddValues)
            case 1: text += pick(pick(Self.fields).values)
            default: text += pick(field.values)
            }
        }
        text += space() + "}" + space()
        var bytes = Array(text.utf8)
        if next() % 5 == 0, !bytes.isEmpty {
            let position = Int(next() % UInt64(bytes.count))
            switch next() % 3 {
            case 0: bytes.remove(at: position)
            case 1: bytes.insert(pick(Self.noise), at: position)
            default: bytes[position] = pick(Self.noise)
            }
        }
        return bytes
    }

    private mutating func pick<Element>(_ elements: [Element]) -> Element {
        elements[Int(next() % UInt64(elements.count))]
    }

    private mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
