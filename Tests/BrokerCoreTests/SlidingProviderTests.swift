@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// How a sliding endpoint's envelopes are classified (seed 004, protocol/PROTOCOL.md section 11).
@Suite struct SlidingProviderTests {
    static let now = Date(timeIntervalSince1970: 1_795_422_600)
    static let utc = IANATimeZone(identifier: "UTC")!

    private func interpret(
        _ status: Int, _ body: String, zone: IANATimeZone = utc, retryAfter: TimeInterval? = nil
    ) -> Result<Grant, RefreshFailure> {
        SlidingProvider.interpret(
            IdPReply(status: status, body: Data(body.utf8), retryAfter: retryAfter), now: Self.now, timeZone: zone,
            defaultLifetime: 600)
    }

    private static func date(_ text: String) -> Date { ISO8601DateFormatter().date(from: text)! }

    @Test func theSeedEnvelopeYieldsBothTokensAndBothExpiries() throws {
        let body = """
            {"status": true, "message": "TokenRefreshedSuccessfully", "data": {
              "accessToken": "eyJhbGciOiJIUzI1NiIs", "refreshToken": "555dce3b-198f-426d-b0be-92d234747cc3",
              "accessTokenExpiresAt": "2026-01-06T14:18:40", "refreshTokenExpiresAt": "2026-01-13T13:48:40"}}
            """
        let grant = try interpret(200, body).get()
        #expect(grant.token.value.text == "eyJhbGciOiJIUzI1NiIs")
        #expect(grant.token.type == "Bearer")
        #expect(grant.token.obtainedAt == Self.now)
        #expect(grant.token.expiresAt == Self.date("2026-01-06T14:18:40Z"))
        #expect(grant.refreshToken == "555dce3b-198f-426d-b0be-92d234747cc3")
        #expect(grant.refreshExpiresAt == Self.date("2026-01-13T13:48:40Z"))
    }

    @Test func zoneLessTimestampsAreReadInTheConfiguredZone() throws {
        let body = """
            {"status":true,"message":"ok","data":{"accessToken":"a","refreshToken":"r",
             "accessTokenExpiresAt":"2026-01-06T14:18:40","refreshTokenExpiresAt":"2026-07-13T13:48:40+02:00"}}
            """
        let grant = try interpret(200, body, zone: IANATimeZone(identifier: "America/New_York")!).get()
        #expect(grant.token.expiresAt == Self.date("2026-01-06T19:18:40Z"), "EST is UTC-5 in January")
        #expect(grant.refreshExpiresAt == Self.date("2026-07-13T11:48:40Z"), "an explicit offset wins")
    }

    @Test(arguments: [
        #"{"status":false,"message":"RefreshTokenMismatch","data":null}"#,
        #"{"status":false,"message":"RefreshTokenExpired"}"#,
        #"{"status":false}"#,
    ])
    func statusFalseIsADenialEvenWithHTTP200(body: String) throws {
        let failure = try #require(interpret(200, body).failure)
        #expect(failure.kind == .denial)
        if body.contains("Mismatch") { #expect(failure.message.contains("RefreshTokenMismatch")) }
    }

    @Test(arguments: [
        (401, #"{"status":false,"message":"Unauthorized"}"#), (401, ""),
        (400, #"{"status":false,"message":"RefreshTokenMismatch"}"#),
        (403, #"{"status":false,"message":"RefreshTokenMismatch"}"#),
    ])
    func unauthorizedAndRefusalsAreDenials(status: Int, body: String) throws {
        let failure = try #require(interpret(status, body).failure)
        #expect(failure.kind == .denial)
    }

    @Test(arguments: [
        (500, #"{"status":false,"message":"InternalError"}"#), (503, ""), (429, #"{"status":false}"#),
        (404, "<html>not found"), (302, ""),
    ])
    func serverTroubleIsTransient(status: Int, body: String) throws {
        let failure = try #require(interpret(status, body, retryAfter: 9).failure)
        #expect(failure.kind == .transient)
    }

    /// A 400 without `status: false` (a proxy's page), or an IdP saying the failure is its own
    /// (`server_error`, `temporarily_unavailable`) even with 401, keeps the credential.
    @Test(arguments: [
        (400, "<html>bad request"), (400, ""), (400, #"{"error":"server_error"}"#),
        (401, #"{"error":"temporarily_unavailable","error_description":"maintenance"}"#),
    ])
    func unreadableRefusalsAndServerErrorsAreTransient(status: Int, body: String) throws {
        let failure = try #require(interpret(status, body, retryAfter: 9).failure)
        #expect(failure.kind == .transient)
        if body.contains("error") { #expect(failure.retryAfter == 9) }
        if body.contains("maintenance") { #expect(failure.message.hasSuffix("(temporarily_unavailable: maintenance)")) }
    }

    @Test func transientFailuresCarryRetryAfter() throws {
        #expect(try #require(interpret(503, "", retryAfter: 42).failure).retryAfter == 42)
    }

    @Test(arguments: [
        "<html>this is not json", "", "[]", #"{"status":"true"}"#, #"{"status":true}"#,
        #"{"status":true,"data":{"refreshToken":"r"}}"#,
        #"{"status":true,"data":{"accessToken":"","refreshToken":"r"}}"#,
        #"{"status":true,"data":{"accessToken":"a","accessTokenExpiresAt":"tomorrow"}}"#,
        #"{"status":true,"data":{"accessToken":"a","accessTokenExpiresAt":1767709120}}"#,
        #"{"status":true,"data":{"accessToken":"a","refreshTokenExpiresAt":"2026-13-01T00:00:00"}}"#,
    ])
    func malformedSuccessesAreTransient(body: String) throws {
        let failure = try #require(interpret(200, body).failure)
        #expect(failure.kind == .transient)
    }

    @Test func missingExpiriesFallBackToTheDefaultLifetimeAndNoRefreshExpiry() throws {
        let grant = try interpret(200, #"{"status":true,"data":{"accessToken":"a","refreshToken":"r"}}"#).get()
        #expect(grant.token.expiresAt == Self.now.addingTimeInterval(600))
        #expect(grant.refreshExpiresAt == nil)
    }

    /// A refresh token that cannot travel in a header is refused before any request is made, so
    /// no HTTP error can echo it.
    @Test func aRefreshTokenWithControlCharactersIsRefusedWithoutEchoingIt() async throws {
        let http = IdPClient.inProcess(settings: BrokerSettings())
        let provider = SlidingProvider(
            settings: SlidingSettings(endpoint: URL(string: "http://127.0.0.1:1/refresh")!, timeZone: "UTC"),
            http: http, defaultLifetime: 600)
        var record = AccountRecord.sample("sliding")
        record.secrets.refreshToken = "secret-part\r\nX-Injected: 1"
        let failure = try #require(await provider.refresh(record, now: Self.now).failure)
        await http.shutdown()
        #expect(failure.kind == .denial)
        #expect(!failure.message.contains("secret-part"))
    }
}

/// Timestamps as sliding endpoints write them: ISO 8601 with or without fraction and zone.
@Suite struct TimestampTests {
    static let utc = IANATimeZone(identifier: "UTC")!
    static let tokyo = IANATimeZone(identifier: "Asia/Tokyo")!

    @Test(arguments: [
        ("2026-01-06T14:18:40", "2026-01-06T14:18:40Z"),
        ("2026-01-06T14:18:40Z", "2026-01-06T14:18:40Z"),
        ("2026-01-06t14:18:40z", "2026-01-06T14:18:40Z"),
        ("2026-01-06 14:18:40", "2026-01-06T14:18:40Z"),
        ("2026-01-06T14:18:40+05:30", "2026-01-06T08:48:40Z"),
        ("2026-01-06T14:18:40-0800", "2026-01-06T22:18:40Z"),
        ("2026-01-06T14:18:40+01", "2026-01-06T13:18:40Z"),
        ("2026-01-06T14:18:40.000Z", "2026-01-06T14:18:40Z"),
        (" 2026-02-28T23:59:59 ", "2026-02-28T23:59:59Z"),
    ])
    func wholeSeconds(text: String, expected: String) throws {
        let parsed = try #require(Timestamp.parse(text, defaultZone: Self.utc))
        #expect(parsed == ISO8601DateFormatter().date(from: expected)!)
    }

    @Test func fractionsOfAnyLengthAreKept() throws {
        let base = ISO8601DateFormatter().date(from: "2026-01-06T14:18:40Z")!
        let dotNet = try #require(Timestamp.parse("2026-01-06T14:18:40.1234567", defaultZone: Self.utc))
        #expect(abs(dotNet.timeIntervalSince(base) - 0.1234567) < 1e-6)
        let millis = try #require(Timestamp.parse("2026-01-06T14:18:40.5+00:00", defaultZone: Self.tokyo))
        #expect(abs(millis.timeIntervalSince(base) - 0.5) < 1e-6)
    }

    @Test func zoneLessMeansTheDefaultZone() throws {
        let parsed = try #require(Timestamp.parse("2026-01-06T14:18:40", defaultZone: Self.tokyo))
        #expect(parsed == ISO8601DateFormatter().date(from: "2026-01-06T05:18:40Z")!)
    }

    @Test(arguments: [
        "", "tomorrow", "2026-01-06", "2026-01-06T14:18", "2026-1-6T14:18:40", "2026-01-06T14:18:40+",
        "2026-01-06T14:18:40+25:00", "2026-01-06T14:18:40 UTC", "2026-02-30T00:00:00", "2026-13-01T00:00:00",
        "2026-01-06T24:00:00", "2026-01-06T14:60:00", "2026-01-06T14:18:40.", "2026-01-06T14:18:40Zjunk",
        "１２３４-01-06T14:18:40",
    ])
    func malformedTextIsRefused(text: String) {
        #expect(Timestamp.parse(text, defaultZone: Self.utc) == nil)
    }
}
