@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// After the wall clock jumps hours forward (suspend/resume), no expired token is served and
/// the overdue refreshes are spread over time instead of all firing at once.
@Suite struct ClockJumpTests {
    @Test func afterAJumpNothingExpiredIsServedAndOverdueRefreshesSpreadOut() async throws {
        try await BrokerHarness.run { h in
            let (broker, clock) = (h.broker, h.clock)
            // The harness's IdP serves acct-0; each other account has an IdP of its own.
            var idps = [h.idp]
            for index in 1..<20 {
                idps.append(try await OAuth2TestIdP(initialRefreshToken: "rt-\(index)", serving: .inProcess))
            }
            for (index, idp) in idps.enumerated() {
                _ = try await broker.add(
                    account: "acct-\(index)",
                    provider: ProviderSpec(
                        kind: "oauth2",
                        ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
                    tokens: TokenSet(accessToken: "at-\(index)", expiresIn: 3600, refreshToken: "rt-\(index)"))
            }
            #expect(broker.cache.token(for: "acct-0", minTTL: 30, now: clock.now()) != nil)

            clock.advance(by: 3 * 3600)
            let afterJump = clock.now()

            // Nothing past its wall-clock expiry is served, from the cache or the broker.
            for index in 0..<20 {
                #expect(broker.cache.token(for: "acct-\(index)", minTTL: 0, now: afterJump) == nil)
            }
            let onDemand = try await broker.token(account: "acct-0", minTTL: 30)
            #expect(onDemand.result.expiresAt > afterJump)
            #expect(onDemand.result.accessToken == idps[0].issuedAccessTokens.first)

            // The backlog is spread over the next seconds instead of hitting 19 IdPs at once.
            _ = await broker.runDueRefreshes()
            await broker.drain()
            let calledAtOnce = idps.dropFirst().filter { $0.callCount > 0 }.count
            #expect(calledAtOnce < 5)
            let planned = try await broker.status(account: nil).compactMap(\.nextRefreshAt)
            let backlog = planned.filter { $0 < afterJump.addingTimeInterval(BrokerSettings().overdueSpread + 1) }
            #expect(backlog.count >= 15)
            #expect(
                Set(backlog.map { Int($0.timeIntervalSince(afterJump) * 10) }).count >= 8, "refresh times are spread")

            // Stepping the clock through the spread window refreshes each account exactly once.
            var startedPerStep: [Int] = []
            for _ in 0..<Int(BrokerSettings().overdueSpread) + 2 {
                clock.advance(by: 1)
                let before = idps.reduce(0) { $0 + $1.callCount }
                _ = await broker.runDueRefreshes()
                await broker.drain()
                startedPerStep.append(idps.reduce(0) { $0 + $1.callCount } - before)
            }
            #expect(idps.allSatisfy { $0.callCount == 1 })
            #expect(idps.allSatisfy { $0.rejectedReuse == 0 })
            #expect((startedPerStep.max() ?? 0) < 19, "no single instant took the whole backlog: \(startedPerStep)")
            for index in 0..<20 {
                let token = broker.cache.token(for: "acct-\(index)", minTTL: 0, now: clock.now())
                #expect(token?.result.accessToken == idps[index].issuedAccessTokens.last)
            }
            for idp in idps.dropFirst() { await idp.shutdown() }
        }
    }
}
