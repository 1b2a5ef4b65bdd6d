import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

/// Many callers waiting on an expired account share one IdP call.
@Suite struct SingleFlightTests {
    @Test func twoHundredConcurrentRequestsMakeOneIdPCall() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-sf", lifetime: 3600)
        idp.setDelay(.milliseconds(500))
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let owner = try broker.client()
        defer { owner.close() }
        let clients = try (0..<20).map { _ in try broker.client() }
        defer { clients.forEach { $0.close() } }

        let expired = Date().addingTimeInterval(-60)
        _ = try await owner.add(
            account: "busy",
            provider: ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
            tokens: TokenSet(accessToken: "old-expired", expiresAt: expired, refreshToken: "rt-sf"))

        let tokens = try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<200 {
                let client = clients[index % clients.count]
                group.addTask { try await client.token(account: "busy", minTTL: 60).accessToken }
            }
            return try await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(tokens.count == 200)
        #expect(idp.callCount == 1)
        #expect(Set(tokens) == Set(idp.issuedAccessTokens))
        await idp.shutdown()
    }
}
