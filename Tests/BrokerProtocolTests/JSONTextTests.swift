import BrokerProtocol
import Foundation
import Testing

/// `JSONText.quote` builds the hot-path response lines by hand, so every string it quotes
/// must decode back to itself with a real JSON parser.
@Suite struct JSONTextTests {
    /// Parses `quoted` as a JSON string literal.
    private func parse(_ quoted: String) throws -> String {
        let array = try JSONSerialization.jsonObject(with: Data("[\(quoted)]".utf8)) as? [Any]
        return try #require(array?.first as? String)
    }

    static let samples: [String] = [
        "",
        "plain-token_123.abc~",
        "say \"hello\"",
        #"back\slash and \\ double"#,
        "\\\"",
        "line\nfeed, carriage\rreturn, tab\there",
        "slash / is fine",
        "é ü ß 日本語 한국어 עברית",
        "emoji 🙂👩‍👩‍👧 and flags 🇩🇪",
        "combining e\u{301} vs é",
        "separators \u{2028} \u{2029}",
        "del \u{7F} nbsp \u{A0} bom \u{FEFF}",
        String(String.UnicodeScalarView((0..<0x20).map { Unicode.Scalar(UInt8($0)) })),
    ]

    @Test(arguments: samples)
    func quotedTextDecodesBackToTheSameScalars(text: String) throws {
        let quoted = JSONText.quote(text)
        #expect(quoted.hasPrefix("\"") && quoted.hasSuffix("\""))
        let decoded = try parse(quoted)
        #expect(Array(decoded.unicodeScalars) == Array(text.unicodeScalars))
    }

    @Test(arguments: samples)
    func quotedTextHasNoRawControlCharacters(text: String) {
        #expect(JSONText.quote(text).utf8.allSatisfy { $0 >= 0x20 })
    }

    @Test func escapesUseTheShortFormsWhereJSONHasThem() {
        #expect(JSONText.quote("a\"b") == #""a\"b""#)
        #expect(JSONText.quote(#"a\b"#) == #""a\\b""#)
        #expect(JSONText.quote("\n\r\t") == #""\n\r\t""#)
        #expect(JSONText.quote("\u{0}\u{1f}") == #""\u0000\u001f""#)
        #expect(JSONText.quote("é") == "\"é\"")
    }

    @Test func everySingleControlCharacterRoundTrips() throws {
        for value in UInt8(0)..<0x20 {
            let text = "x" + String(Unicode.Scalar(value)) + "y"
            let decoded = try parse(JSONText.quote(text))
            #expect(Array(decoded.unicodeScalars) == Array(text.unicodeScalars), "control character \(value)")
        }
    }

    @Test(arguments: [
        (RequestID.string("a\"b\n"), #""a\"b\n""#),
        (.integer(-12), "-12"),
        (.integer(Int64.max), "9223372036854775807"),
        (.number(2.5), "2.5"),
        (.null, "null"),
    ])
    func encodesRequestIDs(id: RequestID, expected: String) {
        #expect(JSONText.encode(id) == expected)
    }

    @Test(arguments: [Double.infinity, -Double.infinity, Double.nan])
    func nonFiniteNumbersBecomeNullRatherThanInvalidJSON(value: Double) {
        #expect(JSONText.encode(.number(value)) == "null")
    }
}
