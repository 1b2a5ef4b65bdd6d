import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

/// `reject`: concurrent rejects of the current token share one refresh; a stale reject makes none.
@Suite struct RejectTests {
    @Test func oneHundredConcurrentRejectsMakeOneRefresh() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-rej", lifetime: 3600)
        idp.setDelay(.milliseconds(300))
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let clients = try (0..<10).map { _ in try broker.client() }
        defer { clients.forEach { $0.close() } }
        _ = try await clients[0].add(
            account: "rej",
            provider: ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
            tokens: TokenSet(refreshToken: "rt-rej"))
        let refused = try await clients[0].token(account: "rej")
        #expect(idp.callCount == 1)

        let answers = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<100 {
                let client = clients[index % clients.count]
                group.addTask { try await client.reject(account: "rej", accessToken: refused.accessToken).accessToken }
            }
            return try await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(idp.callCount == 2, "one shared refresh for 100 rejects")
        #expect(Set(answers) == [idp.issuedAccessTokens[1]])

        // The old token again: it was already replaced, so the current one comes back, no refresh.
        let stale = try await clients[1].reject(account: "rej", accessToken: refused.accessToken)
        #expect(stale.accessToken == idp.issuedAccessTokens[1])
        #expect(idp.callCount == 2)
        await idp.shutdown()
    }
}
