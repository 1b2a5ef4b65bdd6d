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

/// A shared account's refresh whose commit the database refuses (its table renamed away, a
/// real fault of PostgreSQL's): the rotated record is kept in the vault, the account is
/// `degraded` and serves no token from that refresh, and a broker restarted on that vault
/// commits it once the database takes it again; the IdP sees each refresh token once. A logout
/// the database did not take is kept and committed the same way, and a kept commit leaves
/// memory when the vault locks and lands after the unlock.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetPendingCommitTests {
    /// An hour later, a client's token starts a refresh of "api" whose commit the database
    /// refuses (its table renamed away, left so): the failure the client got.
    static func refreshWhoseCommitTheDatabaseMisses(_ server: PostgresServer, _ h: BrokerHarness) async throws
        -> BrokerError?
    {
        h.clock.advance(by: 3700)
        let answers = h.idp.holdAnswers()
        let broker = h.broker
        let asked = Task { try await broker.token(account: "api", minTTL: 30) }
        // The holder gives the other brokers a moment before it calls the IdP.
        await h.clock.sleepersReached(1)
        h.clock.advance(by: 1)
        await answers.holding(1)
        try await server.execute("ALTER TABLE tokenbroker_accounts RENAME TO tokenbroker_away")
        answers.open()
        // The commit is tried again while the lease (90 s, 3 IdP timeouts) runs, then kept.
        await h.clock.sleepersReached(1)
        h.clock.advance(by: 91)
        return await #expect(throws: BrokerError.self) { try await asked.value }
    }

    @Test func aRefreshTheDatabaseMissedIsKeptAcrossARestartAndCommittedThen() async throws {
        try await PostgresFleetStoreTests.withFleet { server, h, store in
            try await PostgresFleetStoreTests.addSharedAccount(to: h)
            let failed = try await Self.refreshWhoseCommitTheDatabaseMisses(server, h)
            #expect(failed?.code == .unavailable)
            #expect(try await h.state().state == "degraded")
            let kept = try #require(try h.vaultCopy()).accounts.first { $0.name == "api" }
            #expect(kept?.fleet?.step == .uncommitted && kept?.fleet?.version == 1)
            let issued = try #require(h.idp.issuedAccessTokens.last)
            #expect(kept?.token?.value.text == issued, "the vault keeps the refresh's record")

            // Restarted while the database still refuses: the record stays held, nothing served.
            let restarted = try h.restart()
            await restarted.joinFleet(store("a"), leaseSeconds: 90)
            #expect(await restarted.snapshots().isEmpty)
            try await server.execute("ALTER TABLE tokenbroker_away RENAME TO tokenbroker_accounts")
            // Its next read of the store (once a lease period) commits it, then serves it.
            await restarted.joinFleet(store("a"), leaseSeconds: 90)
            let row = try #require(try await store("check").read("api"))
            #expect(row.version == 2 && row.record.token?.value.text == issued)
            #expect(try await restarted.token(account: "api", minTTL: 30).result.accessToken == issued)
            #expect(try #require(try await restarted.vault.load()).accounts.isEmpty, "the kept copy is gone")
            #expect(h.idp.refreshCalls.count == 1 && h.idp.refreshCalls.allSatisfy(\.presentedCurrent))
        }
    }

    @Test func aCommitTheDatabaseMissedLeavesMemoryAtLockAndLandsAfterTheUnlock() async throws {
        try await PostgresFleetStoreTests.withFleet { server, h, store in
            try await PostgresFleetStoreTests.addSharedAccount(to: h)
            _ = try await h.broker.rekey(to: "passphrase", passphrase: "pw")
            _ = try await Self.refreshWhoseCommitTheDatabaseMisses(server, h)
            let broker = h.broker
            #expect(await broker.fleet?.pending.keys.sorted() == ["api"])

            // Locked: no record of the account left in memory; the vault keeps the commit.
            _ = try await broker.lockVault()
            #expect(await broker.fleet?.pending.isEmpty == true)
            #expect(await broker.heldForFleet.isEmpty)
            try await server.execute("ALTER TABLE tokenbroker_away RENAME TO tokenbroker_accounts")
            _ = try await broker.unlock(passphrase: "pw")
            await broker.joinFleet(store("a"), leaseSeconds: 90)
            let issued = try #require(h.idp.issuedAccessTokens.last)
            let row = try #require(try await store("check").read("api"))
            #expect(row.version == 2 && row.record.token?.value.text == issued)
            #expect(try await broker.token(account: "api", minTTL: 30).result.accessToken == issued)
            #expect(h.idp.refreshCalls.count == 1)
        }
    }

    /// Meanwhile (`denials`), another host may have refreshed with the revoked credential and
    /// committed the denial: the logout stands over it. Over a row changed twice since, it
    /// does not (something else happened there too).
    @Test(.timeLimit(.minutes(1)), arguments: [0, 1, 2])
    func aLogoutTheDatabaseMissedIsCommittedOnceItAnswers(denials: Int) async throws {
        try await PostgresFleetStoreTests.withFleet { server, h, store in
            var provider = h.provider
            provider["revocation_endpoint"] = .string(h.idp.revocationEndpoint)
            _ = try await h.broker.add(
                account: "api", provider: provider,
                tokens: TokenSet(accessToken: "at-pushed", expiresIn: 3600, refreshToken: "rt-0"), shared: true)
            let revocation = h.idp.holdRevocations()
            let broker = h.broker
            let logout = Task { try await broker.logout(account: "api", force: false) }
            await revocation.holding(1)
            try await server.execute("ALTER TABLE tokenbroker_accounts RENAME TO tokenbroker_away")
            revocation.open()
            #expect(try await logout.value.revoked)
            #expect(try await h.state().state == "degraded", "logged out here, not yet in the fleet's database")
            let kept = try #require(try h.vaultCopy()).accounts.first { $0.name == "api" }
            #expect(kept?.fleet?.step == .uncommitted && kept?.loggedOut == true, "kept to commit later")

            // Once the database answers, the next try (here the next read of the store) commits
            // it: logged out fleet-wide.
            try await server.execute("ALTER TABLE tokenbroker_away RENAME TO tokenbroker_accounts")
            let other = store("b")
            for _ in 0..<denials {
                let before = try #require(try await other.read("api"))
                var denied = before.record
                denied.needsLogin = true
                #expect(try await other.commit(denied, share: before.share, over: before.version))
            }
            await h.broker.joinFleet(store("a"), leaseSeconds: 90)
            let row = try await store("check").read("api")
            #expect(try #require(try h.vaultCopy()).accounts.isEmpty, "the kept copy is gone")
            if denials < 2 {
                #expect(row?.version == 2 + Int64(denials))
                #expect(row?.record.loggedOut == true && row?.record.secrets.refreshToken == nil)
                #expect(try await h.state().state == "logged_out")
            } else {
                #expect(row?.version == 3 && row?.record.loggedOut != true && row?.record.needsLogin == true)
                #expect(try await h.state().state == "needs_login")
            }
        }
    }
}
