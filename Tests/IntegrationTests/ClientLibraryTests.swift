import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

/// BrokerClient's `withToken`: one reject-and-retry on a refused token, never more.
@Suite struct ClientLibraryTests {
    @Test func withTokenRetriesOnceWithARefreshedToken() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-lib", lifetime: 3600)
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        _ = try await client.add(
            account: "lib",
            provider: ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
            tokens: TokenSet(refreshToken: "rt-lib"))
        let first = try await client.token(account: "lib")

        // The resource server refuses the first token once: one refresh, one retry.
        var seen: [String] = []
        let answer = try await client.withToken(account: "lib") { token in
            seen.append(token.accessToken)
            if token.accessToken == first.accessToken { throw TokenRefused() }
            return "ok"
        }
        #expect(answer == "ok")
        #expect(seen.count == 2)
        #expect(seen[1] != first.accessToken)
        #expect(idp.callCount == 2)

        // A stale reject (the token was already replaced) returns the current one, no refresh.
        let current = try await client.reject(account: "lib", accessToken: first.accessToken)
        #expect(current.accessToken == seen[1])
        #expect(idp.callCount == 2)

        // Refused twice: the body runs twice and the error surfaces.
        var attempts = 0
        await #expect(throws: TokenRefused.self) {
            try await client.withToken(account: "lib") { _ in
                attempts += 1
                throw TokenRefused()
            }
        }
        #expect(attempts == 2)
        await idp.shutdown()
    }
}
