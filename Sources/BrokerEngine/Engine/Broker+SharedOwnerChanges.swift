import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// An owner's changes to a shared account (new tokens, a logout), each under the account's
/// lease and committed to its row, so that every broker of the fleet shows them.
extension Broker {
    /// Replaces a shared account's tokens fleet-wide: under its lease, the row's record filled
    /// by `fill` (with no denial, logout or error) is committed as the next version, then served
    /// here; the other brokers take the commit when told of it.
    package func replaceSharedTokens(of account: AccountName, filling fill: (inout AccountRecord, Date) -> Void)
        async throws(BrokerFailure) -> AccountSnapshot
    {
        let name = account.rawValue
        guard let store = fleet?.store else { throw .noFleet }
        await takeChainTurn(name)
        defer { endChainTurn(name) }
        let lease = try await leaseForChange(name)
        let now = clock.now()
        var filled = Self.unmarked(lease.row.record)
        fill(&filled, now)
        try filled.makeDPoPKeyIfWanted()
        var fresh = AccountMachine(record: filled, planner: planner, now: now)
        _ = fresh.tokensReplaced(by: filled, planner: planner, now: now)
        let committed: Bool
        do {
            committed = try await store.commit(fresh.record, share: lease.row.share, over: lease.row.version)
        } catch {
            await store.release(name)
            throw .fleetUnavailable(reason: "\(error)")
        }
        guard committed else { throw .fleetUnavailable(reason: "\(name) changed on another host meanwhile; try again") }
        try? updateShared(name) { $0.commitLanded(over: lease.row.version, by: store.host) }
        return try replaceTokens(of: account) { record, _ in record = fresh.record }
    }
}

extension Broker {
    /// The lease a logout of `name` revokes under when it is a shared account; `nil` for a local
    /// one. Throws `fleetUnavailable` when it cannot be had.
    package func logoutLease(_ name: String) async throws(BrokerFailure) -> SharedLease? {
        guard isShared(name) else { return nil }
        try await checkNothingPending(name)
        return try await leaseForChange(name)
    }

    /// The lease of the shared account `name` for a change an owner asked for (new tokens, a
    /// logout, an unshare): refused with `fleetUnavailable` when the database does not answer
    /// or another host holds it, never waited for.
    package func leaseForChange(_ name: String) async throws(BrokerFailure) -> SharedLease {
        guard let store = fleet?.store, let seconds = fleet?.leaseSeconds else { throw .noFleet }
        let lease: SharedLease?
        do {
            lease = try await store.takeLease(name, seconds: seconds)
        } catch {
            throw .fleetUnavailable(reason: "\(error)")
        }
        guard let lease else { throw .fleetUnavailable(reason: "another host is refreshing \(name); try again") }
        return lease
    }

    /// Commits a shared account's logged-out record over `version`, so that every broker of the
    /// fleet shows it logged out; a row that moved on meanwhile is left (its credential was not
    /// the one revoked), and the lease lapses. One the database did not answer is kept and
    /// committed later, as a refresh's is (`keepPending`).
    package func commitLogout(_ record: AccountRecord, share: String, over version: Int64) async {
        guard let store = fleet?.store else { return }
        do {
            guard try await store.commit(record, share: share, over: version) else { return }
            try? updateShared(record.name) { $0.commitLanded(over: version, by: store.host) }
        } catch {
            keepPending(record, share: share, over: version)
        }
    }
}
