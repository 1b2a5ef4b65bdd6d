import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// A real brokerd against the HTTP test IdP: answers that do not refuse the grant (400
/// `server_error`, 429 with `Retry-After`, HTML with 200) keep the account `stale` and serving
/// its token; `invalid_grant` stops it (`needs_login`). `brokerctl status --json`, brokerctl's
/// messages and brokerd's log quote the IdP's error and description, and never the account's
/// refresh token or client secret, even when the IdP echoes them.
@Suite struct TransientIdPAnswerTests {
    @Test func statusAndMessagesQuoteTheIdPAndOnlyADenialStopsTheAccount() async throws {
        let refreshToken = "rt-echoed-\(UUID().uuidString)"
        let clientSecret = "cs-echoed-\(UUID().uuidString)"
        let secrets = [refreshToken, clientSecret]
        let idp = try await OAuth2TestIdP(initialRefreshToken: refreshToken, lifetime: 3600, clientSecret: clientSecret)
        let broker = try BrokerProcess()
        defer { broker.stop() }
        // A cap above the Retry-After below, which it would cut.
        try broker.writeConfig("[broker]\nrequest_timeout = 2\nbackoff_cap = 30\n")
        try await broker.start()
        let client = try broker.client()
        _ = try await client.add(
            account: "api",
            provider: ProviderSpec(
                kind: "oauth2",
                [
                    "token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID),
                    "client_secret": .string(clientSecret), "client_auth": "client_secret_post",
                ]),
            tokens: TokenSet(accessToken: "at-first", expiresIn: 3600, refreshToken: refreshToken))
        client.close()

        /// The account's state and last error message, from `brokerctl status api --json`.
        func status() async throws -> (state: String?, message: String?) {
            let shown = try await broker.brokerctl(["status", "api", "--json"])
            #expect(shown.status == 0, "\(shown.stderr)")
            for secret in secrets { #expect(!shown.stdout.contains(secret)) }
            let object = try JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any]
            let account = (object?["accounts"] as? [[String: Any]])?.first
            return (account?["state"] as? String, (account?["last_error"] as? [String: Any])?["message"] as? String)
        }
        /// Runs `brokerctl refresh api`; its exit code and message.
        func refresh() async throws -> (status: Int32, message: String) {
            let refreshed = try await broker.brokerctl(["refresh", "api"])
            for secret in secrets { #expect(!(refreshed.stdout + refreshed.stderr).contains(secret)) }
            return (refreshed.status, refreshed.stderr)
        }
        // The IdP echoes both secrets in its description.
        let echo = "for \(refreshToken) of \(clientSecret)"
        let redacted = "for [redacted] of [redacted]"

        let transient: [(OAuth2TestIdP.Behavior, String)] = [
            (
                .oauthError(400, error: "server_error", description: "busy \(echo)"),
                "the token endpoint answered HTTP 400 (server_error: busy \(redacted))"
            ),
            (.status(429, retryAfter: 3), "the token endpoint answered HTTP 429 (temporarily_unavailable)"),
            (.garbage, "the token endpoint answered HTTP 200 without a usable access_token"),
        ]
        for (behavior, shown) in transient {
            idp.setBehavior(behavior)
            let refreshed = try await refresh()
            #expect(refreshed.status == 6, "unavailable: \(refreshed.message)")
            #expect(refreshed.message.contains(shown), "\(refreshed.message)")
            let now = try await status()
            #expect(now.state == "stale", "\(behavior)")
            #expect(now.message == shown)
            let token = try await broker.brokerctl(["token", "api"])
            #expect(token.status == 0 && token.stdout.contains("at-first"), "\(behavior): the cached token is served")
        }

        // A Retry-After of 3 s holds clients' requests off the IdP for those 3 s: a token the
        // cached one cannot serve (it has less than its whole lifetime left) fails fast.
        // (The owner's refresh restarts the backoff, so the schedule makes no call either.)
        idp.setBehavior(.status(429, retryAfter: 3))
        let owner = try broker.client()
        let limited = await #expect(throws: BrokerError.self) { _ = try await owner.refresh(account: "api") }
        owner.close()
        #expect((limited?.retryAfterMs ?? 0) >= 3000, "\(limited?.retryAfterMs ?? 0)")
        let calls = idp.callCount
        let answeredAt = try #require(idp.calls.last?.at)
        let beyond = try await broker.brokerctl(["token", "api", "--min-ttl", "3599.9"])
        #expect(beyond.status == 6, "\(beyond.stderr)")
        // On a loaded machine the schedule's own retry may come meanwhile, but never before 3 s.
        let early = idp.calls.dropFirst(calls).filter { $0.at.timeIntervalSince(answeredAt) < 2.9 }
        #expect(early.isEmpty, "no call to the IdP before Retry-After has passed")

        idp.setBehavior(.oauthError(400, error: "invalid_grant", description: "unknown refresh token \(echo)"))
        let shown =
            "the token endpoint refused the refresh: HTTP 400 (invalid_grant: unknown refresh token \(redacted))"
        let denied = try await refresh()
        #expect(denied.status == 5, "needs_login: \(denied.message)")
        #expect(denied.message.contains(shown), "\(denied.message)")
        let now = try await status()
        #expect(now.state == "needs_login")
        #expect(now.message == shown)
        let token = try await broker.brokerctl(["token", "api"])
        #expect(token.status == 5)
        #expect(token.stderr.contains("(invalid_grant: unknown refresh token \(redacted))"), "\(token.stderr)")
        for secret in secrets { #expect(!(token.stdout + token.stderr).contains(secret)) }

        #expect(broker.stop() == 0)
        for secret in secrets { #expect(!broker.log.contains(secret), "brokerd's log holds a secret") }
        #expect(broker.log.contains("unknown refresh token \(redacted)"))
        await idp.shutdown()
    }
}
