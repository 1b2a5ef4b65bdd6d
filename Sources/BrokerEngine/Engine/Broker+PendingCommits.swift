import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// The changes of shared accounts the fleet's database did not take: kept in memory and in the
/// vault, and committed later until they land or the row moves on (docs/fleet.md).
extension Broker {
    /// Keeps a rotated record the store did not take: in memory and in the vault (marked
    /// `uncommitted`, so that a restart still commits it), and retries its commit until it lands
    /// or the row moves on. A vault that cannot be written leaves it in memory only.
    package func keepPending(_ record: AccountRecord, share: String?, over version: Int64) {
        let name = record.name
        logger.warning(
            "the fleet's database did not take a change; kept to commit later", metadata: ["account": "\(name)"])
        try? updateShared(name) { $0.commitFailed(keeping: record, share: share, over: version) }
    }

    /// What `retry` tries again until it is settled.
    package enum Unsettled {
        /// A refresh the store did not take (`commitPending`).
        case commit
        /// A share whose insert got no answer (`settleFleetMarks`).
        case share
    }

    /// Tries `what` of `name` again after 1 s, doubling up to every 10 s, until it is settled
    /// (one task per account).
    package func retry(_ name: String, _ what: Unsettled) {
        guard fleet?.retrying.insert(name).inserted == true else { return }
        Task {
            var delay = 1.0
            while self.isUnsettled(name, what) {
                await self.clock.sleep(for: .milliseconds(Int64(delay * 1000)))
                switch what {
                case .commit: await self.commitPending(name)
                case .share: await self.settleFleetMarks()
                }
                delay = min(delay * 2, 10)
            }
            self.fleet?.retrying.remove(name)
        }
    }

    private func isUnsettled(_ name: String, _ what: Unsettled) -> Bool {
        switch what {
        case .commit: fleet?.shared[name]?.pending != nil
        case .share: accounts[name]?.record.fleet?.step == .sharing
        }
    }

    /// Commits the refresh of `name` the store did not take, over the version it went over: when
    /// it lands, its token is served; when the row moved on, the row's state is taken. Either
    /// way its copy in the vault goes. Stays pending while the store does not answer.
    package func commitPending(_ name: String) async {
        guard let store = fleet?.store, let pending = fleet?.shared[name]?.pending else { return }
        let committed: Bool
        let share: String
        do {
            // A mark kept without its share (an older brokerd's) goes over the row's share.
            var known = pending.share
            if known == nil { known = try await store.read(name)?.share }
            guard let known else { return }
            share = known
            committed = try await store.commit(pending.record, share: share, over: pending.over)
        } catch {
            return
        }
        guard fleet?.shared[name]?.pending?.over == pending.over else { return }
        // The row that moved on, or the logout kept here committed over it (`loggedOutOver`).
        var moved: SharedRow?
        if !committed, let row = try? await store.read(name) {
            moved = await loggedOutOver(row, by: pending.record, share: share, over: pending.over) ?? row
            // A lock and a new commit kept meanwhile are not this one's to drop.
            guard fleet?.shared[name]?.pending?.over == pending.over else { return }
        }
        try? updateShared(name) { $0.pendingDropped(over: pending.over) }
        // Kept across a restart: the account is served from its row once settled.
        guard accounts[name] != nil, isShared(name) else {
            fleet?.shared[name] = nil
            await readSharedAccounts()
            return
        }
        if committed {
            logger.notice("committed a refresh the fleet's database had missed", metadata: ["account": "\(name)"])
            adoptCommitted(
                SharedRow(
                    record: pending.record, share: share, version: pending.over + 1,
                    leaseHolder: nil, lastRefreshedBy: store.host))
        } else if let moved {
            adoptCommitted(moved)
        }
    }

    /// A logout the database missed (`kept`, to go over version `version` of share `share`),
    /// over a row whose only change since is another host's `needs_login` (its refresh presented
    /// the credential the logout revoked), with no lease running. The logout stands: committed
    /// over that row, which is returned; `nil` otherwise (any other change wins).
    private func loggedOutOver(_ row: SharedRow, by kept: AccountRecord, share: String, over version: Int64) async
        -> SharedRow?
    {
        guard kept.loggedOut == true, row.record.needsLogin, row.share == share, row.version == version + 1,
            row.leaseHolder == nil, let store = fleet?.store
        else { return nil }
        var machine = AccountMachine(record: Self.unmarked(row.record), planner: planner, now: clock.now())
        _ = machine.loggedOut()
        guard (try? await store.commit(machine.record, share: row.share, over: row.version)) == true else { return nil }
        return SharedRow(
            record: machine.record, share: row.share, version: row.version + 1, leaseHolder: nil,
            lastRefreshedBy: store.host)
    }
}

extension Broker {
    /// Before the vault locks: a commit the database missed goes to the vault with its mark
    /// (saved there when it was kept, unless that save failed), and every shared account's
    /// record leaves memory with the local ones: a locked broker holds no credential. After the
    /// unlock, the next read of the store serves the shared accounts again and commits what was
    /// kept.
    package func forgetFleetAtLock() {
        guard let fleet else { return }
        // Saved when kept, or by `lock`'s last save of what is unsaved.
        let lost = fleet.pending.keys.filter(unsaved.contains)
        if !lost.isEmpty {
            logger.error(
                "locked with a fleet commit the vault could not keep; it is lost",
                metadata: ["accounts": "\(lost.count)"])
        }
        for shared in fleet.shared.values { shared.following?.task?.cancel() }
        // The retry tasks still running stop at their next turn (nothing pending); kept as
        // running, so that none is started twice beside them after the unlock.
        self.fleet = FleetMembership(store: fleet.store, leaseSeconds: fleet.leaseSeconds, retrying: fleet.retrying)
        heldForFleet = [:]
    }
}

extension Broker {
    /// Refuses an owner's change to a shared account (`unshare`, `logout`) while a refresh the
    /// database missed is not committed: the row's credential is the one that refresh consumed,
    /// and the live one is only in that pending record. Tries the commit once first.
    package func checkNothingPending(_ name: String) async throws(BrokerFailure) {
        guard fleet?.shared[name]?.pending != nil else { return }
        await commitPending(name)
        guard fleet?.shared[name]?.pending == nil else {
            throw .fleetUnavailable(reason: "the last refresh of \(name) is not in the fleet's database yet; try again")
        }
    }
}
