import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// An account the IdP denied makes no more calls to it, whatever the time and whoever asks,
/// until new tokens arrive: for the kinds beyond `oauth2` (BrokerTests covers that one; the
/// `exec` kind's command is run by ExecProviderTests), on the harness's clock.
@Suite struct DeniedAccountTests {
    @Test func aRevokedRefreshURLIsNotCalledAgain() async throws {
        try await BrokerHarness.run { harness in
            let idp = try await RefreshURLTestIdP(lifetime: 3, serving: .inProcess)
            _ = try await harness.broker.add(
                account: "pph", provider: ProviderSpec(kind: "refresh_url"),
                tokens: TokenSet(refreshURL: idp.initialURL))
            _ = try await harness.broker.token(account: "pph", minTTL: 1)
            #expect(idp.callCount == 1)

            // The session is revoked; the refresh due as the 3-second token ends gets 401.
            idp.revoke()
            harness.clock.advance(by: 3)
            _ = await harness.broker.runDueRefreshes()
            await harness.broker.drain()
            #expect(try await harness.state("pph").state == "needs_login")
            #expect(idp.callCount == 2)
            #expect(await harness.staysQuietAfterDenial("pph") { idp.callCount })
            await idp.shutdown()
        }
    }

    @Test func aSlidingAccountWhoseTokenWasReusedIsNotCalledAgain() async throws {
        try await BrokerHarness.run { harness in
            let initial = "srt-\(UInt32.random(in: 0...UInt32.max))"
            let idp = try await SlidingTestIdP(initialRefreshToken: initial, serving: .inProcess)
            var provider = ProviderSpec(kind: "sliding")
            provider["endpoint"] = .string(idp.endpoint)
            _ = try await harness.broker.add(
                account: "volt", provider: provider, tokens: TokenSet(refreshToken: initial))
            _ = try await harness.broker.token(account: "volt", minTTL: 1)

            // A refresh token already used comes back: RefreshTokenMismatch, a denial.
            _ = try await harness.broker.setTokens(account: "volt", tokens: TokenSet(refreshToken: initial))
            await #expect(throws: BrokerError.self) { try await harness.broker.refreshNow(account: "volt") }
            #expect(try await harness.state("volt").state == "needs_login")
            #expect(idp.rejectedReuse == 1)
            #expect(await harness.staysQuietAfterDenial("volt") { idp.callCount })
            await idp.shutdown()
        }
    }
}
