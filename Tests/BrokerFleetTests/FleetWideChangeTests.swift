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

/// Changes to a shared account made on one broker reach the others through its row: tokens
/// pushed with `set_tokens` are committed as a new version and served everywhere, a refresh the
/// IdP denies leaves the account `needs_login` on every host, and a logout logs it out on all.
/// Rejects of the current token on two hosts at once make one refresh for the fleet.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetWideChangeTests {
    @Test func pushedTokensADenialAndALogoutAreTheWholeFleets() async throws {
        try await PostgresFleetStoreTests.withFleet { _, a, store in
            let b = try await BrokerHarness.start()
            defer { Task { await b.stop() } }
            await b.broker.joinFleet(store("b"), leaseSeconds: 90)
            try await PostgresFleetStoreTests.addSharedAccount(to: a)
            await b.broker.joinFleet(store("b"), leaseSeconds: 90)
            #expect(try await b.broker.token(account: "api", minTTL: 30).result.accessToken == "at-pushed")

            // Pushed on b: committed as version 2, served by a once told of the commit.
            _ = try await b.broker.setTokens(
                account: "api", tokens: TokenSet(accessToken: "at-set-on-b", expiresIn: 3600, refreshToken: "rt-gone"))
            #expect(try await store("check").read("api")?.version == 2)
            await a.broker.fleetNotice(.committed("api"))
            #expect(try await a.broker.token(account: "api", minTTL: 30).result.accessToken == "at-set-on-b")
            #expect(try await a.state().version == 2)

            // The IdP denies the pushed refresh token at a's refresh: the denial is the row's.
            a.clock.advance(by: 3700)
            let broker = a.broker
            let asked = Task { try await broker.token(account: "api", minTTL: 30) }
            // The lease holder gives the other brokers a moment before it calls the IdP.
            await a.clock.sleepersReached(1)
            a.clock.advance(by: 1)
            let denied = await #expect(throws: BrokerError.self) { try await asked.value }
            #expect(denied?.code == .needsLogin)
            #expect(try await store("check").read("api")?.record.needsLogin == true)
            await b.broker.fleetNotice(.committed("api"))
            #expect(try await b.state().state == "needs_login")
            #expect(a.idp.refreshCalls.count == 1, "one IdP call for the fleet")

            // Restored on b (its clock brought to a's), then logged out on a: logged out on b too.
            b.clock.advance(by: 3701)
            _ = try await b.broker.setTokens(
                account: "api", tokens: TokenSet(accessToken: "at-again", expiresIn: 3600, refreshToken: "rt-x"))
            await a.broker.fleetNotice(.committed("api"))
            #expect(try await a.state().state == "valid")
            _ = try await a.broker.logout(account: "api", force: true)
            #expect(try await store("check").read("api")?.record.loggedOut == true)
            await b.broker.fleetNotice(.committed("api"))
            #expect(try await b.state().state == "logged_out")
        }
    }

    /// A refresh under way commits over the share it leased, never over a new share of the
    /// same name (the account removed and shared again meanwhile), even once this broker has
    /// read the new row.
    @Test(.timeLimit(.minutes(1))) func aRefreshDoesNotCommitOverANewShareOfItsName() async throws {
        try await PostgresFleetStoreTests.withFleet { _, a, store in
            try await PostgresFleetStoreTests.addSharedAccount(to: a)
            let broker = a.broker
            let rejected = Task { try await broker.reject(account: "api", accessToken: "at-pushed", minTTL: 30) }
            // a holds the lease (its pause for the others' notices) when another host removes
            // the account and shares a new one under its name; a then reads the store.
            await a.clock.sleepersReached(1)
            let other = store("x")
            #expect(try await other.delete("api", at: nil))
            let replacement = PostgresFleetStoreTests.record("api")
            #expect(try await other.insert(replacement, share: SharedRecord.newShareID()))
            await broker.joinFleet(store("a"), leaseSeconds: 90)
            a.clock.advance(by: 1)
            _ = try? await rejected.value
            let row = try #require(try await store("check").read("api"))
            #expect(row.version == 1, "the new share's row is untouched")
            #expect(row.record.token?.value.text == replacement.token?.value.text)
        }
    }

    @Test(.timeLimit(.minutes(1))) func rejectsOnTwoHostsAtOnceMakeOneRefresh() async throws {
        try await PostgresFleetStoreTests.withSharedAccount { a, b, store in
            let (brokerA, brokerB) = (a.broker, b.broker)

            // a takes the lease (and pauses for the others' notices); b, rejecting meanwhile,
            // waits for a's commit instead of refreshing.
            let onA = Task { try await brokerA.reject(account: "api", accessToken: "at-pushed", minTTL: 30) }
            await a.clock.sleepersReached(1)
            let onB = Task { try await brokerB.reject(account: "api", accessToken: "at-pushed", minTTL: 30) }
            await b.clock.sleepersReached(1)
            a.clock.advance(by: 1)
            let tokenA = try await onA.value.result.accessToken
            b.clock.advance(by: 1)
            let tokenB = try await onB.value.result.accessToken
            #expect(tokenA != "at-pushed" && tokenB == tokenA, "both serve the one refresh's token")
            // Every harness reaches the account's IdP (a's) through the in-process network.
            #expect(a.idp.refreshCalls.count == 1, "one refresh for the fleet")
            #expect(try await store("check").read("api")?.version == 2)
        }
    }
}
