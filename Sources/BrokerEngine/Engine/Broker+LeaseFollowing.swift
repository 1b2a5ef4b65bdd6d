import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// What this broker does when another host takes a shared account's lease or commits it:
/// its clients wait for that host's commit instead of being served a token the IdP may revoke.
extension Broker {
    /// Acts on another broker's notification (docs/fleet.md, "Notifications"). When it takes an
    /// account's lease, its refresh may make the IdP revoke the access token held here (as
    /// django-oauth-toolkit does at each rotation): the token leaves the cache, and clients
    /// wait for that host's commit or release (`followLease`, which reads the row) instead of
    /// being served a revoked token. A commit is read and taken at once. A notification never
    /// makes this broker call the IdP or serve a token the row does not vouch for: whoever sent
    /// it, the most it costs is reads of the row.
    public func fleetNotice(_ notice: FleetNotice) async {
        guard !padlock.isLocked else { return }
        switch notice {
        case .leased(let name):
            guard isShared(name), accounts[name] != nil else { return }
            noticeOthersLease(name)
        case .released:
            // The wait sees the release in the row (`followLease`).
            break
        case .committed(let name):
            guard isShared(name), let store = fleet?.store, let row = try? await store.read(name) else {
                return
            }
            adoptCommitted(row)
        }
    }

    /// Puts the token held for `name` back in the cache, unless a refresh of it runs here or
    /// the broker is locked.
    package func republish(_ name: String) {
        guard !padlock.isLocked, let machine = accounts[name], machine.refreshSerial == nil else { return }
        republish(machine, as: name)
    }

    /// Puts `machine`'s servable token in the cache as `name`'s (none when it has none, or no
    /// guarded memory can hold its answer: a request then refreshes).
    package func republish(_ machine: AccountMachine, as name: String) {
        cache.publish(
            machine.servableToken.flatMap {
                try? PreparedToken(account: name, token: $0, dpop: machine.record.dpopSigning(http.discovery))
            }, for: name)
    }

    /// Another host took the lease on `name` (its notice, or a row read that shows it): the
    /// token held leaves the cache, and, unless a refresh here reads the row on its own,
    /// clients wait in a task of its own (`awaitLeaseEnd`) for that lease to end; a wait
    /// already running counts this lease too, within its own deadline.
    package func noticeOthersLease(_ name: String) {
        let refreshing = accounts[name]?.refreshSerial != nil
        let wait = othersLeaseWait
        try? updateShared(name) { $0.othersLease(refreshing: refreshing, wait: wait, now: clock.now()) }
    }

    /// Reads the row every 0.2 s (`pollPause`) until it has a newer version (taken), or no
    /// lease running. A lease released puts the held token back; one that lapsed does not (its
    /// holder may have rotated the credential without committing, unless the account never
    /// refreshes), and the next client's refresh takes the lease; so too when the wait runs out.
    /// A refresh under way here reads the row on its own.
    package func awaitLeaseEnd(_ name: String) async {
        var pause = Self.pollPause(after: nil)
        while let follow = fleet?.shared[name]?.following, clock.now() < follow.until, !padlock.isLocked {
            await clock.sleep(for: pause)
            guard let store = fleet?.store, let shared = fleet?.shared[name], accounts[name] != nil,
                let current = shared.following, shared.followIsCurrent
            else { return }
            let leases = current.leases
            let row: SharedRow?
            do {
                row = try await store.read(name)
            } catch {
                pause = Self.pollPause(after: nil)
                continue
            }
            guard let row else { return }
            if let known = fleet?.shared[name]?.version, row.version > known {
                adoptCommitted(row)
                return
            }
            // A lease notice that came during the read makes what it read stale.
            guard row.leaseHolder == nil, fleet?.shared[name]?.following?.leases == leases else {
                pause = Self.pollPause(after: row)
                continue
            }
            // An account that never refreshes had nothing rotated under the lapsed lease.
            if !row.leaseLapsed || accounts[name]?.refreshesOnItsOwn == false { republish(name) }
            return
        }
    }

    /// How long a broker waiting for another host's lease waits before it reads the row again:
    /// 0.2 s, or until just after the lease `row` showed runs out, if that is sooner.
    package static func pollPause(after row: SharedRow?) -> Duration {
        let poll = 0.2
        guard let left = row?.leaseRemaining, left.isFinite else { return .milliseconds(Int64(poll * 1000)) }
        return .milliseconds(Int64(min(poll, max(0.02, left + 0.02)) * 1000))
    }

    /// The wait of `name`'s clients for another host's lease (`followLease`), if one runs.
    package func leaseFollowed(_ name: String) -> Task<Void, Never>? {
        fleet?.shared[name]?.following?.task
    }
}
