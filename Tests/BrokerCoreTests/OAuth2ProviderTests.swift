@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// How token endpoint answers are classified (protocol/PROTOCOL.md section 11): good, transient, or denial.
@Suite struct OAuth2ProviderTests {
    static let now = Date(timeIntervalSince1970: 1_795_422_600)

    private func interpret(_ status: Int, _ body: String, retryAfter: TimeInterval? = nil) -> Result<
        Grant, RefreshFailure
    > {
        OAuth2Provider.interpret(
            IdPReply(status: status, body: Data(body.utf8), retryAfter: retryAfter), now: Self.now, defaultLifetime: 600
        )
    }

    @Test func aGoodAnswerYieldsEveryField() throws {
        let body = """
            {"access_token":"at-1","token_type":"DPoP","expires_in":120,"refresh_token":"rt-2","id_token":"id.jwt",
             "scope":"read write","refresh_expires_in":"86400","extra":{"ignored":true}}
            """
        let grant = try interpret(200, body).get()
        #expect(grant.token.value.text == "at-1")
        #expect(grant.token.type == "DPoP")
        #expect(grant.token.expiresAt == Self.now.addingTimeInterval(120))
        #expect(grant.token.obtainedAt == Self.now)
        #expect(grant.token.idToken?.text == "id.jwt")
        #expect(grant.token.scope == "read write")
        #expect(grant.refreshToken == "rt-2")
        #expect(grant.refreshExpiresAt == Self.now.addingTimeInterval(86_400))
    }

    @Test func aMinimalAnswerUsesDefaults() throws {
        let grant = try interpret(200, #"{"access_token":"at-1"}"#).get()
        #expect(grant.token.type == "Bearer")
        #expect(grant.token.expiresAt == Self.now.addingTimeInterval(600))
        #expect(grant.refreshToken == nil, "no rotation: keep the old refresh token")
        #expect(grant.refreshExpiresAt == nil)
        #expect(
            try interpret(200, #"{"access_token":"at-1","expires_in":"90"}"#).get().token.expiresAt
                == Self.now.addingTimeInterval(90))
    }

    @Test(arguments: [
        "<html>this is not json", "", "[]", "null", #"{"token_type":"Bearer"}"#, #"{"access_token":""}"#,
        #"{"access_token":42}"#, #"{"access_token":null}"#,
    ])
    func aSuccessStatusWithoutAUsableTokenIsTransient(body: String) throws {
        let failure = try #require(interpret(200, body).failure)
        #expect(failure.kind == .transient)
    }

    /// Only a refusal of the grant or of the client stops the account; the message quotes the
    /// IdP's error and description after the status.
    @Test(arguments: [
        (
            400, #"{"error":"invalid_grant","error_description":"unknown refresh token"}"#,
            "HTTP 400 (invalid_grant: unknown refresh token)"
        ),
        (401, #"{"error":"invalid_client"}"#, "HTTP 401 (invalid_client)"),
        (400, #"{"error":"unauthorized_client","error_description":""}"#, "HTTP 400 (unauthorized_client)"),
        (401, #"{"error":"invalid_grant","error_description":"revoked"}"#, "HTTP 401 (invalid_grant: revoked)"),
    ])
    func refusalsOfTheGrantOrClientAreDenials(status: Int, body: String, shown: String) throws {
        let failure = try #require(interpret(status, body).failure)
        #expect(failure.kind == .denial)
        #expect(failure.retryAfter == nil)
        #expect(failure.message == "the token endpoint refused the refresh: \(shown)")
    }

    /// Every other 400 or 401 is transient: the IdP's own trouble (`server_error`,
    /// `temporarily_unavailable`), a request or setting it finds wrong, a code the broker does
    /// not know, or an answer with no readable error at all (a proxy's page).
    @Test(arguments: [
        (400, #"{"error":"server_error","error_description":"try again"}"#, "HTTP 400 (server_error: try again)"),
        (400, #"{"error":"temporarily_unavailable"}"#, "HTTP 400 (temporarily_unavailable)"),
        (401, #"{"error":"server_error"}"#, "HTTP 401 (server_error)"),
        (400, #"{"error":"invalid_request","error_description":"missing x"}"#, "HTTP 400 (invalid_request: missing x)"),
        (400, #"{"error":"unsupported_grant_type"}"#, "HTTP 400 (unsupported_grant_type)"),
        (400, #"{"error":"invalid_scope"}"#, "HTTP 400 (invalid_scope)"),
        (400, #"{"error":"made_up_code"}"#, "HTTP 400 (made_up_code)"),
        (400, "not json at all", "HTTP 400"),
        (400, #"{"error":42}"#, "HTTP 400"),
        (401, "", "HTTP 401"),
        (403, #"{"error":"invalid_grant"}"#, "HTTP 403 (invalid_grant)"),
    ])
    func everyOtherRefusalIsTransient(status: Int, body: String, shown: String) throws {
        let failure = try #require(interpret(status, body, retryAfter: 4).failure)
        #expect(failure.kind == .transient)
        #expect(failure.retryAfter == 4)
        #expect(failure.message == "the token endpoint answered \(shown)")
    }

    /// A client error is recognised by the code quoted first, never by a description naming one.
    @Test func aClientErrorIsKnownByItsCodeNotItsDescription() throws {
        let client = try #require(interpret(401, #"{"error":"invalid_client","error_description":"bad"}"#).failure)
        #expect(OAuth2Provider.rejectsClient(client.message))
        let grant = try #require(
            interpret(400, #"{"error":"invalid_grant","error_description":"not (invalid_client)"}"#).failure)
        #expect(grant.kind == .denial)
        #expect(!OAuth2Provider.rejectsClient(grant.message))
    }

    /// A 200 that is not a token answer quotes the error it carries.
    @Test func aSuccessStatusWithAnErrorQuotesIt() throws {
        let failure = try #require(interpret(200, #"{"error":"bad_refresh_token","error_description":"gone"}"#).failure)
        #expect(failure.kind == .transient)
        #expect(failure.message.hasSuffix("without a usable access_token (bad_refresh_token: gone)"))
    }

    /// `use_dpop_nonce` left after the retry with the IdP's newest nonce (RFC 9449 section 8),
    /// or a proof refused (`invalid_dpop_proof`, a clock the IdP finds skewed), says nothing of
    /// the credential: transient, never `needs_login`.
    @Test(arguments: [400, 401], ["use_dpop_nonce", "invalid_dpop_proof"])
    func aRefusedDPoPProofIsTransient(status: Int, code: String) throws {
        let failure = try #require(interpret(status, #"{"error":"\#(code)"}"#).failure)
        #expect(failure.kind == .transient)
    }

    /// The code is quoted as the IdP sent it; the broker cleans it before anyone sees it.
    @Test func theDenialMessageNamesTheOAuthErrorCodeOnlyInPrintableForm() throws {
        let failure = try #require(interpret(400, #"{"error":"invalid_grant\u0000\n\u001b[31m"}"#).failure)
        let shown = try #require(AccountRecord.sample("api").outsideText().clean(failure.message))
        #expect(shown.contains("invalid_grant"))
        #expect(shown.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value < 0x7F })
    }

    @Test(arguments: [
        (500, 30.0 as TimeInterval?), (502, nil), (503, 120), (504, nil), (429, 5), (429, nil), (302, nil),
    ])
    func serverErrorsAndRateLimitsAreTransientAndCarryRetryAfter(status: Int, retryAfter: TimeInterval?) throws {
        let failure = try #require(
            interpret(status, #"{"error":"temporarily_unavailable"}"#, retryAfter: retryAfter).failure)
        #expect(failure.kind == .transient)
        #expect(failure.retryAfter == retryAfter)
        #expect(failure.message.contains("\(status)"))
    }
}

/// `Retry-After` comes as delay seconds or as an HTTP date (RFC 9110 section 10.2.3).
@Suite struct RetryAfterTests {
    @Test(arguments: [("120", 120.0), ("0", 0), (" 7 ", 7)])
    func delaySeconds(text: String, seconds: TimeInterval) {
        #expect(IdPClient.retryAfter(text) == seconds)
    }

    @Test func httpDateInTheFuture() throws {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        let text = formatter.string(from: Date().addingTimeInterval(3600))
        let seconds = try #require(IdPClient.retryAfter(text), "\(text)")
        #expect(seconds > 3500 && seconds <= 3600)
    }

    @Test func httpDateInThePastMeansNow() {
        #expect(IdPClient.retryAfter("Wed, 21 Oct 2015 07:28:00 GMT") == 0)
    }

    @Test(arguments: ["", "soon", "12 seconds", "2026-11-23T08:30:00Z", "-5"])
    func unparseableValuesAreIgnored(text: String) {
        #expect(IdPClient.retryAfter(text) == nil)
    }
}

/// HTTPS for every IdP URL except loopback addresses (docs/security.md, "What brokerd does not trust").
@Suite struct EndpointPolicyTests {
    @Test(arguments: [
        "https://idp.example/oauth/token", "HTTPS://IDP.EXAMPLE/token", "https://10.0.0.1:8443/token",
        "http://127.0.0.1:8080/token", "http://127.0.0.53/token", "http://localhost/token", "http://[::1]:9000/token",
    ])
    func allowed(url: String) throws {
        #expect(EndpointPolicy.isAllowed(try #require(URL(string: url))))
    }

    @Test(arguments: [
        "http://idp.example/token", "http://10.0.0.1/token", "http://192.168.1.1/token", "ftp://idp.example/token",
        "file:///etc/passwd", "ws://127.0.0.1/token", "idp.example/token", "https:/token",
    ])
    func refused(url: String) throws {
        #expect(!EndpointPolicy.isAllowed(try #require(URL(string: url))))
    }

    /// A DNS name that merely starts with "127." is not a loopback address.
    @Test(arguments: ["http://127.attacker.example/token", "http://127.0.0.1.nip.io/token"])
    func hostNamesThatLookLikeLoopbackAreRefused(url: String) throws {
        let parsed = try #require(URL(string: url))
        #expect(!EndpointPolicy.isAllowed(parsed))
    }
}
