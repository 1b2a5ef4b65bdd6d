import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// One shared account's place in the fleet as a value (docs/fleet.md): the row's share and
/// version this broker holds and who committed it, this host's lease, a commit the database
/// missed, the wait for another host's lease, and what the vault keeps for the account.
///
/// Like `AccountMachine`, every transition is a mutating function that returns the effects the
/// engine runs, in order; the machine does no I/O, reads no clock and starts no task. The
/// account's record and phase stay in its `AccountMachine`: this value holds only what the
/// row and the lease add to them.
package struct FleetAccountMachine: Sendable {
    /// What the engine does after a transition, in the order given.
    package enum Effect: Equatable, Sendable {
        /// Write what the vault keeps for the account (`vaultCopy`, nothing when `nil`) by the
        /// engine's one save, whose failure is retried as any save's.
        case persist
        /// Serve no cached token of the account: a lease's refresh may make the IdP revoke it.
        case withdraw
        /// Start waiting for another host's lease to end (`following`).
        case followLease
        /// Try the commit the database missed again later (`pending`).
        case retryCommit
        /// Drop this value: the account is no longer shared here. Its account leaves the engine
        /// first, or becomes local, so that a `persist` after it writes what the vault keeps then.
        case forget
    }

    /// A change the database did not take (a refresh the IdP answered, a logout): its record,
    /// the share and the version it goes over. A mark kept by an older brokerd has no share.
    package struct PendingCommit: Sendable, Equatable {
        package let record: AccountRecord
        package let share: String?
        package let over: Int64
    }

    /// The wait of the account's clients for another host's lease to end.
    package struct LeaseFollow: Sendable, Equatable {
        /// The lease notices of the account since the wait began.
        package var leases = 1
        /// The row's version held at the last lease notice: a newer one taken meanwhile (a
        /// commit's) ends the wait.
        package var version: Int64
        /// When the wait gives up, counted from the first lease notice, so that a stream of
        /// notices cannot hold clients.
        package let until: Date
        /// The task that waits (`Broker.awaitLeaseEnd`), which clients wait for too.
        package var task: Task<Void, Never>?
    }

    /// The share of the row held (`SharedRow.share`): a row of another share under the same
    /// name is another account. `nil` only for a commit an older brokerd kept without it.
    private(set) var share: String?
    /// The row's version held.
    private(set) var version: Int64
    /// The host that committed that version.
    private(set) var committedBy: String?
    /// Whether the account is served from its row here; `false` while only a commit the vault
    /// kept across a restart is known of it (served from its row once that commit is settled).
    package let served: Bool
    /// When this host's lease ends, while it holds one (its refresh or change under way).
    private(set) var leaseUntil: Date?
    /// A change the database missed: also in the vault (`vaultCopy`) and retried until it
    /// lands or the row moves on. The account is `degraded` meanwhile.
    private(set) var pending: PendingCommit?
    /// The wait for another host's lease, while one runs.
    private(set) var following: LeaseFollow?
    /// The row's record an unshare under way keeps in the vault (marked) before deleting the row.
    private(set) var unsharing: AccountRecord?

    /// The fleet side of an account served from its row at `version` of `share`, or just put in
    /// the store by this host.
    package init(share: String, version: Int64, committedBy: String?) {
        self.share = share
        self.version = version
        self.committedBy = committedBy
        served = true
    }

    /// The fleet side of a commit the vault kept across a restart (`FleetMark.Step.uncommitted`),
    /// before the account is served: retried at once (`retryCommit`).
    package init(keptCommit record: AccountRecord, mark: FleetMark) {
        var unmarked = record
        unmarked.fleet = nil
        share = mark.id
        version = mark.version
        served = false
        pending = PendingCommit(record: unmarked, share: mark.id, over: mark.version)
    }

    // MARK: Questions

    /// Whether this host holds the account's lease now.
    package var holdsLease: Bool { leaseUntil != nil }

    /// Whether a commit that got no answer may be tried again `pause` seconds after `now`
    /// within this host's lease.
    package func mayRetryCommit(after pause: TimeInterval, now: Date) -> Bool {
        guard let leaseUntil else { return false }
        return now.addingTimeInterval(pause) < leaseUntil
    }

    /// What the vault keeps for the account: the row's record an unshare moves out, or the
    /// commit the database missed (marked, so that a restart commits it); `nil`: nothing, the
    /// account's state is its row.
    package var vaultCopy: AccountRecord? {
        if let unsharing { return unsharing }
        guard let pending else { return nil }
        var marked = pending.record
        marked.fleet = FleetMark(step: .uncommitted, version: pending.over, id: pending.share)
        return marked
    }

    // MARK: The lease

    /// This host took the account's lease, until `until`: no token is served here until its
    /// commit (the IdP may revoke the one held when it rotates).
    package mutating func leaseTaken(until: Date) -> [Effect] {
        leaseUntil = until
        return [.withdraw]
    }

    /// This host's lease ended without a commit of its own: released after a refresh that
    /// changed nothing, or lapsed. The row's state is still the one held.
    package mutating func leaseLost() -> [Effect] {
        leaseUntil = nil
        return []
    }

    /// Another host took the account's lease (its notice, or a row read that shows one running
    /// or run out), while `refreshing` here or not: the token held leaves the cache, and, unless
    /// a refresh here reads the row on its own, clients wait for that lease to end, at most
    /// `wait` seconds from `now`. A wait already running counts this lease too, within its own
    /// deadline.
    package mutating func othersLease(refreshing: Bool, wait: TimeInterval, now: Date) -> [Effect] {
        guard !refreshing else { return [.withdraw] }
        if following != nil {
            following?.leases += 1
            following?.version = version
            return [.withdraw]
        }
        following = LeaseFollow(version: version, until: now.addingTimeInterval(wait))
        return [.withdraw, .followLease]
    }

    /// The engine started `task` to wait for another host's lease (`followLease`).
    package mutating func followStarted(_ task: Task<Void, Never>) {
        following?.task = task
    }

    /// The wait for another host's lease is over (the row read moved on, or showed no lease,
    /// or the wait ran out); what it then serves is the engine's to judge from the row.
    package mutating func followEnded() {
        following = nil
    }

    /// Whether the wait still watches the version held: a commit taken since the last lease
    /// notice answered it.
    package var followIsCurrent: Bool { following?.version == version }

    // MARK: Commits

    /// This host's commit over `over` landed: the row is at the next version, committed by
    /// `host`, and the lease (ended by the commit) is no longer held, even one that lapsed
    /// before the commit reached the database (its compare and swap found no newer row).
    package mutating func commitLanded(over: Int64, by host: String) -> [Effect] {
        take(version: over + 1, by: host)
        leaseUntil = nil
        return []
    }

    /// The database did not take `record` over `over` of `share` (no answer): kept here and in
    /// the vault, and committed later until it lands or the row moves on. The lease is given up.
    package mutating func commitFailed(keeping record: AccountRecord, share: String?, over: Int64) -> [Effect] {
        pending = PendingCommit(record: record, share: share, over: over)
        leaseUntil = nil
        return [.persist, .retryCommit]
    }

    /// The commit kept for `over` is settled without landing: the row moved on past it (its
    /// state is taken instead), or no row will take it. It leaves the vault.
    package mutating func pendingDropped(over: Int64) -> [Effect] {
        guard pending?.over == over else { return [] }
        pending = nil
        return [.persist]
    }

    // MARK: The row

    /// The row read is at `version` of `share`, committed by `host`: taken when it is newer than
    /// the version held, of the same share, with no commit of this host pending over the older
    /// one (that commit settles first). `false`: nothing taken, as for a row rolled back.
    package mutating func rowMovedOn(share: String, version: Int64, by host: String?) -> Bool {
        guard share == self.share, version > self.version, pending == nil else { return false }
        take(version: version, by: host)
        return true
    }

    /// The row this refresh read moved on to `version` of its share, committed by `host`: taken
    /// whatever a commit pending here says, since the refresh goes on from it. `false` for a row
    /// of another share, or not newer.
    package mutating func rowReadInRefresh(share: String, version: Int64, by host: String?) -> Bool {
        guard share == self.share, version > self.version else { return false }
        take(version: version, by: host)
        return true
    }

    // MARK: Leaving the fleet

    /// An unshare here keeps `record`, read at `version`, in the vault (marked) before the row
    /// is deleted.
    package mutating func unsharing(_ record: AccountRecord, at version: Int64) -> [Effect] {
        var marked = record
        marked.fleet = FleetMark(step: .unsharing, version: version)
        unsharing = marked
        return [.persist]
    }

    /// The unshare under way did not delete the row (the database refused, or the row moved
    /// on): its copy leaves the vault, and the account stays shared.
    package mutating func unsharingAbandoned() -> [Effect] {
        unsharing = nil
        return [.persist]
    }

    /// This host moved the account out of the store (its row deleted at the version its
    /// unshare kept): no longer shared here. The vault's copy is replaced by the local account,
    /// which the engine serves and saves.
    package mutating func unshared() -> [Effect] {
        unsharing = nil
        following = nil
        return [.forget]
    }

    /// The row is gone (removed here or on another host, or unshared on another host), or
    /// replaced by another share of its name. While a refresh of it runs here (`refreshing`),
    /// nothing changes: the refresh reads the row on its own, and the next
    /// read of the store after it drops the account. Otherwise the account is no longer shared
    /// here, and a commit kept for it leaves the vault, since no row will take it.
    package mutating func removed(refreshing: Bool) -> [Effect] {
        guard !refreshing else { return [] }
        let kept = vaultCopy != nil
        pending = nil
        unsharing = nil
        following = nil
        return [.forget] + (kept ? [.persist] : [])
    }

    /// Takes the row's `version`, committed by `host`.
    private mutating func take(version: Int64, by host: String?) {
        self.version = version
        committedBy = host
    }
}
