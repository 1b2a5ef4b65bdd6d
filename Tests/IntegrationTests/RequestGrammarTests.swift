import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// A line gets one answer, whichever of the broker's two readers takes it (ARCHITECTURE.md, "Twin paths"):
/// lines the fast path once answered with a token although the full decoder reads them
/// otherwise (or not at all) are refused, and an id comes back as the decoder reads it.
@Suite struct RequestGrammarTests {
    @Test func aLineMeansOneThingOnEitherPath() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let owner = try broker.client()
        defer { owner.close() }
        _ = try await owner.add(
            account: "steady", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "steady-token", expiresIn: 3600))

        let raw = try RawConnection(path: broker.socketPath)
        let refused: [(line: String, id: Int?)] = [
            (#"{"id":1,"op":"status","op":"token","account":"steady"}"#, 1),
            (#"{"id":2,"op":"token","account":"other","account":"steady"}"#, 2),
            (#"{"id":3,"id":4,"op":"token","account":"steady"}"#, nil),
            (#"{"id":5,"op":"token","account":"steady","min_ttl":.5}"#, nil),
            (#"{"id":6,"op":"token","account":"steady","min_ttl":1.}"#, nil),
            (#"{"id":7,"op":"token","account":"steady","client":5}"#, 7),
            (#"{"id":8,"op":"token","account":"steady",}"#, nil),
            (#"{"id":9,"op":"token","account":"steady","min_ttl":1e-400}"#, 9),
        ]
        for (line, id) in refused {
            #expect(raw.send(line + "\n"))
            let answer = try #require(raw.readObject(), "no answer to \(line)")
            #expect(answer.errorCode == "bad_request", "\(line)")
            #expect(answer["id"] as? Int == id, "\(line)")
            if id == nil { #expect(answer["id"] is NSNull, "\(line)") }
        }

        // The decoder reads the id 1.0 as the integer 1, so both paths echo `1`.
        #expect(raw.send(#"{"id":1.0,"op":"token","account":"steady"}"# + "\n"))
        // Only the id is kept: the rest of the line holds the access token.
        let echoedID = String(decoding: try #require(raw.readLine()).prefix { $0 != UInt8(ascii: ",") }, as: UTF8.self)
        #expect(echoedID == #"{"id":1"#)

        // CR is JSON whitespace: a client that ends its lines with CRLF is served.
        #expect(raw.send(#"{"id":10,"op":"token","account":"steady"}"# + "\r\n"))
        #expect(raw.readObject()?["ok"] as? Bool == true)
    }
}
