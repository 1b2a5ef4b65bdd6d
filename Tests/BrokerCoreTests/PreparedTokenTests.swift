@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing

/// The hand-built success line of `token` must be the same JSON a full encode would give, and
/// the client's fast reader must read it as the full decoder does.
@Suite struct PreparedTokenTests {
    /// A decoded success line carrying a token.
    private struct Envelope: Decodable {
        var id: RequestID
        var ok: Bool
        var result: TokenResult
    }

    /// 2026-11-23T08:30:00Z: whole seconds, as the wire carries them.
    static let expiresAt = Date(timeIntervalSince1970: 1_795_422_600)

    static let full = TokenResult(
        account: "api@example", accessToken: "at-\"quoted\"\\slash\n\u{1}é🙂", tokenType: "Bearer",
        expiresAt: expiresAt, expiresIn: 0, idToken: "eyJ.id.token", scope: "read write\tadmin")
    static let minimal = TokenResult(
        account: "github", accessToken: "gho_abc", tokenType: "bearer", expiresAt: expiresAt, expiresIn: 0)

    static let ids: [RequestID?] = [
        .string("req-1"), .string(""), .string("with \"quotes\" and \\ and \n"), .string("日本🙂"),
        .integer(0), .integer(7), .integer(-3), .integer(Int64.max), .integer(Int64.min),
        .number(7.5), .number(-0.001), .number(1e300), .null, nil,
    ]

    @Test(arguments: ids)
    func lineIsOneValidJSONObjectEchoingTheID(id: RequestID?) throws {
        let now = Self.expiresAt.addingTimeInterval(-1800.7)
        let bytes = PreparedToken(Self.full).line(id: id, now: now)
        #expect(bytes.last == 0x0A)
        #expect(bytes.filter { $0 == 0x0A }.count == 1, "exactly one newline: the terminator")

        let envelope = try Wire.makeDecoder().decode(Envelope.self, from: Data(bytes))
        #expect(envelope.id == (id ?? .null))
        #expect(envelope.ok)
        var expected = Self.full
        expected.expiresIn = 1800
        #expect(envelope.result == expected)
    }

    @Test(arguments: ids)
    func lineEqualsTheFullyEncodedSuccessLine(id: RequestID?) throws {
        let now = Self.expiresAt.addingTimeInterval(-59.5)
        for token in [Self.full, Self.minimal] {
            let prepared = PreparedToken(token)
            var result = token
            result.expiresIn = prepared.expiresIn(at: now)
            let reference = try Wire.successLine(id: id, result: result, encoder: Wire.makeEncoder())
            let fast = Data(prepared.line(id: id, now: now))
            let lhs = try #require(try JSONSerialization.jsonObject(with: fast) as? NSDictionary)
            let rhs = try #require(try JSONSerialization.jsonObject(with: reference) as? NSDictionary)
            #expect(lhs == rhs)
        }
    }

    @Test func optionalFieldsAreOmittedWhenAbsent() throws {
        let bytes = PreparedToken(Self.minimal).line(id: .integer(1), now: Self.expiresAt.addingTimeInterval(-10))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
        let result = try #require(object["result"] as? [String: Any])
        #expect(Set(result.keys) == ["account", "access_token", "token_type", "expires_at", "expires_in"])
        #expect(result["expires_at"] as? String == "2026-11-23T08:30:00Z")
        #expect((result["expires_in"] as? NSNumber)?.intValue == 10)
        #expect(object["ok"] as? Bool == true)
    }

    @Test func expiresInCountsDownAndRoundsDown() {
        let prepared = PreparedToken(Self.minimal)
        #expect(prepared.expiresIn(at: Self.expiresAt.addingTimeInterval(-90)) == 90)
        #expect(prepared.expiresIn(at: Self.expiresAt.addingTimeInterval(-89.99)) == 89)
        #expect(prepared.expiresIn(at: Self.expiresAt) == 0)
    }

    @Test func aNonFiniteNumberIDStillGivesValidJSON() throws {
        let bytes = PreparedToken(Self.minimal).line(id: .number(.infinity), now: Self.expiresAt)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
        #expect(object["id"] is NSNull)
    }

    /// The full path of `BlockingBrokerClient`: the head, then the result.
    static func fullRead(_ text: String) throws -> (id: RequestID?, token: String) {
        let decoder = Wire.makeDecoder()
        let head = try decoder.decode(ResponseHead.self, from: Data(text.utf8))
        guard head.ok == true else { throw BrokerError(.internal, "not a success") }
        return (head.id, try decoder.decode(ResultBody<TokenResult>.self, from: Data(text.utf8)).result.accessToken)
    }

    @Test(arguments: [
        TokenResult(
            account: "api", accessToken: "at-\"quoted\"\\slash\n\u{1}é🙂", tokenType: "Bearer", expiresAt: expiresAt,
            expiresIn: 0, idToken: "eyJ.id", scope: "read write"),
        TokenResult(account: "gh", accessToken: "gho_abc", tokenType: "bearer", expiresAt: expiresAt, expiresIn: 0),
    ])
    func theClientsFlatReaderReadsItAsTheDecoderDoes(result: TokenResult) throws {
        for id in [Int64(1), 0, -7, Int64.max] {
            let line = PreparedToken(result).line(id: .integer(id), now: Self.expiresAt.addingTimeInterval(-90))
            let text = String(decoding: line.dropLast(), as: UTF8.self)
            let flat = try #require(Array(text.utf8).withUnsafeBytes { FlatTokenAnswer.parse($0) })
            let full = try Self.fullRead(text)
            #expect(flat.id == id && flat.accessToken == result.accessToken)
            #expect(full.id == .integer(id) && full.token == flat.accessToken)
        }
    }
}

extension PreparedToken {
    /// The prepared answer of the token `result` describes, with proofs of `dpopKey` if given.
    init(_ result: TokenResult, dpopKey: DPoPKey? = nil) {
        let settings = OAuth2Settings(
            tokenEndpoint: URL(string: "https://idp.example/token"), clientID: "cli", clientAuth: .none, scope: nil)
        let dpop = dpopKey.map {
            (key: $0, idpEndpoints: DPoPIdPEndpoints(settings: settings, discovery: DiscoveryCache()))
        }
        try! self.init(
            account: result.account,
            token: AccessToken(
                value: try! SecretBytes(result.accessToken), type: result.tokenType, expiresAt: result.expiresAt,
                obtainedAt: result.expiresAt, idToken: result.idToken.map { try! SecretBytes($0) }, scope: result.scope),
            dpop: dpop)
    }
}
