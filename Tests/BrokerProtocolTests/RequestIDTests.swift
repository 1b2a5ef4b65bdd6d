import BrokerProtocol
import Foundation
import Testing

/// The `id` a client puts on a request must come back exactly as it was sent.
@Suite struct RequestIDTests {
    /// Wraps the id in an object so the decoder sees it where a request carries it.
    private struct Holder: Codable, Equatable {
        var id: RequestID
    }

    private func decodeID(_ json: String) throws -> RequestID {
        try JSONDecoder().decode(Holder.self, from: Data(#"{"id":\#(json)}"#.utf8)).id
    }

    @Test(arguments: [
        (#""abc""#, RequestID.string("abc")),
        (#""""#, .string("")),
        (#""7""#, .string("7")),
        (#""é \" \\ ✓""#, .string("é \" \\ ✓")),
        ("7", .integer(7)),
        ("0", .integer(0)),
        ("-42", .integer(-42)),
        ("9223372036854775807", .integer(Int64.max)),
        ("-9223372036854775808", .integer(Int64.min)),
        ("7.5", .number(7.5)),
        ("-0.25", .number(-0.25)),
        ("1e300", .number(1e300)),
        ("null", .null),
    ])
    func decodesStringsNumbersAndNull(json: String, expected: RequestID) throws {
        #expect(try decodeID(json) == expected)
    }

    @Test(arguments: ["true", "false", "{}", #"{"a":1}"#, "[]", "[1]"])
    func refusesBooleansObjectsAndArrays(json: String) {
        #expect(throws: DecodingError.self) { try decodeID(json) }
    }

    @Test(arguments: [
        RequestID.string("abc"), .string(""), .string("line\nbreak \"quoted\" \u{1}"), .string("🙂 日本"),
        .integer(0), .integer(-1), .integer(Int64.max), .integer(Int64.min),
        .number(7.5), .number(-1e-7), .number(1.7976931348623157e308), .null,
    ])
    func encodingRoundTrips(id: RequestID) throws {
        let data = try JSONEncoder().encode(Holder(id: id))
        #expect(try JSONDecoder().decode(Holder.self, from: data) == Holder(id: id))
    }

    @Test func encodesToTheJSONTypeItCameFrom() throws {
        let data = try JSONEncoder().encode([
            RequestID.string("7"), .integer(7), .number(7.5), .null,
        ])
        let array = try #require(try JSONSerialization.jsonObject(with: data) as? [Any])
        #expect(array.count == 4)
        #expect(array[0] as? String == "7")
        #expect((array[1] as? NSNumber)?.int64Value == 7)
        #expect((array[2] as? NSNumber)?.doubleValue == 7.5)
        #expect(array[3] is NSNull)
    }

    @Test func integersBeyondInt64AreEchoedExactly() throws {
        let id = try decodeID("18446744073709551615")
        withKnownIssue("integers beyond Int64 decode as Double and are echoed rounded (1.8446744073709552e+19)") {
            #expect(JSONText.encode(id) == "18446744073709551615")
        }
    }
}
