import BrokerFleet
import BrokerProtocol
import Foundation
import PostgresNIO
import TestSupport
import Testing

@testable import BrokerCore

/// What another broker's notification of a lease makes a broker do (docs/fleet.md,
/// "Notifications"): stop serving the cached token and wait for that host's commit or release,
/// reading the row; never call the IdP itself, so a notification nobody's lease stands behind
/// (a forged one) costs no refresh.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetNoticeTests {
    @Test(.timeLimit(.minutes(1))) func aLeaseNoticeIsWaitedOutAndNeverCallsTheIdP() async throws {
        try await PostgresFleetStoreTests.withFleet { _, a, store in
            _ = try await a.broker.add(
                account: "api", provider: a.provider,
                tokens: TokenSet(accessToken: "at-pushed", expiresIn: 3600, refreshToken: "rt-0"), shared: true)
            let b = try await BrokerHarness.start()
            defer { Task { await b.stop() } }
            await b.broker.joinFleet(store("b"), leaseSeconds: 90)
            #expect(try await b.broker.token(account: "api", minTTL: 30).result.accessToken == "at-pushed")
            let broker = b.broker

            // A notice no lease stands behind: the row is read once, and the token served again.
            await broker.fleetNotice(.leased("api"))
            let forged = Task { try await broker.token(account: "api", minTTL: 30) }
            await b.clock.sleepersReached(1)
            #expect(b.clock.asked.last == .milliseconds(200), "a wait for the row, not a refresh's pause")
            b.clock.advance(by: 0.2)
            #expect(try await forged.value.result.accessToken == "at-pushed")

            // Host c leases the account and releases it unchanged: the held token is served again.
            let c = store("c")
            _ = try #require(try await c.takeLease("api", seconds: 90))
            await broker.fleetNotice(.leased("api"))
            let released = Task { try await broker.token(account: "api", minTTL: 30) }
            await b.clock.sleepersReached(1)
            await c.release("api")
            b.clock.advance(by: 0.2)
            #expect(try await released.value.result.accessToken == "at-pushed")

            // Host c leases it and commits a refresh: its token is served, the wait's only reads.
            let lease = try #require(try await c.takeLease("api", seconds: 90))
            await broker.fleetNotice(.leased("api"))
            let committed = Task { try await broker.token(account: "api", minTTL: 30) }
            await b.clock.sleepersReached(1)
            var refreshed = lease.row.record
            refreshed.token?.value = SecretBytes("at-from-c")
            #expect(try await c.commit(refreshed, over: lease.row.version))
            b.clock.advance(by: 0.2)
            #expect(try await committed.value.result.accessToken == "at-from-c")
            #expect(try await b.state().version == 2)

            #expect(b.idp.refreshCalls.isEmpty, "a notice never makes a broker call the IdP")
            #expect(a.idp.refreshCalls.isEmpty)
        }
    }
}
