import BrokerProtocol
import FoundationEssentials
import Testing

/// The client's fast reader of token answers agrees with the full decoder wherever it answers,
/// and declines every other line; the hand-written request line is the one the encoder writes.
@Suite struct FlatTokenAnswerTests {
    static func parse(_ text: String) -> FlatTokenAnswer? {
        Array(text.utf8).withUnsafeBytes { FlatTokenAnswer.parse($0) }
    }

    static let fields = #""account":"a","access_token":"t","token_type":"Bearer","expires_at":"2026-11-23T08:30:00Z""#

    @Test(arguments: [
        // Not a success, or not for an integer id.
        #"{"id":1,"ok":false,"error":{"code":"not_found","message":"no"}}"#,
        #"{"id":"1","ok":true,"result":{\#(fields),"expires_in":5}}"#,
        #"{"id":1.0,"ok":true,"result":{\#(fields),"expires_in":5}}"#,
        #"{"id":null,"ok":true,"result":{\#(fields),"expires_in":5}}"#,
        #"{"ok":true,"result":{\#(fields),"expires_in":5}}"#,
        #"{"id":1,"result":{\#(fields),"expires_in":5}}"#,
        // A result the decoder reads otherwise, or refuses.
        #"{"id":1,"ok":true,"result":{\#(fields)}}"#,
        #"{"id":1,"ok":true,"result":{\#(fields),"expires_in":"5"}}"#,
        #"{"id":1,"ok":true,"result":{\#(fields),"expires_in":5.5}}"#,
        #"{"id":1,"ok":true,"result":{\#(fields),"expires_in":5,"access_token":"other"}}"#,
        #"{"id":1,"ok":true,"result":{\#(fields),"expires_in":5,"extra":1}}"#,
        #"{"id":1,"ok":true,"result":{"account":"a","access_token":"t","expires_at":"x","expires_in":5}}"#,
        #"{"id":1,"ok":true,"result":{\#(fields),"expires_in":5,"scope":null}}"#,
        // Keys twice, other keys, or text beyond the object.
        #"{"id":1,"id":2,"ok":true,"result":{\#(fields),"expires_in":5}}"#,
        #"{"id":1,"ok":true,"ok":true,"result":{\#(fields),"expires_in":5}}"#,
        #"{"id":1,"ok":true,"event":"added","result":{\#(fields),"expires_in":5}}"#,
        #"{"id":1,"ok":true,"result":{\#(fields),"expires_in":5}} x"#,
        #"{"id":1,"ok":true,"result":{\#(fields),"expires_in":5},}"#,
        "",
    ])
    func declinesWhatItCannotVouchFor(line: String) {
        #expect(Self.parse(line) == nil)
    }

    @Test(arguments: [
        Request(id: nil, op: "token", account: "api"),
        Request(id: nil, op: "token", account: "a\"b\\c\n日本", minTTL: 60),
        Request(id: nil, op: "token", account: "api", minTTL: 0.25),
        Request(id: nil, op: "token", account: "api", minTTL: 1e300),
        Request(id: nil, op: "reload"),
    ])
    func writesTheLineTheEncoderWrites(request: Request) throws {
        for id in [RequestID.integer(1), .string("x\"y")] {
            let line = try #require(FlatRequest.line(of: request, id: id))
            #expect(line.last == 0x0A)
            var expected = request
            expected.id = id
            let decoded = try Wire.makeDecoder().decode(Request.self, from: Data(line.dropLast()))
            #expect(FlatRequest(decoded) == FlatRequest(expected))
            #expect(line.dropLast().withUnsafeBytes { JSONLine.problem(in: $0) } == nil)
        }
    }

    @Test func leavesOtherRequestsToTheEncoder() {
        #expect(
            FlatRequest.line(of: Request(id: nil, op: "token", account: "a", minTTL: .infinity), id: .integer(1)) == nil
        )
        #expect(
            FlatRequest.line(of: Request(id: nil, op: "reject", account: "a", accessToken: "t"), id: .integer(1)) == nil
        )
        #expect(FlatRequest.line(of: Request(id: nil, op: "logout", account: "a", force: true), id: .integer(1)) == nil)
        // An id-token request written by hand would lose `id_token` and ask for the access token.
        #expect(
            FlatRequest.line(of: Request(id: nil, op: "token", account: "a", idToken: true), id: .integer(1)) == nil)
        for login in [
            Request(id: nil, op: "login", account: "a", flow: "device"),
            Request(id: nil, op: "login", account: "a", secretsFile: "/s"),
            Request(id: nil, op: "login", account: "a", redirectPort: 8400),
            Request(id: nil, op: "login", account: "a", timeout: 60),
        ] {
            #expect(FlatRequest.line(of: login, id: .integer(1)) == nil)
        }
    }
}
