@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import NIOHTTP1
import Testing
import TestSupport

/// A broker on a real vault whose IdP answers with hostile numbers and texts: nothing traps,
/// the vault stays loadable, and nothing secret is reflected (docs/security.md, "What brokerd does not trust").
@Suite struct HostileAnswerTests {
    static let refreshToken = "rt-hostile-6a0f1c2e-5d9b-4b1e-9a51-0c1d2e3f4a5b"
    static let clientSecret = "cs-hostile-secret-77f1"

    /// Runs `body` with the in-process harness's broker on `settings`, its clock, its log and the
    /// harness itself.
    private func withBroker(
        settings: BrokerSettings = BrokerSettings(),
        _ body: (Broker, TestClock, LogRecorder, BrokerHarness) async throws -> Void
    ) async throws {
        try await BrokerHarness.run(settings: settings) { h in try await body(h.broker, h.clock, h.logs, h) }
    }

    private func oauth2(_ endpoint: String) -> ProviderSpec {
        ProviderSpec(
            kind: "oauth2",
            [
                "token_endpoint": .string(endpoint), "client_id": "cli", "client_secret": .string(Self.clientSecret),
                "client_auth": "client_secret_post",
            ])
    }

    @Test(arguments: ["1e17", "1e300", "\"1e300\"", "1.7976931348623157e308"])
    func aHugeLifetimeIsCutToTenYearsAndSurvivesARestart(expiresIn: String) async throws {
        let idp = try await ScriptedIdP(
            TestHTTPResponse(
                status: .ok,
                body: #"{"access_token":"at-huge","expires_in":\#(expiresIn),"refresh_expires_in":1e300}"#),
            serving: .inProcess)
        try await withBroker { broker, clock, _, h in
            _ = try await broker.add(
                account: "api", provider: oauth2(idp.url), tokens: TokenSet(refreshToken: Self.refreshToken))
            let token = try await broker.token(account: "api", minTTL: 30)
            #expect(token.result.accessToken == "at-huge")
            #expect(token.result.expiresAt == clock.now().addingTimeInterval(Bounds.maximumLifetime))
            #expect(token.line(id: .integer(1), now: clock.now()).count > 0)
            let status = try #require(try await broker.status(account: "api").first)
            #expect(status.state == "valid")
            let restarted = try h.restart()
            #expect(try await restarted.token(account: "api", minTTL: 30).result.accessToken == "at-huge")
            #expect(try await restarted.status(account: nil).count == 1)
        }
        await idp.shutdown()
    }

    @Test(arguments: ["-5", "\"soon\"", "\"nan\"", "\"-inf\"", "[1]", "-1e300"])
    func aMalformedLifetimeIsATransientFailure(expiresIn: String) async throws {
        let idp = try await ScriptedIdP(
            TestHTTPResponse(status: .ok, body: #"{"access_token":"at-bad","expires_in":\#(expiresIn)}"#),
            serving: .inProcess)
        try await withBroker { broker, _, _, _ in
            _ = try await broker.add(
                account: "api", provider: oauth2(idp.url), tokens: TokenSet(refreshToken: Self.refreshToken))
            let error = await #expect(throws: BrokerError.self) { try await broker.token(account: "api", minTTL: 0) }
            #expect(error?.code == .unavailable)
            let status = try #require(try await broker.status(account: "api").first)
            #expect(status.state != "needs_login", "a malformed answer keeps the credential")
            #expect(status.lastError?.message.contains("malformed expires_in") == true)
        }
        await idp.shutdown()
    }

    @Test func aHugeRetryAfterIsCutToTheBackoffCap() async throws {
        let idp = try await ScriptedIdP(
            TestHTTPResponse(
                status: .serviceUnavailable, body: "{}",
                headers: [("Retry-After", "1" + String(repeating: "0", count: 300))]), serving: .inProcess)
        var settings = BrokerSettings()
        settings.backoffCap = 120
        try await withBroker(settings: settings) { broker, _, _, _ in
            _ = try await broker.add(
                account: "api", provider: oauth2(idp.url), tokens: TokenSet(refreshToken: Self.refreshToken))
            let error = await #expect(throws: BrokerError.self) { try await broker.token(account: "api", minTTL: 30) }
            #expect(error?.retryAfterMs ?? .max <= 120_000)
        }
        await idp.shutdown()
    }

    @Test func aHugeRetryAfterOnARevocationIsCutToTheBackoffCap() async throws {
        let idp = try await ScriptedIdP(
            TestHTTPResponse(
                status: .serviceUnavailable, body: "{}", headers: [("Retry-After", String(repeating: "9", count: 40))]),
            serving: .inProcess)
        try await withBroker { broker, _, _, _ in
            var provider = oauth2(idp.url)
            provider["revocation_endpoint"] = .string(idp.baseURL + "/revoke")
            _ = try await broker.add(
                account: "api", provider: provider,
                tokens: TokenSet(accessToken: "at", expiresIn: 3600, refreshToken: Self.refreshToken))
            let error = await #expect(throws: BrokerError.self) {
                try await broker.logout(account: "api", force: false)
            }
            #expect(error?.code == .unavailable)
            #expect(error?.retryAfterMs ?? .max <= Int(BrokerSettings().backoffCap * 1000))
        }
        await idp.shutdown()
    }

    @Test func pushedNumbersOutOfRangeAreRefusedAndHugeOnesCut() async throws {
        try await withBroker { broker, clock, _, _ in
            for bad in [-Double.infinity, .infinity, .nan] {
                let error = await #expect(throws: BrokerError.self) {
                    try await broker.add(
                        account: "s", provider: ProviderSpec(kind: "static"),
                        tokens: TokenSet(accessToken: "at", expiresIn: bad))
                }
                #expect(error?.code == .badRequest)
            }
            _ = try await broker.add(
                account: "old", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: "at", expiresIn: -1e300))
            #expect(
                try await broker.status(account: "old").first?.expiresAt
                    == clock.now().addingTimeInterval(-Bounds.maximumLifetime))
            var tokens = TokenSet(accessToken: "at", expiresIn: 1e300)
            tokens.refreshExpiresIn = 1e300
            _ = try await broker.add(account: "s", provider: ProviderSpec(kind: "static"), tokens: tokens)
            let token = try await broker.token(account: "s", minTTL: 1e8)
            #expect(token.result.expiresAt == clock.now().addingTimeInterval(Bounds.maximumLifetime))
        }
    }

    /// A vault written before numbers were checked (dates near the limits of `Double`) still
    /// loads, shows and serves.
    @Test func aVaultHoldingHugeDatesStillLoads() async throws {
        var record = AccountRecord.sample("api")
        record.token?.expiresAt = Date(timeIntervalSinceReferenceDate: 1e300)
        record.token?.obtainedAt = Date(timeIntervalSinceReferenceDate: -1e300)
        record.secrets.refreshExpiresAt = Date(timeIntervalSinceReferenceDate: 1.7e308)
        record.lastRefreshAt = Date(timeIntervalSinceReferenceDate: -1.7e308)
        try await BrokerHarness.run(vault: VaultContents(accounts: [record])) { h in
            let (broker, clock) = (h.broker, h.clock)
            let status = try #require(try await broker.status(account: "api").first)
            #expect(status.expiresAt == Bounds.representableDates.upperBound)
            let token = try await broker.token(account: "api", minTTL: 30)
            #expect(
                token.expiresIn(at: clock.now())
                    == Int(Bounds.representableDates.upperBound.timeIntervalSince(clock.now())))
            #expect(Wire.rfc3339(token.result.expiresAt) == "9999-12-31T23:59:59Z")
            #expect(await broker.summary() == "1 account: 1 valid")
        }
    }

    // MARK: Origins (class 4)

    @Test func aRotatedRefreshURLOnAnotherOriginIsNotFollowed() async throws {
        let elsewhere = try await ScriptedIdP(
            TestHTTPResponse(status: .ok, body: #"{"access_token":"stolen"}"#), serving: .inProcess)
        let idp = try await ScriptedIdP(
            TestHTTPResponse(
                status: .ok,
                body: #"{"access_token":"at-1","expires_in":1,"refresh_url":"\#(elsewhere.baseURL)/next-secret"}"#),
            serving: .inProcess)
        try await withBroker { broker, clock, logs, _ in
            _ = try await broker.add(
                account: "pph", provider: ProviderSpec(kind: "refresh_url"),
                tokens: TokenSet(refreshURL: idp.baseURL + "/refresh/one-time-secret"))
            let error = await #expect(throws: BrokerError.self) { try await broker.token(account: "pph", minTTL: 30) }
            #expect(error?.code == .needsLogin)
            let status = try #require(try await broker.status(account: "pph").first)
            #expect(status.state == "needs_login")
            #expect(status.lastError?.message.contains("another origin") == true)
            clock.advance(by: 3600)
            _ = await broker.runDueRefreshes()
            await broker.drain()
            #expect(elsewhere.callCount == 0, "nothing was sent to the other origin")
            #expect(!logs.all.joined().contains("next-secret"))
            #expect(!logs.all.joined().contains("one-time-secret"))
        }
        await idp.shutdown()
        await elsewhere.shutdown()
    }

    @Test func aConfigThatMovesACredentialElsewhereIsRefusedUntilLogout() async throws {
        let idp = try await ScriptedIdP(
            TestHTTPResponse(status: .ok, body: #"{"access_token":"at-1"}"#), serving: .inProcess)
        let other = try await ScriptedIdP(
            TestHTTPResponse(status: .ok, body: #"{"access_token":"at-2"}"#), serving: .inProcess)
        try await withBroker { broker, _, _, _ in
            var declared = ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.url), "client_id": "cli", "client_auth": "none"])
            try await broker.configure(BrokerConfiguration(accounts: ["api": declared]))
            _ = try await broker.setTokens(
                account: "api", tokens: TokenSet(accessToken: "at-0", expiresIn: 3600, refreshToken: Self.refreshToken))

            // Same origin, other path: allowed.
            declared["token_endpoint"] = .string(idp.baseURL + "/oauth/token")
            try await broker.configure(BrokerConfiguration(accounts: ["api": declared]))

            var moves: [ProviderSpec] = []
            var elsewhere = declared
            elsewhere["token_endpoint"] = .string(other.url)
            moves.append(elsewhere)
            var otherClient = declared
            otherClient["client_id"] = "someone-else"
            moves.append(otherClient)
            var revocation = declared
            revocation["revocation_endpoint"] = .string(other.baseURL + "/revoke")
            moves.append(revocation)
            var sliding = ProviderSpec(kind: "sliding")
            sliding["endpoint"] = .string(idp.url)
            moves.append(sliding)
            for move in moves {
                let failure = await #expect(throws: BrokerFailure.self) {
                    try await broker.configure(BrokerConfiguration(accounts: ["api": move]))
                }
                #expect(failure?.description.contains("accounts.api") == true)
                #expect(failure?.description.contains("logout") == true)
            }
            _ = try await broker.refreshNow(account: "api")
            #expect(idp.callCount == 1 && other.callCount == 0)

            _ = try await broker.logout(account: "api", force: true)
            try await broker.configure(BrokerConfiguration(accounts: ["api": elsewhere]))
            #expect(other.callCount == 0)
        }
        await idp.shutdown()
        await other.shutdown()
    }

    @Test func anIssuerChangeOnTheSameOriginIsAMoveToo() async throws {
        let idp = try await ScriptedIdP(
            TestHTTPResponse(status: .ok, body: #"{"access_token":"at-1"}"#), serving: .inProcess)
        try await withBroker { broker, _, _, _ in
            let pinned = ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.url), "client_id": "cli", "client_auth": "none"])
            try await broker.configure(BrokerConfiguration(accounts: ["api": pinned]))
            _ = try await broker.setTokens(account: "api", tokens: TokenSet(refreshToken: Self.refreshToken))
            var discovered = ProviderSpec(kind: "oauth2", ["client_id": "cli", "client_auth": "none"])
            discovered["issuer"] = .string(idp.baseURL + "/attacker/raw/main")
            let failure = await #expect(throws: BrokerFailure.self) {
                try await broker.configure(BrokerConfiguration(accounts: ["api": discovered]))
            }
            #expect(failure?.description.contains("issuer") == true)
        }
        await idp.shutdown()
    }

    @Test func aLoggedOutAccountMovesWithoutItsClientSecret() async throws {
        let idp = try await ScriptedIdP(
            TestHTTPResponse(status: .ok, body: #"{"access_token":"at-1"}"#), serving: .inProcess)
        let other = try await ScriptedIdP(
            TestHTTPResponse(status: .ok, body: #"{"access_token":"at-2"}"#), serving: .inProcess)
        try await withBroker { broker, _, _, h in
            _ = try await broker.add(
                account: "api", provider: oauth2(idp.url),
                tokens: TokenSet(accessToken: "at-0", expiresIn: 3600, refreshToken: Self.refreshToken))
            _ = try await broker.logout(account: "api", force: true)
            var moved = oauth2(other.url)
            moved["client_secret"] = nil
            moved["client_auth"] = "none"
            try await broker.configure(BrokerConfiguration(accounts: ["api": moved]))
            let stored = try #require(try h.vaultCopy()?.accounts.first)
            #expect(stored.secrets.clientSecret == nil, "the secret issued for the old IdP is gone")
        }
        await idp.shutdown()
        await other.shutdown()
    }

    @Test(arguments: [
        #"{"access_token":"at\r\nX-Injected: 1"}"#, #"{"access_token":"at","token_type":"Bearer\r\nX: 1"}"#,
        #"{"access_token":"a t"}"#, #"{"access_token":"at","scope":"read\nwrite"}"#,
        #"{"access_token":"at","id_token":"x\u0000y"}"#,
    ])
    func aTokenThatCannotGoIntoAHeaderIsMalformed(body: String) async throws {
        let idp = try await ScriptedIdP(TestHTTPResponse(status: .ok, body: body), serving: .inProcess)
        try await withBroker { broker, _, _, _ in
            _ = try await broker.add(
                account: "api", provider: oauth2(idp.url), tokens: TokenSet(refreshToken: Self.refreshToken))
            let error = await #expect(throws: BrokerError.self) { try await broker.token(account: "api", minTTL: 0) }
            #expect(error?.code == .unavailable)
            let pushed = await #expect(throws: BrokerError.self) {
                try await broker.setTokens(account: "api", tokens: TokenSet(accessToken: "a\r\nb"))
            }
            #expect(pushed?.code == .badRequest)
        }
        await idp.shutdown()
    }

    // MARK: Reflected text (class 7)

    @Test func anIdPMessageQuotingTheRefreshTokenIsRedactedEverywhere() async throws {
        let idp = try await ScriptedIdP(
            TestHTTPResponse(
                status: .ok,
                body: #"{"status":false,"message":"RefreshTokenMismatch \#(Self.refreshToken)\u001b[2J\r\nX"}"#),
            serving: .inProcess)
        try await withBroker { broker, _, logs, _ in
            let events = broker.events.subscribe(accounts: nil)
            _ = try await broker.add(
                account: "volt",
                provider: {
                    var spec = ProviderSpec(kind: "sliding")
                    spec["endpoint"] = .string(idp.url)
                    return spec
                }(), tokens: TokenSet(refreshToken: Self.refreshToken))
            let error = await #expect(throws: BrokerError.self) { try await broker.token(account: "volt", minTTL: 30) }
            #expect(error?.code == .needsLogin)
            let status = try #require(try await broker.status(account: "volt").first)
            let message = try #require(status.lastError?.message)
            #expect(message.contains("RefreshTokenMismatch [redacted]"))
            #expect(!message.unicodeScalars.contains { $0.value < 0x20 })
            var seen: [AccountEvent] = []
            for try await event in events {
                seen.append(event)
                if event.kind == .needsLogin { break }
            }
            let texts = logs.all + seen.compactMap(\.message) + [message, error?.message ?? ""]
            #expect(!texts.joined().contains(Self.refreshToken))
            #expect(!texts.joined().contains("6a0f1c2e"), "not even a part cut by truncation")
        }
        await idp.shutdown()
    }

    @Test func aTracingExecHelpersStderrIsRedactedInTheLog() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let script = directory.file("helper.sh")
        try """
        #!/bin/sh
        echo "+ printf {\\"access_token\\":\\"exec-issued-secret-91\\"}" >&2
        printf '\\001\\033[31m' >&2
        printf '{"access_token":"exec-issued-secret-91","expires_in":60}'
        """.write(toFile: script, atomically: true, encoding: .utf8)
        chmod(script, 0o755)
        try await withBroker { broker, _, logs, _ in
            var spec = ProviderSpec(kind: "exec")
            spec["command"] = [.string(script)]
            _ = try await broker.add(account: "ex", provider: spec, tokens: nil)
            #expect(try await broker.token(account: "ex", minTTL: 30).result.accessToken == "exec-issued-secret-91")
            let line = try #require(logs.all.first { $0.contains("wrote to stderr") })
            #expect(line.contains("[redacted]"))
            #expect(!logs.all.joined().contains("exec-issued-secret-91"))
            #expect(!line.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x1B })
        }
    }
}
