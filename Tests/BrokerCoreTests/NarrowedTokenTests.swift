@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// Tokens narrowed to a scope or bound to a resource (`TokenKey`): their keys, their cache,
/// and their turns on the account's refresh-token chain.
@Suite struct NarrowedTokenTests {
    @Test func keysIgnoreScopeOrderAndRepeats() throws {
        let key = try TokenKey.checking(scope: "write read  read", resource: nil)
        #expect(key == (try TokenKey.checking(scope: "read write", resource: nil)))
        #expect(key.scopes == ["read", "write"])
        #expect(key.scopeText == "read write")
        #expect(!key.isAccount)
        #expect(try TokenKey.checking(scope: nil, resource: nil) == .account)
        let bound = try TokenKey.checking(scope: nil, resource: "urn:example:api")
        #expect(bound.resource == "urn:example:api" && bound.scopeText == nil)
        #expect(bound != .account)
    }

    @Test(
        arguments: [
            ("  ", nil), ("a\u{7F}b", nil), ("caf\u{E9}", nil), (nil, "https://api.example/#x"),
            (nil, "api.example.com"),
            (nil, "1http://x"), (nil, "https:"), (nil, "https://api.example/\u{E9}"),
        ] as [(String?, String?)])
    func badScopesAndResourcesAreRefused(scope: String?, resource: String?) {
        #expect(throws: BrokerFailure.self) { try TokenKey.checking(scope: scope, resource: resource) }
    }

    @Test func theCacheKeepsNarrowedTokensApartAndBounded() throws {
        let cache = TokenCache()
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        func token(_ value: String, lasting seconds: TimeInterval) -> PreparedToken {
            PreparedToken(
                TokenResult(
                    account: "api", accessToken: value, tokenType: "Bearer",
                    expiresAt: now.addingTimeInterval(seconds), expiresIn: 0))
        }
        let read = try TokenKey.checking(scope: "read", resource: nil)
        cache.publish(token("own", lasting: 600), for: "api")
        cache.publish(token("narrow", lasting: 600), for: "api", key: read, now: now)
        #expect(cache.token(for: "api", minTTL: 0, now: now)?.result.accessToken == "own")
        #expect(cache.token(for: "api", key: .account, minTTL: 0, now: now)?.result.accessToken == "own")
        #expect(cache.token(for: "api", key: read, minTTL: 0, now: now)?.result.accessToken == "narrow")
        #expect(cache.token(for: "api", key: read, minTTL: 601, now: now) == nil)

        #expect(!cache.withdraw("other", for: "api", key: read))
        #expect(cache.withdraw("narrow", for: "api", key: read))
        #expect(cache.token(for: "api", key: read, minTTL: 0, now: now) == nil)
        #expect(cache.token(for: "api", minTTL: 0, now: now) != nil, "the account's own token stays")

        // Beyond the bound, the token expiring first goes; a new token is never the one evicted.
        for index in 0..<TokenCache.maximumNarrowedTokens {
            let key = try TokenKey.checking(scope: "s\(index)", resource: nil)
            cache.publish(token("t\(index)", lasting: 600 + Double(index)), for: "api", key: key, now: now)
        }
        let newest = try TokenKey.checking(scope: "newest", resource: nil)
        cache.publish(token("short", lasting: 60), for: "api", key: newest, now: now)
        #expect(cache.token(for: "api", key: newest, minTTL: 0, now: now) != nil)
        let first = try TokenKey.checking(scope: "s0", resource: nil)
        #expect(cache.token(for: "api", key: first, minTTL: 0, now: now) == nil)

        cache.publish(nil, for: "api")
        #expect(cache.token(for: "api", key: newest, minTTL: 0, now: now) == nil, "withdrawing the account's drops all")
    }

    /// The account's own refresh and narrowed refreshes asked for at once take turns: each
    /// presents the refresh token the one before left, and the vault ends with the last one.
    @Test(.timeLimit(.minutes(5))) func narrowedAndOwnRefreshesTakeTurnsOnTheChain() async throws {
        try await BrokerHarness.run { h in
            h.idp.setOriginalGrant(scope: "read write")
            try await h.addWithValidToken()
            let answers = h.idp.holdAnswers()
            async let read = h.broker.token(account: "api", minTTL: 30, scope: "read")
            async let own = h.broker.refreshNow(account: "api")
            async let write = h.broker.token(account: "api", minTTL: 30, scope: "write")
            async let again = h.broker.token(account: "api", minTTL: 30, scope: "read")
            try await h.openOnceJoined(answers)
            let (readToken, _, writeToken, readAgain) = try await (read, own, write, again)
            #expect(readToken.result.scope == "read" && writeToken.result.scope == "write")
            #expect(readAgain.result.accessToken == readToken.result.accessToken)

            let calls = h.idp.refreshCalls
            #expect(calls.count == 3)
            #expect(calls.map(\.refreshToken) == (["rt-0"] + h.idp.issuedRefreshTokens.dropLast()).map(Optional.some))
            #expect(h.idp.rejectedReuse == 0)
            let stored = try #require(try h.vaultCopy()?.accounts.first)
            #expect(stored.secrets.refreshToken?.text == h.idp.issuedRefreshTokens.last)
            // The account's own token is the one its own refresh brought.
            let ownCall = try #require(calls.firstIndex { $0.scope == nil })
            #expect(stored.token?.value.text == h.idp.issuedAccessTokens[ownCall])
        }
    }

    /// New tokens, a logout or a removal drop the narrowed tokens: the next request refreshes.
    @Test func newTokensDropNarrowedTokens() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()
            let first = try await h.broker.token(account: "api", minTTL: 30, scope: "read")
            let current = try #require(h.idp.issuedRefreshTokens.last)
            _ = try await h.broker.setTokens(
                account: "api", tokens: TokenSet(accessToken: "at-new", expiresIn: 3600, refreshToken: current))
            let second = try await h.broker.token(account: "api", minTTL: 30, scope: "read")
            #expect(second.result.accessToken != first.result.accessToken)
            #expect(h.idp.refreshCalls.map(\.refreshToken) == ["rt-0", current])

            _ = try await h.broker.logout(account: "api", force: true)
            await #expect(throws: BrokerError.self) {
                try await h.broker.token(account: "api", minTTL: 30, scope: "read")
            }
            #expect(h.idp.refreshCalls.count == 2)
        }
    }
}
