@testable import BrokerProtocol
import Foundation
import Testing

/// Dates travel as RFC 3339 UTC with whole seconds; requests tolerate fields they do not know.
@Suite struct WireTests {
    static let instant = Date(timeIntervalSince1970: 1_795_422_600)  // 2026-11-23T08:30:00Z

    /// The hand-written formatter agrees with FoundationEssentials' format style: on the
    /// edges of days, months, leap years, centuries and its range, on 2,000 dates a hair short of
    /// a second, and on 20,000 random dates
    /// (the style's calendar is Julian before 1582, which the range starts after).
    @Test func formatsAsTheISO8601FormatStyleDoes() {
        let edges: [Double] = [
            0, -1, -0.5, 0.999, 86_399.9, 86_400, 951_782_400, 951_868_800, 4_107_542_400, -2_203_891_200,
            -11_676_096_000, -11_676_096_000.5, -62_135_596_800, 253_402_300_799, 253_402_300_799.9, 253_402_300_800,
            1_795_422_600, 2_147_483_647, 4_102_444_800,
        ]
        var generator = SystemRandomNumberGenerator()
        let random = (0..<20_000).map { _ in Double.random(in: -11_676_096_000..<253_402_300_800, using: &generator) }
        // Dates a hair short of a whole second, as they are stored (since 2001).
        let justShort = (0..<2_000).map { _ in
            Date(
                timeIntervalSinceReferenceDate: Double(
                    Int64.random(in: -1_000_000_000...1_000_000_000, using: &generator)
                )
                .nextDown)
        }
        let mismatches = ((edges + random).map { Date(timeIntervalSince1970: $0) } + justShort).filter {
            Wire.rfc3339($0) != Wire.formattedRFC3339($0)
        }
        let agree = mismatches.isEmpty
        #expect(agree, "\(mismatches.prefix(3).map { ($0.timeIntervalSince1970, Wire.rfc3339($0)) })")
    }

    @Test func formatsUTCWithWholeSeconds() {
        #expect(Wire.rfc3339(Self.instant) == "2026-11-23T08:30:00Z")
        #expect(Wire.rfc3339(Date(timeIntervalSince1970: 0)) == "1970-01-01T00:00:00Z")
        #expect(Wire.rfc3339(Self.instant.addingTimeInterval(0.75)) == "2026-11-23T08:30:00Z")
    }

    @Test(arguments: [0.0, 1, 59, 86_399, 951_782_400, 1_795_422_600, 4_102_444_799])
    func wholeSecondDatesRoundTrip(seconds: Double) throws {
        let date = Date(timeIntervalSince1970: seconds)
        let text = Wire.rfc3339(date)
        #expect(text.wholeMatch(of: /\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z/) != nil, "\(text)")
        #expect(Wire.parseRFC3339(text) == date)
    }

    @Test func parsesFractionalSecondsAndOffsets() throws {
        #expect(Wire.parseRFC3339("2026-11-23T08:30:00Z") == Self.instant)
        let fractional = try #require(Wire.parseRFC3339("2026-11-23T08:30:00.250Z"))
        #expect(abs(fractional.timeIntervalSince(Self.instant) - 0.25) < 0.001)
        #expect(Wire.parseRFC3339("2026-11-23T10:30:00+02:00") == Self.instant)
        #expect(Wire.parseRFC3339("2026-11-23T03:30:00-05:00") == Self.instant)
    }

    @Test(arguments: ["", "tomorrow", "2026-11-23", "2026-13-40T99:00:00Z", "1795422600"])
    func refusesWhatIsNotATimestamp(text: String) {
        #expect(Wire.parseRFC3339(text) == nil)
    }

    @Test func encoderAndDecoderAgreeOnDates() throws {
        let status = AccountStatus(account: "a", provider: "oauth2", state: "valid", expiresAt: Self.instant)
        let data = try Wire.makeEncoder().encode(status)
        #expect(String(decoding: data, as: UTF8.self).contains(#""expires_at":"2026-11-23T08:30:00Z""#))
        #expect(try Wire.makeDecoder().decode(AccountStatus.self, from: data) == status)
    }

    @Test func requestDecodingIgnoresUnknownFields() throws {
        let line = """
            {"id": 7, "op": "token", "account": "github", "min_ttl": 60, "trace": {"span": [1, 2, {"x": null}]},
             "flag": true, "future_field": "v2",
             "provider": {"kind": "oauth2", "token_endpoint": "https://idp.example/token", "client_id": "cli",
                          "pkce": {"method": "S256"}},
             "tokens": {"refresh_token": "rt-1", "expires_at": "2026-11-23T08:30:00Z", "dpop": true}}
            """
        let request = try Wire.makeDecoder().decode(Request.self, from: Data(line.utf8))
        #expect(request.id == .integer(7))
        #expect(request.op == "token")
        #expect(request.account == "github")
        #expect(request.minTTL == 60)
        #expect(request.provider?.kind == "oauth2")
        #expect(request.provider?["token_endpoint"] == "https://idp.example/token")
        #expect(request.provider?["client_id"] == "cli")
        #expect(request.tokens?.refreshToken == "rt-1")
        #expect(request.tokens?.expiresAt == Self.instant)
    }

    @Test func requestWithOnlyAnIDAndOpDecodes() throws {
        let request = try Wire.makeDecoder().decode(Request.self, from: Data(#"{"id":"x","op":"hello","v":[1]}"#.utf8))
        #expect(request.id == .string("x"))
        #expect(request.op == "hello")
        #expect(request.account == nil && request.minTTL == nil && request.tokens == nil)
    }

    @Test func errorLinesCarryCodeMessageAndRetryAfter() throws {
        let data = Wire.errorLine(
            id: .string("q"), error: BrokerError(.unavailable, "IdP down", retryAfterMs: 5000),
            encoder: Wire.makeEncoder())
        #expect(data.last == 0x0A)
        let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        #expect(object["id"] as? String == "q")
        #expect(object["ok"] as? Bool == false)
        let error = try #require(object["error"] as? [String: Any])
        #expect(error["code"] as? String == "unavailable")
        #expect(error["message"] as? String == "IdP down")
        #expect((error["retry_after_ms"] as? NSNumber)?.intValue == 5000)

        let noID = Wire.errorLine(id: nil, error: BrokerError(.badRequest, "not JSON"), encoder: Wire.makeEncoder())
        let head = try Wire.makeDecoder().decode(ResponseHead.self, from: noID)
        #expect(head.id == nil || head.id == .null)
        #expect(head.ok == false)
        #expect(head.error?.brokerError.code == .badRequest)
        #expect(head.error?.retryAfterMs == nil)
        #expect(!String(decoding: noID, as: UTF8.self).contains("retry_after_ms"))
    }
}
