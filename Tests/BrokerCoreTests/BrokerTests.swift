@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

@Suite struct BrokerTests {
    @Test func anOAuth2AccountAddedWithOnlyARefreshTokenServesTheIdPsToken() async throws {
        try await BrokerHarness.run { h in
            let added = try await h.broker.add(
                account: "api", provider: h.provider, tokens: TokenSet(refreshToken: "rt-0"))
            #expect(added.account == "api")
            #expect(added.state == "refreshing", "an account with only a refresh token refreshes at once")

            let token = try await h.broker.token(account: "api", minTTL: 30)
            #expect(token.result.accessToken == h.idp.issuedAccessTokens.first)
            #expect(token.result.account == "api")
            #expect(token.result.tokenType == "Bearer")
            #expect(token.result.expiresAt == h.clock.now().addingTimeInterval(3600))
            #expect(h.idp.callCount == 1)
            let call = try #require(h.idp.calls.first)
            #expect(call.refreshToken == "rt-0")
            #expect(call.clientID == h.idp.clientID && call.clientSecret == h.idp.clientSecret)

            let again = try await h.broker.token(account: "api", minTTL: 30)
            #expect(again.result.accessToken == token.result.accessToken)
            #expect(h.idp.callCount == 1, "a cached token is served without calling the IdP")
            #expect(try await h.state().state == "valid")

            // The rotated refresh token is in the vault, and nothing is there in plaintext.
            let stored = try #require(try h.vaultCopy()?.accounts.first)
            #expect(stored.secrets.refreshToken?.text == h.idp.issuedRefreshTokens.last)
            #expect(stored.secrets.clientSecret?.text == h.idp.clientSecret)
            #expect(stored.token?.value.text == token.result.accessToken)
            let file = try Data(contentsOf: URL(fileURLWithPath: h.vaultPath))
            for secret in [h.idp.clientSecret, token.result.accessToken] + h.idp.issuedRefreshTokens {
                #expect(!file.contains(secret))
            }
        }
    }

    @Test func aBrokerStartedFromTheVaultServesTheSavedTokenAndRefreshesWithTheRotatedOne() async throws {
        try await BrokerHarness.run { h in
            _ = try await h.broker.add(account: "api", provider: h.provider, tokens: TokenSet(refreshToken: "rt-0"))
            let first = try await h.broker.token(account: "api", minTTL: 30)

            let restarted = try h.restart()
            let served = try await restarted.token(account: "api", minTTL: 30)
            #expect(served.result.accessToken == first.result.accessToken)
            #expect(h.idp.callCount == 1)

            _ = try await restarted.refreshNow(account: "api")
            #expect(h.idp.callCount == 2)
            #expect(h.idp.rejectedReuse == 0, "the restarted broker presented the rotated refresh token")
            #expect(
                try await restarted.token(account: "api", minTTL: 30).result.accessToken
                    == h.idp.issuedAccessTokens.last)
            await restarted.drain()
        }
    }

    @Test(.timeLimit(.minutes(5))) func fiftyConcurrentRequestsForAnExpiredTokenShareOneRefresh() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()
            #expect(h.idp.callCount == 0)
            h.clock.advance(by: 3700)
            let answers = h.idp.holdAnswers()

            let broker = h.broker
            let tokens = try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<50 {
                    group.addTask { try await broker.token(account: "api", minTTL: 30).result.accessToken }
                }
                try await h.openOnceJoined(answers)
                return try await group.reduce(into: [String]()) { $0.append($1) }
            }
            #expect(tokens.count == 50)
            #expect(h.idp.callCount == 1)
            #expect(Set(tokens) == Set(h.idp.issuedAccessTokens))
            #expect(h.idp.issuedAccessTokens.count == 1)
        }
    }

    @Test func aDeniedRefreshParksTheAccountUntilNewTokensArrive() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken(refreshToken: "rt-revoked")
            h.clock.advance(by: 3700)

            let error = await #expect(throws: BrokerError.self) { try await h.broker.token(account: "api", minTTL: 30) }
            #expect(error?.code == .needsLogin)
            // An oauth2 account whose IdP offers no sign-in endpoint is restored by a pushed refresh token.
            #expect(
                error?.message
                    == "the IdP denied the refresh for api: the token endpoint refused the refresh: HTTP 400 "
                    + "(invalid_grant: refresh token is not valid); push a new refresh_token with brokerctl set-tokens api (op "
                    + #"set_tokens), which reads {"refresh_token": ...} as JSON; its IdP offers no sign-in endpoint "#
                    + "(brokerctl update api --authorization-endpoint URL or --device-authorization-endpoint URL adds "
                    + "one)")
            #expect(h.idp.callCount == 1)
            let status = try await h.state()
            #expect(status.state == "needs_login")
            #expect(status.lastError?.code == "needs_login")
            #expect(status.lastError?.message.contains("invalid_grant") == true)
            #expect(status.nextRefreshAt == nil)

            // No further IdP calls, whatever is asked.
            for _ in 0..<3 {
                let again = await #expect(throws: BrokerError.self) {
                    try await h.broker.token(account: "api", minTTL: 0)
                }
                #expect(again?.code == .needsLogin)
            }
            let rejected = await #expect(throws: BrokerError.self) {
                try await h.broker.reject(account: "api", accessToken: "at-pushed", minTTL: 0)
            }
            #expect(rejected?.code == .needsLogin)
            let forced = await #expect(throws: BrokerError.self) { try await h.broker.refreshNow(account: "api") }
            #expect(forced?.code == .needsLogin)
            _ = await h.broker.runDueRefreshes()
            await h.broker.drain()
            #expect(h.idp.callCount == 1)
            #expect(try h.vaultCopy()?.accounts.first?.needsLogin == true, "needs_login survives a restart")

            // New tokens bring it back.
            let result = try await h.broker.setTokens(
                account: "api", tokens: TokenSet(accessToken: "at-new", expiresIn: 3600, refreshToken: "rt-0"))
            #expect(result.state == "valid")
            #expect(try await h.state().state == "valid")
            #expect(try await h.state().lastError == nil)
            #expect(try await h.broker.token(account: "api", minTTL: 30).result.accessToken == "at-new")
            #expect(h.idp.callCount == 1)
            _ = try await h.broker.refreshNow(account: "api")
            #expect(h.idp.callCount == 2)
            #expect(
                try await h.broker.token(account: "api", minTTL: 30).result.accessToken == h.idp.issuedAccessTokens.last
            )
        }
    }

    @Test func aDeniedAccountServesNothingEvenWhileItsTokenIsUnexpired() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken(refreshToken: "rt-revoked")
            let error = await #expect(throws: BrokerError.self) {
                try await h.broker.reject(account: "api", accessToken: "at-pushed", minTTL: 30)
            }
            #expect(error?.code == .needsLogin)
            #expect(h.idp.callCount == 1)
            #expect(h.broker.cache.token(for: "api", minTTL: 0, now: h.clock.now()) == nil)
            let served = await #expect(throws: BrokerError.self) { try await h.broker.token(account: "api", minTTL: 0) }
            #expect(served?.code == .needsLogin)
            #expect(h.idp.callCount == 1)
        }
    }

    @Test func aServerErrorKeepsServingTheValidTokenThenReportsUnavailable() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()
            h.clock.advance(by: 3500)  // 100 s of validity left
            h.idp.setBehavior(.status(500, retryAfter: 7))

            #expect(try await h.broker.token(account: "api", minTTL: 30).result.accessToken == "at-pushed")
            #expect(h.idp.callCount == 0, "a cached token that qualifies is served at once")

            // A min_ttl beyond what remains forces a refresh, which fails transiently.
            let error = await #expect(throws: BrokerError.self) {
                try await h.broker.token(account: "api", minTTL: 600)
            }
            #expect(error?.code == .unavailable)
            let retryAfterMs = try #require(error?.retryAfterMs)
            #expect(retryAfterMs >= 7000 && retryAfterMs <= 300_000, "Retry-After: 7 is honoured (\(retryAfterMs) ms)")
            #expect(h.idp.callCount == 1)
            var status = try await h.state()
            #expect(status.state == "stale")
            #expect(status.lastError?.code == "unavailable")
            #expect(status.nextRefreshAt != nil)

            // The current token is still served while valid, and nothing is lost.
            #expect(try await h.broker.token(account: "api", minTTL: 30).result.accessToken == "at-pushed")
            #expect(try h.vaultCopy()?.accounts.first?.secrets.refreshToken == "rt-0")

            // Within the backoff the broker fails fast instead of calling the IdP again.
            let fast = await #expect(throws: BrokerError.self) { try await h.broker.token(account: "api", minTTL: 600) }
            #expect(fast?.code == .unavailable)
            #expect((1...7000).contains(fast?.retryAfterMs ?? -1))
            #expect(h.idp.callCount == 1)

            // Past expiry and past the backoff: unavailable, and a request retries the IdP once.
            h.clock.advance(by: 200)
            status = try await h.state()
            #expect(status.state == "unavailable")
            let expired = await #expect(throws: BrokerError.self) {
                try await h.broker.token(account: "api", minTTL: 30)
            }
            #expect(expired?.code == .unavailable)
            #expect(expired?.retryAfterMs != nil)
            #expect(h.idp.callCount == 2)
            #expect(try await h.state().state == "unavailable")

            // Recovery.
            h.idp.setBehavior(.normal)
            h.clock.advance(by: 400)
            let recovered = try await h.broker.token(account: "api", minTTL: 30)
            #expect(recovered.result.accessToken == h.idp.issuedAccessTokens.first)
            #expect(h.idp.callCount == 3)
            status = try await h.state()
            #expect(status.state == "valid")
            #expect(status.lastError == nil)
        }
    }

    /// docs/limits.md: when an outage ends, clients' requests do not wait out the backoff.
    /// During it they fail fast, and once per `outage_probe_interval` one of them tries the IdP
    /// again; a crowd arriving then makes one call and is served by it.
    @Test(.timeLimit(.minutes(5))) func aRecoveredIdPIsFoundByTheNextRequestsNotAfterTheBackoff() async throws {
        var settings = BrokerSettings()
        settings.backoffBase = 600
        settings.backoffCap = 600
        try await BrokerHarness.run(settings: settings) { h in
            try await h.addWithValidToken()
            h.clock.advance(by: 3700)
            // Retry-After: 2 keeps the jittered backoff (2 s to 600 s) from ending before the probe.
            h.idp.setBehavior(.status(503, retryAfter: 2))
            let first = await #expect(throws: BrokerError.self) { try await h.broker.token(account: "api", minTTL: 30) }
            #expect(first?.code == .unavailable)
            #expect(h.idp.callCount == 1)
            #expect(first?.retryAfterMs == 2000, "a client may try again in 2 s")
            let probe = settings.outageProbeInterval

            h.clock.advance(by: probe / 2)
            let fast = await #expect(throws: BrokerError.self) { try await h.broker.token(account: "api", minTTL: 30) }
            #expect(fast?.code == .unavailable)
            #expect(h.idp.callCount == 1, "no IdP call before the probe interval has passed")

            h.clock.advance(by: probe / 2)
            let probed = await #expect(throws: BrokerError.self) {
                try await h.broker.token(account: "api", minTTL: 30)
            }
            #expect(probed?.code == .unavailable)
            #expect(h.idp.callCount == 2, "one probe, which found the IdP still down")

            h.idp.setBehavior(.normal)
            let answers = h.idp.holdAnswers()
            h.clock.advance(by: settings.outageProbeInterval)
            let broker = h.broker
            let tokens = try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<20 {
                    group.addTask { try await broker.token(account: "api", minTTL: 30).result.accessToken }
                }
                try await h.openOnceJoined(answers)
                return try await group.reduce(into: [String]()) { $0.append($1) }
            }
            #expect(h.idp.callCount == 3, "the crowd shared one call")
            #expect(Set(tokens) == Set(h.idp.issuedAccessTokens) && tokens.count == 20)
            #expect(try await h.state().state == "valid")
        }
    }

    @Test func aGarbageAnswerIsTransientAndKeepsTheRefreshToken() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()
            h.clock.advance(by: 3700)
            h.idp.setBehavior(.garbage)
            let error = await #expect(throws: BrokerError.self) { try await h.broker.token(account: "api", minTTL: 30) }
            #expect(error?.code == .unavailable)
            #expect(try await h.state().state == "unavailable")
            #expect(try h.vaultCopy()?.accounts.first?.secrets.refreshToken == "rt-0")
        }
    }

    @Test(.timeLimit(.minutes(5))) func rejectingTheCurrentTokenRefreshesOnceAndAnOldOneNotAtAll() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()

            let fresh = try await h.broker.reject(account: "api", accessToken: "at-pushed", minTTL: 30)
            #expect(h.idp.callCount == 1)
            #expect(fresh.result.accessToken == h.idp.issuedAccessTokens.first)

            // The same (now replaced) token rejected again: the current one, no refresh.
            let current = try await h.broker.reject(account: "api", accessToken: "at-pushed", minTTL: 30)
            #expect(current.result.accessToken == fresh.result.accessToken)
            let unknown = try await h.broker.reject(account: "api", accessToken: "never-issued", minTTL: 30)
            #expect(unknown.result.accessToken == fresh.result.accessToken)
            #expect(h.idp.callCount == 1)

            // Concurrent rejects of the current token share one refresh (once the minimum refresh
            // interval since the reject before has passed: within it, a reject makes none).
            h.clock.advance(by: h.settings.minimumRefreshInterval)
            let answers = h.idp.holdAnswers()
            let broker = h.broker
            let rejectedValue = fresh.result.accessToken
            let tokens = try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<20 {
                    group.addTask {
                        try await broker.reject(account: "api", accessToken: rejectedValue, minTTL: 30).result
                            .accessToken
                    }
                }
                try await h.openOnceJoined(answers)
                return try await group.reduce(into: [String]()) { $0.append($1) }
            }
            #expect(h.idp.callCount == 2)
            #expect(Set(tokens) == [h.idp.issuedAccessTokens[1]])
        }
    }

    @Test func statusSummaryLogsAndErrorsNeverContainSecrets() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()
            _ = try await h.broker.refreshNow(account: "api")
            _ = try await h.broker.add(
                account: "denied", provider: h.provider,
                tokens: TokenSet(accessToken: "at-denied-secret", expiresIn: 3600, refreshToken: "rt-denied-secret"))
            let denial = await #expect(throws: BrokerError.self) {
                try await h.broker.reject(account: "denied", accessToken: "at-denied-secret", minTTL: 30)
            }
            _ = try await h.broker.add(account: "static", provider: ProviderSpec(kind: "static"), tokens: nil)
            h.idp.setBehavior(.status(503, retryAfter: nil))
            let failure = await #expect(throws: BrokerError.self) {
                try await h.broker.refreshNow(account: "api")
            }

            let statuses = try await h.broker.status(account: nil)
            #expect(statuses.map(\.account) == ["api", "denied", "static"])
            #expect(statuses.map(\.state) == ["stale", "needs_login", "needs_login"])
            let statusJSON = String(
                decoding: try Wire.makeEncoder().encode(StatusResult(accounts: statuses)), as: UTF8.self)
            let summary = await h.broker.summary()
            #expect(summary == "3 accounts: 2 needs login, 1 stale")
            let logs = h.logs.all.joined(separator: "\n")
            #expect(!logs.isEmpty)
            let errors = [denial, failure].compactMap { $0?.description }.joined(separator: "\n")

            let refreshSecrets = ["rt-0", "rt-denied-secret", h.idp.clientSecret] + h.idp.issuedRefreshTokens
            let accessTokens = ["at-pushed", "at-denied-secret"] + h.idp.issuedAccessTokens
            for secret in refreshSecrets + accessTokens {
                #expect(!statusJSON.contains(secret), "status carries \(secret)")
                #expect(!summary.contains(secret))
                #expect(!logs.contains(secret), "the log carries \(secret)")
                #expect(!errors.contains(secret), "an error message carries \(secret)")
            }
        }
    }

    @Test func unknownAccountsAndInvalidRequestsAreRefused() async throws {
        try await BrokerHarness.run { h in
            let missing = await #expect(throws: BrokerError.self) {
                try await h.broker.token(account: "nope", minTTL: 30)
            }
            #expect(missing?.code == .notFound)
            let status = await #expect(throws: BrokerError.self) { try await h.broker.status(account: "nope") }
            #expect(status?.code == .notFound)

            for name in ["", "has space", "slash/", String(repeating: "a", count: 129)] {
                let error = await #expect(throws: BrokerError.self) {
                    try await h.broker.add(account: name, provider: h.provider, tokens: TokenSet(refreshToken: "rt-0"))
                }
                #expect(error?.code == .badRequest, "name \(name.debugDescription)")
            }
            let plainHTTP = await #expect(throws: BrokerError.self) {
                try await h.broker.add(
                    account: "api",
                    provider: ProviderSpec(
                        kind: "oauth2", ["token_endpoint": "http://idp.example/token", "client_id": "c"]),
                    tokens: nil)
            }
            #expect(plainHTTP?.code == .badRequest)
            try await h.addWithValidToken()
            let duplicate = await #expect(throws: BrokerError.self) { try await h.addWithValidToken() }
            #expect(duplicate?.code == .badRequest)
            #expect(h.idp.callCount == 0)
        }
    }

    @Test func aStaticAccountServesPushedTokensUntilTheyExpire() async throws {
        try await BrokerHarness.run { h in
            let name = try AccountName("static")
            let pushed = { (value: String) throws(BrokerFailure) in
                TokenPush(
                    access: try TokenPush.Access(
                        value: value, type: nil, expiry: .after(120), idToken: nil, scope: nil))
            }
            let added = try await h.broker.add(
                name, provider: ProviderConfig(StaticSettings()), clientSecret: nil, tokens: try pushed("at-static"))
            #expect(added.state == .valid)
            #expect(try await h.broker.token(for: name, minTTL: 60).result.accessToken == "at-static")
            h.clock.advance(by: 121)
            #expect(try await h.broker.snapshot(of: name).state == .needsLogin)
            await #expect(throws: BrokerFailure.noTokenLongEnough(name, kind: "static")) {
                try await h.broker.token(for: name, minTTL: 0)
            }
            let replaced = try await h.broker.setTokens(of: name, to: try pushed("at-static-2"))
            #expect(replaced.state == .valid)
            #expect(try await h.broker.token(for: name, minTTL: 60).result.accessToken == "at-static-2")
            #expect(h.idp.callCount == 0)
        }
    }

    @Test func removeDeletesTheAccountAndItsSecretsFromTheVault() async throws {
        try await BrokerHarness.run { h in
            #expect(await h.broker.summary() == "0 accounts")
            try await h.addWithValidToken()
            #expect(await h.broker.summary() == "1 account: 1 valid")
            #expect(try h.vaultCopy()?.accounts.map(\.name) == ["api"])

            let api = try AccountName("api")
            let removed = try await h.broker.remove(account: "api")
            #expect(removed.state == "removed", "the wire's answer")
            #expect(try h.vaultCopy()?.accounts.isEmpty == true)
            await #expect(throws: BrokerFailure.noSuchAccount(api)) { try await h.broker.token(for: api, minTTL: 0) }
            await #expect(throws: BrokerFailure.noSuchAccount(api)) { try await h.broker.remove(api) }
            #expect(await h.broker.snapshots().isEmpty)
        }
    }

    @Test func aMinTTLBeyondTheIdPsLifetimeDoesNotRefreshOnEveryRequest() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()
            for _ in 0..<5 {
                let error = await #expect(throws: BrokerError.self) {
                    try await h.broker.token(account: "api", minTTL: 7200)
                }
                #expect(error?.code == .lifetimeTooShort)
            }
            #expect(h.idp.callCount <= 1, "IdP calls: \(h.idp.callCount)")
        }
    }

    @Test func anIdPIssuingZeroLifetimeTokensIsNotCalledInAHotLoop() async throws {
        try await BrokerHarness.run { h in
            h.idp.setLifetime(0)
            _ = try await h.broker.add(account: "api", provider: h.provider, tokens: TokenSet(refreshToken: "rt-0"))
            await h.broker.drain()
            #expect(h.idp.callCount == 1)
            // What RefreshScheduler does at each deadline and change; the test clock does not move.
            for _ in 0..<5 {
                _ = await h.broker.runDueRefreshes()
                await h.broker.drain()
            }
            #expect(h.idp.callCount == 1, "IdP calls: \(h.idp.callCount)")
        }
    }
}
