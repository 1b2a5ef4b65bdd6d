@testable import BrokerEngine
import BrokerFleet
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import PostgresNIO
import Testing
import TestSupport

/// What another broker's notification of a lease makes a broker do (docs/fleet.md,
/// "Notifications"): stop serving the cached token and wait for that host's commit or release,
/// reading the row; never call the IdP itself, so a notification nobody's lease stands behind
/// (a forged one) costs no refresh, and a release the row does not show serves nothing.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetNoticeTests {
    @Test(.timeLimit(.minutes(1))) func aLeaseNoticeIsWaitedOutAndNeverCallsTheIdP() async throws {
        try await PostgresFleetStoreTests.withSharedAccount { a, b, store in
            #expect(try await b.broker.token(account: "api", minTTL: 30).result.accessToken == "at-pushed")
            let broker = b.broker

            // A notice no lease stands behind: the row is read once, and the token served again.
            await broker.fleetNotice(.leased("api"))
            let forged = Task { try await broker.token(account: "api", minTTL: 30) }
            await b.clock.sleepersReached(1)
            #expect(b.clock.asked.last == .milliseconds(200), "a wait for the row, not a refresh's pause")
            b.clock.advance(by: 0.2)
            #expect(try await forged.value.result.accessToken == "at-pushed")

            // Host c leases the account; a forged release while c holds it serves nothing. Then c
            // releases it unchanged: the held token is served again.
            let c = store("c")
            _ = try #require(try await c.takeLease("api", seconds: 90))
            await broker.fleetNotice(.leased("api"))
            let released = Task { try await broker.token(account: "api", minTTL: 30) }
            await b.clock.sleepersReached(1)
            await broker.fleetNotice(.released("api"))
            b.clock.advance(by: 0.2)
            await b.clock.sleepersReached(1)
            #expect(broker.cache.token(for: "api", minTTL: 30, now: b.clock.now()) == nil, "c holds the lease")
            await c.release("api")
            await broker.fleetNotice(.released("api"))
            b.clock.advance(by: 0.2)
            #expect(try await released.value.result.accessToken == "at-pushed")

            // Host c leases it and commits a refresh: its token is served, the wait's only reads.
            let lease = try #require(try await c.takeLease("api", seconds: 90))
            await broker.fleetNotice(.leased("api"))
            let committed = Task { try await broker.token(account: "api", minTTL: 30) }
            await b.clock.sleepersReached(1)
            var refreshed = lease.row.record
            refreshed.token?.value = SecretBytes("at-from-c")
            #expect(try await c.commit(refreshed, share: lease.row.share, over: lease.row.version))
            b.clock.advance(by: 0.2)
            #expect(try await committed.value.result.accessToken == "at-from-c")
            #expect(try await b.state().version == 2)

            // Every harness reaches the account's IdP (a's) through the in-process network.
            #expect(a.idp.refreshCalls.isEmpty, "a notice never makes a broker call the IdP")
        }
    }

    /// A lease that ran out with no commit and no release (its holder may have rotated the
    /// credential and died) puts no token back: the client's refresh takes the lease.
    @Test(.timeLimit(.minutes(1))) func aLapsedLeaseServesNoTokenAndTheClientsRefreshTakesOver() async throws {
        try await PostgresFleetStoreTests.withFleet { server, a, store in
            try await PostgresFleetStoreTests.addSharedAccount(to: a)
            let broker = a.broker

            // c's lease runs out (its end put in the past, by the database's clock).
            _ = try #require(try await store("c").takeLease("api", seconds: 90))
            await broker.fleetNotice(.leased("api"))
            let asked = Task { try await broker.token(account: "api", minTTL: 30) }
            await a.clock.sleepersReached(1)
            try await server.execute("UPDATE tokenbroker_accounts SET lease_until = now() - interval '1 second'")
            a.clock.advance(by: 0.2)
            // The client's refresh takes over the lease and calls the IdP at once: the others
            // withheld the token at the lapsed lease's notice, so no pause is owed them.
            let token = try await asked.value.result.accessToken
            #expect(!a.clock.asked.contains(.milliseconds(300)), "\(a.clock.asked)")
            #expect(token != "at-pushed", "a lapsed lease's token is not served again")
            #expect(a.idp.refreshCalls.count == 1)
            #expect(try await store("check").read("api")?.version == 2, "the refresh is committed")
        }
    }
}
