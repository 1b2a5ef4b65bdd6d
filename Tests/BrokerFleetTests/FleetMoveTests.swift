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

/// `share` and `unshare` stopped after each of their steps, as a crash would stop them, then
/// the broker started again on its vault as the crash left it, against a real PostgreSQL: the
/// account ends in exactly one usable place (the store's row or the vault, never both, never
/// neither), with its token, and another broker of the fleet agrees.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetMoveTests {
    /// A move and the step it is stopped after (`nil`: it runs to its end).
    struct Interruption: Sendable, CustomTestStringConvertible {
        let unshare: Bool
        let step: Broker.FleetMoveStep?
        var testDescription: String {
            "\(unshare ? "unshare" : "share") stopped after \(step?.rawValue ?? "nothing")"
        }
        static let all = [false, true].flatMap { unshare in
            (Broker.FleetMoveStep.allCases.map(Optional.some) + [nil]).map { Interruption(unshare: unshare, step: $0) }
        }
    }

    /// Where the account is once the restarted broker settled its marks.
    enum Place: Equatable { case shared, local }

    static let token = "at-moved-account"

    @Test(arguments: Interruption.all)
    func aMoveStoppedAfterAnyStepLeavesTheAccountInExactlyOnePlace(_ interruption: Interruption) async throws {
        try await PostgresFleetStoreTests.withFleet { _, harness, store in
            let name = try AccountName("api")
            let tokens = TokenSet(accessToken: Self.token, expiresIn: 3600)
            _ = try await harness.broker.add(
                account: "api", provider: ProviderSpec(kind: "static"), tokens: tokens, shared: interruption.unshare)
            let crash = BrokerFailure.invalid("stopped here by the test")
            let stop = { (step: Broker.FleetMoveStep) throws(BrokerFailure) in
                if step == interruption.step { throw crash }
            }
            do {
                _ =
                    interruption.unshare
                    ? try await harness.broker.unshare(name, after: stop)
                    : try await harness.broker.share(name, after: stop)
                #expect(interruption.step == nil)
            } catch {
                #expect(interruption.step != nil, "the move failed: \(error)")
            }

            // The broker started again on the vault as it is now, with a lease holder of its own.
            let restarted = try harness.restart()
            await restarted.joinFleet(store("a"), leaseSeconds: 90)
            let row = try await store("check").read("api")
            let inVault = try #require(try await restarted.vault.load()).accounts.filter { $0.name == "api" }
            let served = try #require(await restarted.snapshots().first { $0.name == name })
            let place: Place = served.shared != nil ? .shared : .local
            switch place {
            case .shared:
                #expect(row != nil, "a shared account has its row")
                #expect(inVault.isEmpty, "and no copy in the vault")
            case .local:
                #expect(row == nil, "a local account has no row")
                #expect(inVault.count == 1 && inVault.first?.fleet == nil, "and one unmarked copy in the vault")
            }
            // Where each stop leaves it: a share that marked its copy finishes (its row inserted
            // then, unless there already); an unshare that kept its copy finishes too (its row was
            // still at the version read).
            #expect(place == (interruption.unshare ? .local : .shared))
            #expect(try await restarted.token(account: "api", minTTL: 1).result.accessToken == Self.token)

            // Another broker of the fleet serves the account exactly when it is shared.
            let other = try await BrokerHarness.start()
            defer { Task { await other.stop() } }
            await other.broker.joinFleet(store("b"), leaseSeconds: 90)
            let seen = await other.broker.snapshots().contains { $0.name == name }
            #expect(seen == (place == .shared))
        }
    }

    /// Adds the local account "api" (refresh token "rt-moved") and shares it while the database
    /// is halted: the failure the share answered, left halted.
    static func shareWhileTheDatabaseIsHalted(_ server: PostgresServer, _ harness: BrokerHarness) async throws
        -> BrokerFailure?
    {
        _ = try await harness.broker.add(
            account: "api", provider: harness.provider,
            tokens: TokenSet(accessToken: Self.token, expiresIn: 3600, refreshToken: "rt-moved"))
        server.halt()
        return await #expect(throws: BrokerFailure.self) { try await harness.broker.share(AccountName("api")) }
    }

    /// A share whose insert got no answer (the database stopped): the insert may land later, so
    /// the account keeps its mark and serves its token, is not refreshed meanwhile (a refresh
    /// would consume the credential the row may hold), and is shared once the database answers.
    @Test func aShareTheDatabaseDidNotAnswerIsFinishedWhenItDoes() async throws {
        try await PostgresFleetStoreTests.withFleet { server, harness, store in
            let name = try AccountName("api")
            let unanswered = try await Self.shareWhileTheDatabaseIsHalted(server, harness)
            #expect(unanswered?.description.contains("the share completes once") == true)
            #expect(try await harness.broker.token(account: "api", minTTL: 1).result.accessToken == Self.token)
            let refused = await #expect(throws: BrokerFailure.self) { try await harness.broker.refreshNow(name) }
            #expect(refused?.description.contains("is being shared") == true, "\(String(describing: refused))")
            #expect(harness.idp.refreshCalls.isEmpty, "no refresh while the share is unsettled")
            // Nor is it changed: the row, if the insert landed, would not have the change.
            for change in ["remove", "share"] {
                let unchanged = await #expect(throws: BrokerFailure.self, "\(change)") {
                    if change == "remove" {
                        try await harness.broker.remove(name)
                    } else {
                        _ = try await harness.broker.share(name)
                    }
                }
                #expect(unchanged?.description.contains("is being shared") == true, "\(change)")
            }

            try await server.resume()
            await harness.broker.joinFleet(store("a"), leaseSeconds: 90)
            let row = try #require(try await store("check").read("api"), "the share finished")
            #expect(row.record.secrets.refreshToken?.text == "rt-moved")
            #expect(try #require(try harness.vaultCopy()).accounts.isEmpty, "no local copy left")
            let served = try #require(await harness.broker.snapshots().first { $0.name == name })
            #expect(served.shared?.version == 1)
            #expect(try await harness.broker.token(account: "api", minTTL: 1).result.accessToken == Self.token)
        }
    }

    /// A share whose insert landed with its answer lost is recognised by its share id, which
    /// commits keep: once another host committed over it, it is still finished, not left local
    /// beside the row. Once another host removed it, the copy here is dropped, not inserted again.
    @Test(arguments: ["committed", "removed"]) func aShareThatLandedUnansweredIsKnownByItsShareID(
        after change: String
    ) async throws {
        try await PostgresFleetStoreTests.withFleet { server, harness, store in
            let name = try AccountName("api")
            _ = try await Self.shareWhileTheDatabaseIsHalted(server, harness)
            try await server.resume()
            // The insert lands with its answer lost (the one given up on may reach the database
            // once it is back; if not, it is made here), and another host changes the row.
            let marked = try #require(try harness.vaultCopy()?.accounts.first)
            let share = try #require(marked.fleet?.id)
            let other = store("b")
            if try await !other.insert(marked, share: share) {
                #expect(try await other.read("api")?.share == share)
            }
            if change == "committed" {
                var unmarked = marked
                unmarked.fleet = nil
                #expect(try await other.commit(unmarked, share: share, over: 1))
            } else {
                #expect(try await other.delete("api", at: nil))
            }

            await harness.broker.joinFleet(store("a"), leaseSeconds: 90)
            #expect(try #require(try harness.vaultCopy()).accounts.isEmpty, "no local copy left")
            let served = await harness.broker.snapshots().first { $0.name == name }
            if change == "committed" {
                #expect(served?.shared?.version == 2, "served from the row")
            } else {
                #expect(served == nil, "the removed account is not served")
                #expect(try await store("check").read("api") == nil, "nor inserted again")
            }
        }
    }

    /// A share the database refused outright (it answered with an error) did not happen: the
    /// account stays local, unmarked, and is refreshed and shared as any other.
    @Test func aShareTheDatabaseRefusedLeavesTheAccountLocal() async throws {
        try await PostgresFleetStoreTests.withFleet { server, harness, store in
            let name = try AccountName("api")
            _ = try await harness.broker.add(
                account: "api", provider: harness.provider,
                tokens: TokenSet(accessToken: Self.token, expiresIn: 3600, refreshToken: "rt-0"))
            try await server.execute(
                """
                CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no'; END $$;
                CREATE TRIGGER refuse BEFORE INSERT ON tokenbroker_accounts FOR EACH ROW EXECUTE FUNCTION refuse();
                """)
            let refused = await #expect(throws: BrokerFailure.self) { try await harness.broker.share(name) }
            #expect(refused?.description.contains("SQLSTATE P0001") == true, "\(String(describing: refused))")
            #expect(try #require(try harness.vaultCopy()).accounts.first?.fleet == nil, "the vault's mark is gone")
            _ = try await harness.broker.refreshNow(name)
            #expect(harness.idp.refreshCalls.count == 1, "refreshed as a local account")

            try await server.execute("DROP TRIGGER refuse ON tokenbroker_accounts")
            _ = try await harness.broker.share(name)
            #expect(try await store("check").read("api") != nil)
        }
    }

    @Test func anUnshareStoppedBeforeItsDeleteLosesToAnotherHostsRefresh() async throws {
        try await PostgresFleetStoreTests.withFleet { _, harness, store in
            let name = try AccountName("api")
            _ = try await harness.broker.add(
                account: "api", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: Self.token, expiresIn: 3600), shared: true)
            await #expect(throws: BrokerFailure.self) {
                try await harness.broker.unshare(name) { step throws(BrokerFailure) in
                    if step == .marked { throw .invalid("stopped here by the test") }
                }
            }
            // Another host commits a newer version meanwhile (its refresh after the lease lapsed).
            let other = store("b")
            let row = try #require(try await other.read("api"))
            var newer = row.record
            newer.token?.value = SecretBytes("at-from-host-b")
            #expect(try await other.commit(newer, share: row.share, over: row.version))

            let restarted = try harness.restart()
            await restarted.joinFleet(store("a"), leaseSeconds: 90)
            let served = try #require(await restarted.snapshots().first { $0.name == name })
            #expect(served.shared?.version == 2, "the row won")
            #expect(try #require(try await restarted.vault.load()).accounts.isEmpty, "the kept copy is dropped")
            #expect(try await restarted.token(account: "api", minTTL: 1).result.accessToken == "at-from-host-b")
        }
    }
}
