@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// JSON of unknown shape, as IdPs and exec helpers print it (`JSONValue.object(decoding:)`).
@Suite struct JSONObjectReadingTests {
    @Test func objectsKeepTheirTypes() throws {
        let text = #"{"s":"x","n":3600,"f":1.5,"t":true,"z":null,"a":[1,"b",null],"o":{"k":"v"}}"#
        let object = try #require(JSONValue.object(decoding: Data(text.utf8)))
        #expect(object["s"]?.text == "x")
        #expect(object["n"]?.number == 3600)
        #expect(object["f"]?.number == 1.5)
        #expect(object["t"]?.bool == true)
        #expect(object["z"] == .null)
        #expect(object["a"] == [.number(1), "b", .null])
        #expect(object["o"]?.object?["k"]?.text == "v")
        #expect(object["missing"] == nil)
    }

    @Test func numbersAreNotBooleansNorTheOtherWayRound() throws {
        let object = try #require(JSONValue.object(decoding: Data(#"{"one":1,"yes":true}"#.utf8)))
        #expect(object["one"]?.bool == nil)
        #expect(object["yes"]?.number == nil)
    }

    @Test(arguments: ["", "[]", "\"text\"", "3", "null", "{", "{\"a\":}", "{'a':1}", "not json"])
    func onlyObjectsAreRead(text: String) {
        #expect(JSONValue.object(decoding: Data(text.utf8)) == nil)
    }
}

/// Form encoding and trimming, written without Foundation's `CharacterSet`.
@Suite struct TextEncodingTests {
    @Test(arguments: [
        ("abcXYZ019-._~", "abcXYZ019-._~"), ("a b", "a%20b"), ("a+b/c=d&e", "a%2Bb%2Fc%3Dd%26e"), ("é", "%C3%A9"),
        ("%", "%25"), ("\n", "%0A"), ("😀", "%F0%9F%98%80"), ("", ""),
    ])
    func formEncodingEscapesAllButUnreservedBytes(text: String, expected: String) {
        #expect(FormEncoding.escape(text) == expected)
    }

    @Test(arguments: [
        ("  x  ", "x"), ("\tx y\t", "x y"), ("\u{00A0}\u{3000}x\u{2009}", "x"), ("\nx\n", "\nx\n"), ("   ", ""),
        ("", ""), ("é", "é"),
    ])
    func trimmingSpacesTakesSpacesAndTabsOnly(text: String, expected: String) {
        #expect(text.trimmingSpaces() == expected)
    }
}
