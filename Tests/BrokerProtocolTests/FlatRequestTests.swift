import BrokerProtocol
import Foundation
import Testing

/// The hot-path scanner agrees with the full decoder wherever it answers, and declines the rest.
@Suite struct FlatRequestTests {
    static func parse(_ text: String) -> FlatRequest? {
        Array(text.utf8).withUnsafeBytes { FlatRequest.parse($0) }
    }

    @Test(arguments: [
        #"{"id":7,"op":"token","account":"api","min_ttl":60}"#,
        #"  { "op" : "token" , "account" : "api" , "id" : "abc" }  "#,
        #"{"id":-3,"op":"token","account":"a.b@c","min_ttl":0.5,"client":"x"}"#,
        #"{"id":1.25,"op":"hello","extra":12}"#,
        #"{"op":"token","account":"ünïcode"}"#,
        "{}",
    ])
    func agreesWithTheFullDecoder(line: String) throws {
        let flat = try #require(Self.parse(line))
        let full = try Wire.makeDecoder().decode(Request.self, from: Data(line.utf8))
        #expect(flat.id == full.id)
        #expect(flat.op == full.op)
        #expect(flat.account == full.account)
        #expect(flat.minTTL == full.minTTL)
    }

    @Test(arguments: [
        #"{"id":1,"op":"token","account":"a\"b"}"#,
        #"{"id":1,"op":"add","provider":{"kind":"static"}}"#,
        #"{"id":true,"op":"token"}"#,
        #"{"id":1,"op":"token","min_ttl":"60"}"#,
        #"{"id":1,"op":7}"#,
        #"{"id":1,"op":"token",}"#,
        #"{"id":01,"op":"token"}"#,
        #"{"id":1,"op":"token"} trailing"#,
        #"[1,2]"#,
        #"{"id":1,"op":"token""#,
        "not json",
        "",
    ])
    func declinesWhatItDoesNotFullyUnderstand(line: String) {
        #expect(Self.parse(line) == nil)
    }
}
