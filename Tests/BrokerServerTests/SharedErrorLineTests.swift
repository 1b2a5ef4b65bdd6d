import BrokerProtocol
import Foundation
import Testing

@testable import BrokerServer

/// `SharedErrorLine` says what `Wire.errorLine` says, for every kind of id and error.
@Suite struct SharedErrorLineTests {
    static let ids: [RequestID?] = [
        .string("req-1"), .string(""), .string("with \"quotes\" and \\ and \n"), .string("日本🙂"),
        .integer(0), .integer(-3), .integer(Int64.max), .integer(Int64.min), .number(7.5), .number(1e300), .null, nil,
    ]

    static let errors = [
        BrokerError(.unavailable, "the IdP did not answer", retryAfterMs: 1500),
        BrokerError(.needsLogin, "api was signed out by the IdP; sign in again with brokerctl login api"),
        BrokerError(.internal, "quotes \" backslash \\ slash / tab \t newline \n é 🙂"),
    ]

    @Test(arguments: ids)
    func lineSaysWhatTheEncodedErrorLineSays(id: RequestID?) throws {
        for error in Self.errors {
            let line = SharedErrorLine(error).line(id: id)
            #expect(line.last == 0x0A)
            #expect(line.filter { $0 == 0x0A }.count == 1, "exactly one newline: the terminator")
            let reference = Wire.errorLine(id: id, error: error, encoder: Wire.makeEncoder())
            let shared = try #require(try JSONSerialization.jsonObject(with: Data(line)) as? NSDictionary)
            let encoded = try #require(try JSONSerialization.jsonObject(with: reference) as? NSDictionary)
            #expect(shared == encoded)
        }
    }

    @Test func oneErrorServesManyIDs() throws {
        let shared = SharedErrorLine(Self.errors[0])
        let decoder = Wire.makeDecoder()
        for id in 1...3 {
            let head = try decoder.decode(ResponseHead.self, from: Data(shared.line(id: .integer(Int64(id)))))
            #expect(head.id == .integer(Int64(id)) && head.ok == false)
            #expect(head.error?.brokerError == Self.errors[0])
        }
    }
}
