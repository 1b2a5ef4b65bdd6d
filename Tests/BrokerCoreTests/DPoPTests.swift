@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// DPoP (RFC 9449, docs/dpop.md): an account with `dpop = "ES256"` has a key brokerd made,
/// every request to its token endpoint carries a proof the test IdP verifies (under the manual
/// clock), the tokens are bound to the key's thumbprint, and proofs for programs verify as a
/// resource server checks them.
@Suite struct DPoPTests {
    /// `api`, a public client (its refresh tokens are bound too) with `dpop` and refresh token
    /// `rt-0`, added to a broker whose IdP demands DPoP with a nonce.
    static func addDPoPAccount(_ harness: BrokerHarness, nonce: Bool = true) async throws {
        let clock = harness.clock
        harness.idp.requireDPoP(nonce: nonce, clock: { clock.now() })
        var provider = ProviderSpec(
            kind: "oauth2",
            ["token_endpoint": .string(harness.idp.tokenEndpoint), "client_id": .string(harness.idp.clientID)])
        provider["dpop"] = .string("ES256")
        _ = try await harness.broker.add(account: "api", provider: provider, tokens: TokenSet(refreshToken: "rt-0"))
        await harness.broker.drain()
    }

    @Test func refreshesCarryProofsOfOneKeyWhoseThumbprintTheTokensAreBoundTo() async throws {
        try await BrokerHarness.run { harness in
            try await Self.addDPoPAccount(harness)
            // `add` refreshed at once: the first proof had no nonce, the retry carried the IdP's.
            #expect(harness.idp.dpopRefusals == ["nonce"])
            #expect(harness.idp.refreshCalls.count == 2)
            let token = try await harness.broker.token(account: "api", minTTL: 0)
            #expect(token.result.tokenType == "DPoP")
            let status = try await harness.state()
            let thumbprint = try #require(status.dpop?.thumbprint)
            #expect(status.dpop?.algorithm == "ES256" && status.dpop?.issuedTokenType == nil)
            #expect(harness.idp.boundThumbprint(ofAccessToken: token.result.accessToken) == thumbprint)

            // The next refreshes send the nonce the IdP gave: no second refusal.
            for _ in 0..<2 { _ = try await harness.broker.refreshNow(account: "api") }
            #expect(harness.idp.dpopRefusals == ["nonce"])
            #expect(harness.idp.refreshCalls.count == 4)
            let latest = try await harness.broker.token(account: "api", minTTL: 0).result.accessToken
            #expect(harness.idp.boundThumbprint(ofAccessToken: latest) == thumbprint)

            // A restart keeps the key; it knows no nonce yet, so it costs at most one retry.
            let restarted = try harness.restart()
            #expect(try await restarted.status(account: "api").first?.dpop?.thumbprint == thumbprint)
            await harness.broker.drain()
            _ = try await restarted.refreshNow(account: "api")
            #expect(harness.idp.dpopRefusals.count <= 2)
            let afterRestart = try await restarted.token(account: "api", minTTL: 0).result.accessToken
            #expect(harness.idp.boundThumbprint(ofAccessToken: afterRestart) == thumbprint)
            await restarted.drain()
        }
    }

    @Test func aScopedTokenIsRefreshedWithAProofOfTheSameKey() async throws {
        try await BrokerHarness.run { harness in
            try await Self.addDPoPAccount(harness, nonce: false)
            let thumbprint = try #require(try await harness.state().dpop?.thumbprint)
            let narrowed = try await harness.broker.token(account: "api", minTTL: 0, scope: "read")
            #expect(harness.idp.refreshCalls.last?.scope == "read")
            #expect(harness.idp.boundThumbprint(ofAccessToken: narrowed.result.accessToken) == thumbprint)
            #expect(harness.idp.dpopRefusals.isEmpty)
            // Its proof's `ath` is the narrowed token's.
            let target = try DPoPTarget(method: "GET", url: "https://api.example/read", nonce: nil)
            let proof = try #require(narrowed.proof(for: target, now: harness.clock.now()))
            _ = try DPoPVerifier().verify(
                proof, method: "GET", url: "https://api.example/read", now: harness.clock.now(),
                accessToken: narrowed.result.accessToken, boundTo: thumbprint)
        }
    }

    @Test func proofsForProgramsAreFreshAndBoundToTheirRequestAndToken() async throws {
        try await BrokerHarness.run { harness in
            try await Self.addDPoPAccount(harness, nonce: false)
            let thumbprint = try #require(try await harness.state().dpop?.thumbprint)
            let token = try await harness.broker.token(account: "api", minTTL: 0)
            let now = harness.clock.now()
            let url = "https://api.example/v1/items"
            let target = try DPoPTarget(method: "GET", url: url + "?page=2#top", nonce: "n-1")
            #expect(target.url == url, "query and fragment are stripped")
            let first = try #require(token.proof(for: target, now: now))
            let second = try #require(token.proof(for: target, now: now))
            #expect(first != second, "every proof has its own jti")

            let server = DPoPVerifier()
            let accessToken = token.result.accessToken
            #expect(
                try server.verify(
                    first, method: "GET", url: url, now: now, accessToken: accessToken, nonce: "n-1",
                    boundTo: thumbprint)
                    == thumbprint)
            // The checks can fail: the same proof again, another method or URL, another token, a stale one.
            #expect(throws: DPoPRefusal.replayed) {
                try server.verify(
                    first, method: "GET", url: url, now: now, accessToken: accessToken, nonce: "n-1",
                    boundTo: thumbprint)
            }
            #expect(throws: DPoPRefusal.htm) {
                try server.verify(second, method: "POST", url: url, now: now, accessToken: accessToken, nonce: "n-1")
            }
            #expect(throws: DPoPRefusal.htu) {
                try server.verify(
                    second, method: "GET", url: url + "/x", now: now, accessToken: accessToken, nonce: "n-1")
            }
            #expect(throws: DPoPRefusal.ath) {
                try server.verify(second, method: "GET", url: url, now: now, accessToken: "another", nonce: "n-1")
            }
            #expect(throws: DPoPRefusal.iat) {
                try server.verify(
                    second, method: "GET", url: url, now: now.addingTimeInterval(600), accessToken: accessToken,
                    nonce: "n-1")
            }
        }
    }

    /// Logging out discards the tokens, not the key; an account whose `dpop` is removed keeps
    /// its key in the vault but proves nothing and shows none.
    @Test func theKeyOutlivesALogoutAndRestsWhenDPoPIsTurnedOff() async throws {
        try await BrokerHarness.run { harness in
            try await Self.addDPoPAccount(harness, nonce: false)
            let thumbprint = try #require(try await harness.state().dpop?.thumbprint)
            _ = try await harness.broker.logout(account: "api", force: true)
            #expect(try await harness.state().dpop?.thumbprint == thumbprint)
            var record = try #require(try harness.vaultCopy()?.accounts.first)
            #expect(record.secrets.dpopKey?.thumbprint == thumbprint)
            var settings = try #require(record.provider.settings as? OAuth2Settings)
            settings.dpop = nil
            record.provider = ProviderConfig(settings)
            #expect(record.dpopKey == nil && record.dpopStatus == nil && record.secrets.dpopKey != nil)
        }
    }

    @Test func aBearerAccountHasNoKeyAndMakesNoProof() async throws {
        try await BrokerHarness.run { harness in
            try await harness.addWithValidToken()
            #expect(try await harness.state().dpop == nil)
            let token = try await harness.broker.token(account: "api", minTTL: 0)
            #expect(!token.provesPossession)
            #expect(
                token.proof(for: try DPoPTarget(method: "GET", url: "https://a.example/", nonce: nil), now: .now) == nil
            )
            #expect(try harness.vaultCopy()?.accounts.first?.secrets.dpopKey == nil)
        }
    }

    @Test func anIdPThatAnswersBearerIsReportedAndTheAccountKeepsWorking() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.answerBearer(true)
            try await Self.addDPoPAccount(harness, nonce: false)
            #expect(harness.idp.dpopProofsSeen >= 1, "the request carried a proof")
            #expect(try await harness.state().dpop?.issuedTokenType == "Bearer")
            #expect(try await harness.broker.token(account: "api", minTTL: 0).result.tokenType == "Bearer")
        }
    }

    /// Nonces are kept per endpoint (two realms of one IdP share an origin, not their nonces),
    /// only when a proof may carry them, and the oldest go past the limit.
    @Test func nonceMemoryKeepsOneNoncePerEndpoint() throws {
        let nonces = DPoPNonces()
        let realm = try #require(URL(string: "https://id.example/realms/a/token"))
        let other = try #require(URL(string: "https://ID.example:443/realms/b/token"))
        nonces.remember("n-a", for: realm)
        nonces.remember("n-b", for: other)
        nonces.remember("bad\"nonce", for: realm)
        #expect(nonces.nonce(for: realm) == "n-a" && nonces.nonce(for: other) == "n-b")
        #expect(nonces.nonce(for: try #require(URL(string: "https://id.example/realms/a/token?x"))) == "n-a")
        for index in 0..<DPoPNonces.limit {
            nonces.remember("n", for: try #require(URL(string: "https://id\(index).example/token")))
        }
        #expect(nonces.nonce(for: realm) == nil, "the oldest went")
    }

    /// Requests a proof is refused for: a URL the broker would not call, or too long; a method
    /// that is no HTTP token, or too long; either missing.
    static let refusedTargets: [(method: String?, url: String?)] = [
        ("GET", "http://api.example/v1"), ("GET", "ftp://api.example/v1"), ("GET", "/v1/items"), ("GET", nil),
        ("GET", "https://api.example/" + String(repeating: "a", count: 2048)), ("GET", "https://api example/"),
        ("", "https://api.example/"), ("GE T", "https://api.example/"), (nil, "https://api.example/"),
        (String(repeating: "G", count: 33), "https://api.example/"), ("GET", "https://user:pw@api.example/"),
    ]

    @Test(arguments: refusedTargets)
    func aTargetTheBrokerWouldNotCallIsRefused(method: String?, url: String?) {
        #expect(throws: BrokerFailure.self) { try DPoPTarget(method: method, url: url, nonce: nil) }
    }

    @Test func aTargetOnLoopbackOrHTTPSIsTakenAndANonceIsChecked() throws {
        #expect(
            try DPoPTarget(method: "PATCH", url: "http://127.0.0.1:8080/x?y", nonce: nil).url
                == "http://127.0.0.1:8080/x")
        #expect(try DPoPTarget(method: "GET", url: "https://api.example/", nonce: "abc_-.~!").nonce == "abc_-.~!")
        #expect(throws: BrokerFailure.self) { try DPoPTarget(method: "GET", url: "https://a.example/", nonce: "a\"b") }
        #expect(throws: BrokerFailure.self) { try DPoPTarget(method: "GET", url: "https://a.example/", nonce: "") }
        #expect(throws: BrokerFailure.self) {
            try DPoPTarget(method: "GET", url: "https://a.example/", nonce: String(repeating: "n", count: 1025))
        }
    }
}
