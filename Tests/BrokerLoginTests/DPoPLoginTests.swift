@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// `login` of an account with `dpop` (docs/dpop.md): the code and device-code exchanges carry
/// proofs of the key the account keeps, the browser flow's authorization request names its
/// thumbprint (`dpop_jkt`), and the tokens the IdP issues are bound to it.
@Suite struct DPoPLoginTests {
    /// The login provider of `LoginTests` with `dpop`, as a public client (its refresh tokens
    /// are bound too), at an IdP that demands DPoP and a nonce.
    static func provider(_ harness: BrokerHarness) -> ProviderSpec {
        let clock = harness.clock
        harness.idp.requireDPoP(nonce: true, clock: { clock.now() })
        var spec = LoginTests.provider(harness.idp, secret: false)
        spec["dpop"] = .string("ES256")
        return spec
    }

    /// The thumbprint `status` shows for `work`, and that the IdP bound its tokens to it.
    static func boundThumbprint(_ harness: BrokerHarness) async throws -> String {
        let thumbprint = try #require(try await harness.state("work").dpop?.thumbprint)
        let token = try await harness.broker.token(account: "work", minTTL: 60).result
        #expect(token.tokenType == "DPoP")
        #expect(harness.idp.boundThumbprint(ofAccessToken: token.accessToken) == thumbprint)
        let refreshToken = try #require(harness.idp.issuedRefreshTokens.last)
        #expect(harness.idp.boundThumbprint(ofRefreshToken: refreshToken) == thumbprint)
        return thumbprint
    }

    @Test func theDeviceFlowProvesTheAccountsKey() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            let progress = LoginTests.Progress()
            let login = LoginTests.start(
                harness, LoginTests.request("device", provider: Self.provider(harness)), progress: progress)
            let offer = try await progress.first(.deviceCode)
            #expect(try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete)) == 200)
            await LoginTests.poll(harness)
            #expect(try await login.value.state == "valid")
            let thumbprint = try await Self.boundThumbprint(harness)
            // Its first poll had no nonce; later ones carried the IdP's.
            #expect(harness.idp.dpopRefusals == ["nonce"])

            // The refresh proves the same key, and the IdP takes the bound refresh token.
            _ = try await harness.broker.refreshNow(account: "work")
            #expect(try await Self.boundThumbprint(harness) == thumbprint)
            #expect(harness.idp.dpopRefusals == ["nonce"])
        }
    }

    @Test func theBrowserFlowNamesTheKeyAndProvesIt() async throws {
        try await BrokerHarness.run { harness in
            let progress = LoginTests.Progress()
            let login = LoginTests.start(
                harness, LoginTests.request("browser", provider: Self.provider(harness)), progress: progress)
            let offer = try await progress.first(.authorizationURL)
            let browser = TestBrowser()
            let url = try await browser.start(try #require(offer.url))
            #expect(url.contains("dpop_jkt="))
            let page = try await browser.visit(try await TestBrowser.authorize(url))
            #expect(page.status == 200)
            #expect(try await login.value.state == "valid")
            let thumbprint = try await Self.boundThumbprint(harness)
            #expect(harness.idp.authorizationDPoPJKT == thumbprint)
            #expect(harness.idp.rejectedCodeExchanges.isEmpty)
        }
    }

    /// Signing in again keeps the key: the thumbprint, and so the binding, stays.
    @Test func aSecondLoginProvesTheSameKey() async throws {
        try await BrokerHarness.run { harness in
            let provider = Self.provider(harness)
            harness.idp.setDeviceTiming(interval: 1)
            var thumbprints: [String] = []
            for _ in 0..<2 {
                let progress = LoginTests.Progress()
                let login = LoginTests.start(
                    harness, LoginTests.request("device", provider: provider), progress: progress)
                let offer = try await progress.first(.deviceCode)
                #expect(try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete)) == 200)
                await LoginTests.poll(harness)
                _ = try await login.value
                thumbprints.append(try await Self.boundThumbprint(harness))
            }
            #expect(thumbprints.count == 2 && thumbprints[0] == thumbprints[1])
        }
    }
}
