@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// What clients can make the broker refresh (docs/limits.md): one refresh of an account per
/// `minimum_refresh_interval` for all their requests together, narrowed refreshes within a
/// budget per caller uid, and the owner's `refresh` beyond both.
@Suite struct RefreshBudgetTests {
    /// A minimum refresh interval of a minute.
    static let minute: BrokerSettings = {
        var settings = BrokerSettings()
        settings.minimumRefreshInterval = 60
        return settings
    }()

    @Test func thirtyRejectsOfTheTokenJustServedRefreshOncePerInterval() async throws {
        try await BrokerHarness.run(settings: Self.minute) { h in
            try await h.addWithValidToken()
            var served = try await h.broker.token(account: "api", minTTL: 30).result.accessToken
            for _ in 0..<30 {
                served = try await h.broker.reject(account: "api", accessToken: served, minTTL: 30).result.accessToken
            }
            #expect(h.idp.refreshCalls.count == 1, "one refresh for 30 rejects within the interval")
            #expect(served == h.idp.issuedAccessTokens.first, "the others were answered with the current token")

            // Once the interval has passed, a reject of the current token refreshes again; one of
            // an older token gets the current one.
            h.clock.advance(by: 60)
            let renewed = try await h.broker.reject(account: "api", accessToken: served, minTTL: 30)
            #expect(h.idp.refreshCalls.count == 2)
            #expect(renewed.result.accessToken == h.idp.issuedAccessTokens.last)
            let older = try await h.broker.reject(account: "api", accessToken: served, minTTL: 30)
            #expect(older.result.accessToken == renewed.result.accessToken)
            #expect(h.idp.refreshCalls.count == 2)
        }
    }

    /// A `min_ttl` as long as the IdP's lifetime misses the cache a moment after each refresh:
    /// within the interval it gets the token held instead of another refresh.
    @Test func aTokenThatFallsShortJustAfterARefreshIsServedAsItIs() async throws {
        try await BrokerHarness.run(settings: Self.minute) { h in
            try await h.addWithValidToken()
            h.clock.advance(by: 3000)
            let first = try await h.broker.token(account: "api", minTTL: 3600)
            #expect(h.idp.refreshCalls.count == 1)
            for _ in 0..<10 {
                h.clock.advance(by: 1)
                let held = try await h.broker.token(account: "api", minTTL: 3600)
                #expect(held.result.accessToken == first.result.accessToken)
            }
            #expect(h.idp.refreshCalls.count == 1)
        }
    }

    /// Within the interval, a request that finds no valid token is answered `busy` with the
    /// time until the interval ends; past it, the request refreshes.
    @Test func noValidTokenWithinTheIntervalIsBusy() async throws {
        try await BrokerHarness.run(settings: Self.minute) { h in
            try await h.addWithValidToken()
            h.idp.setLifetime(10)
            _ = try await h.broker.reject(account: "api", accessToken: "at-pushed", minTTL: 0)
            #expect(h.idp.refreshCalls.count == 1)
            h.clock.advance(by: 20)
            let busy = await #expect(throws: BrokerError.self) { try await h.broker.token(account: "api", minTTL: 0) }
            #expect(busy?.code == .busy)
            #expect(busy?.retryAfterMs == 40_000)
            #expect(h.idp.refreshCalls.count == 1)

            h.clock.advance(by: 40)
            let renewed = try await h.broker.token(account: "api", minTTL: 0)
            #expect(renewed.result.accessToken == h.idp.issuedAccessTokens.last)
            #expect(h.idp.refreshCalls.count == 2)
        }
    }

    /// Refreshes the broker makes on its own (an account added with only a refresh token, the
    /// schedule) and the owner's `refresh` leave a client's first reject its refresh; the
    /// owner's `refresh` is never held off.
    @Test func theOwnersAndTheBrokersOwnRefreshesAreNotLimited() async throws {
        try await BrokerHarness.run(settings: Self.minute) { h in
            _ = try await h.broker.add(account: "api", provider: h.provider, tokens: TokenSet(refreshToken: "rt-0"))
            let first = try await h.broker.token(account: "api", minTTL: 30)
            #expect(h.idp.refreshCalls.count == 1)
            for _ in 0..<3 { _ = try await h.broker.refreshNow(account: "api") }
            #expect(h.idp.refreshCalls.count == 4, "every refresh the owner asked for was made")
            let current = try await h.broker.token(account: "api", minTTL: 30)
            #expect(current.result.accessToken != first.result.accessToken)

            let renewed = try await h.broker.reject(account: "api", accessToken: current.result.accessToken, minTTL: 30)
            #expect(h.idp.refreshCalls.count == 5, "a reject after refreshes the broker made itself refreshes")
            _ = try await h.broker.reject(account: "api", accessToken: renewed.result.accessToken, minTTL: 30)
            #expect(h.idp.refreshCalls.count == 5)
            _ = try await h.broker.refreshNow(account: "api")
            #expect(h.idp.refreshCalls.count == 6, "the owner's refresh within the interval too")
        }
    }

    /// New tokens pushed by a person start over: a reject of them refreshes at once.
    @Test func newTokensLiftTheInterval() async throws {
        try await BrokerHarness.run(settings: Self.minute) { h in
            try await h.addWithValidToken()
            _ = try await h.broker.reject(account: "api", accessToken: "at-pushed", minTTL: 30)
            let current = try #require(h.idp.issuedRefreshTokens.last)
            _ = try await h.broker.setTokens(
                account: "api", tokens: TokenSet(accessToken: "at-new", expiresIn: 3600, refreshToken: current))
            let renewed = try await h.broker.reject(account: "api", accessToken: "at-new", minTTL: 30)
            #expect(h.idp.refreshCalls.count == 2)
            #expect(renewed.result.accessToken == h.idp.issuedAccessTokens.last)
        }
    }

    /// 200 new scopes from one caller: its budget's burst is refreshed, the rest answered
    /// `busy` at once; another uid has a budget of its own, and a spent one comes back with time.
    @Test func twoHundredNewScopesFromOneCallerRefreshWithinItsBudget() async throws {
        try await BrokerHarness.run(settings: Self.minute) { h in
            try await h.addWithValidToken()
            let burst = NarrowedRefreshBudget.burst
            var refused: [BrokerError] = []
            for index in 0..<200 {
                do throws(BrokerError) {
                    _ = try await h.broker.token(account: "api", minTTL: 30, scope: "s\(index)", caller: 1000)
                } catch {
                    refused.append(error)
                }
            }
            #expect(h.idp.refreshCalls.count == burst)
            #expect(burst < TokenCache.maximumNarrowedTokens)
            #expect(refused.count == 200 - burst)
            #expect(refused.allSatisfy { $0.code == .busy && $0.retryAfterMs == 6000 })

            // A key already fetched is served from the cache, whatever the budget.
            _ = try await h.broker.token(account: "api", minTTL: 30, scope: "s0", caller: 1000)
            #expect(h.idp.refreshCalls.count == burst)
            _ = try await h.broker.token(account: "api", minTTL: 30, scope: "s0 other", caller: 1001)
            #expect(h.idp.refreshCalls.count == burst + 1, "another uid spends its own budget")
            h.clock.advance(by: NarrowedRefreshBudget.refill)
            _ = try await h.broker.token(account: "api", minTTL: 30, scope: "s199", caller: 1000)
            #expect(h.idp.refreshCalls.count == burst + 2, "one refresh back after the refill time")
            await #expect(throws: BrokerError.self) {
                try await h.broker.token(account: "api", minTTL: 30, scope: "s198", caller: 1000)
            }
            #expect(h.idp.refreshCalls.count == burst + 2)
        }
    }

    /// Rejects of a narrowed token draw on the same budget: a loop of them ends in `busy`.
    @Test func rejectsOfANarrowedTokenDrawOnTheBudget() async throws {
        try await BrokerHarness.run(settings: Self.minute) { h in
            try await h.addWithValidToken()
            var served = try await h.broker.token(account: "api", minTTL: 30, scope: "read", caller: 1000)
            var refusals = 0
            for _ in 0..<30 {
                do throws(BrokerError) {
                    served = try await h.broker.reject(
                        account: "api", accessToken: served.result.accessToken, minTTL: 30, scope: "read",
                        caller: 1000)
                } catch {
                    #expect(error.code == .busy)
                    refusals += 1
                }
            }
            #expect(h.idp.refreshCalls.count == NarrowedRefreshBudget.burst)
            #expect(refusals == 30 - (NarrowedRefreshBudget.burst - 1))
            // The refused rejects left the key's token in place.
            let cached = try await h.broker.token(account: "api", minTTL: 30, scope: "read", caller: 1000)
            #expect(cached.result.accessToken == served.result.accessToken)
        }
    }

    @Test func aBucketRefillsAtItsRateAndNoFurther() {
        var budget = NarrowedRefreshBudget()
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        for _ in 0..<NarrowedRefreshBudget.burst { #expect(budget.take(account: "a", uid: 1, now: start) == nil) }
        #expect(budget.take(account: "a", uid: 1, now: start) == NarrowedRefreshBudget.refill)
        #expect(budget.take(account: "b", uid: 1, now: start) == nil, "each account has its own")
        #expect(budget.take(account: "a", uid: 1, now: start.addingTimeInterval(3)) == NarrowedRefreshBudget.refill / 2)
        // A clock set back gives nothing back and locks nothing.
        #expect(
            budget.take(account: "a", uid: 1, now: start.addingTimeInterval(-3600)) == NarrowedRefreshBudget.refill / 2)
        let later = start.addingTimeInterval(-3600 + 100 * NarrowedRefreshBudget.refill)
        for _ in 0..<NarrowedRefreshBudget.burst { #expect(budget.take(account: "a", uid: 1, now: later) == nil) }
        #expect(budget.take(account: "a", uid: 1, now: later) != nil, "a long pause refills to the burst, no more")
    }
}
