import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

/// An `oauth2` account end to end: real brokerd, real socket, real HTTP to a rotating IdP.
@Suite struct OAuth2LifecycleTests {
    @Test func refreshesOnItsOwnRotatesAndSurvivesRestartWithoutPlaintext() async throws {
        let refreshToken = "rt-initial-\(UInt32.random(in: 0...UInt32.max))"
        let idp = try await OAuth2TestIdP(initialRefreshToken: refreshToken, lifetime: 3)
        let broker = try BrokerProcess()
        try await broker.start()
        let client = try broker.client()
        _ = try await client.add(
            account: "api",
            provider: idp.provider(clientAuth: "client_secret_basic"),
            tokens: TokenSet(refreshToken: refreshToken))

        let first = try await client.token(account: "api", minTTL: 1)
        let firstIndex = try #require(idp.issuedAccessTokens.firstIndex(of: first.accessToken))

        // With no client asking, the broker refreshes before each 3-second lifetime runs out.
        let refreshedAlone = await eventually { idp.issuedAccessTokens.count >= firstIndex + 3 }
        #expect(refreshedAlone)
        let later = try await client.token(account: "api", minTTL: 0)
        let laterIndex = try #require(idp.issuedAccessTokens.firstIndex(of: later.accessToken))
        #expect(laterIndex >= firstIndex + 1, "the token served was fetched in the background")
        #expect(idp.calls.allSatisfy { $0.clientSecret == idp.clientSecret && $0.clientID == idp.clientID })
        client.close()

        // Restart: the account keeps working from the vault alone.
        #expect(broker.stop() == 0)
        try await broker.start()
        let restarted = try broker.client()
        let afterRestart = try await restarted.token(account: "api", minTTL: 1)
        #expect(idp.issuedAccessTokens.contains(afterRestart.accessToken))
        #expect(idp.rejectedReuse == 0)
        let status = try await restarted.status(account: "api")
        #expect(status.first?.state == "valid" || status.first?.state == "refreshing")
        restarted.close()
        #expect(broker.stop() == 0)
        await idp.shutdown()

        // Every call presented the refresh token issued by the call before it; none was reused.
        #expect(idp.calls.map(\.refreshToken) == [refreshToken] + idp.issuedRefreshTokens.dropLast())
        #expect(idp.rejectedReuse == 0)

        // Nothing secret is stored or logged in plaintext.
        let secrets = [refreshToken, idp.clientSecret] + idp.issuedRefreshTokens + idp.issuedAccessTokens
        for file in broker.storedFiles() {
            for secret in secrets {
                #expect(!file.bytes.contains(secret), "plaintext secret in \(file.path)")
            }
        }
        for secret in [refreshToken, idp.clientSecret] + idp.issuedRefreshTokens {
            #expect(!broker.log.contains(secret), "secret in the broker's log")
        }
    }
}
