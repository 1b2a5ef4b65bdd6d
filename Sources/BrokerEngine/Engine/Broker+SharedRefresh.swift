import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// A shared account's refresh (docs/fleet.md, "One refresher"): under the account's lease, from
/// the row's credential, and committed to the row before any token from it is served.
extension Broker {
    /// How long a lease holder waits before it calls the IdP, so that the other brokers have
    /// stopped serving the access token the IdP may revoke (the test of three hosts under load
    /// saw notifications handled up to 0.19 s after the lease was taken).
    package static let noticeGrace: Duration = .milliseconds(300)

    /// What a shared account's refresh found before calling the IdP.
    package enum SharedTurn {
        /// The refresh is over: another host's commit, read from the row, served it.
        case finished(Result<Void, BrokerFailure>)
        /// The lease is this host's (until `FleetAccountMachine.leaseUntil`): refresh from the
        /// row's record, then commit over its version.
        case leased(SharedRow)
        /// No lease could be had (the database does not answer, or another host keeps the lease).
        case failed(RefreshFailure)
    }

    /// Before a shared account's refresh calls the IdP: reads the row (another host may have
    /// refreshed it already, and then its token is served), then takes the lease, waiting for
    /// another holder's commit or the end of its lease, at most one lease and one IdP timeout.
    /// Under the lease the row is read again; the IdP is called only while the lease has more
    /// than an IdP timeout left. `serial` is the account's own refresh; `nil` for a scoped
    /// token's, which a newer row never ends (it is taken, and the refresh goes on from it).
    package func takeSharedTurn(_ name: String, serial: Int?) async -> SharedTurn {
        guard let fleet else { return .finished(.failure(.noSuchAccount(AccountName(known: name)))) }
        // Another holder is waited for (`othersLeaseWait`); then the refresh fails as an outage
        // does, and its backoff tries again.
        let deadline = clock.now().addingTimeInterval(othersLeaseWait)
        var lastRead: SharedRow?
        while true {
            do {
                if self.fleet?.shared[name]?.pending != nil {
                    await commitPending(name)
                    guard self.fleet?.shared[name]?.pending == nil else {
                        return .failed(.transient("the fleet's database has not taken the last refresh yet"))
                    }
                }
                guard let row = try await fleet.store.read(name) else {
                    return .failed(.transient("the shared account is gone from the fleet's database"))
                }
                lastRead = row
                // A row of another share is another account (removed and shared again): the
                // next read of the store serves it in place of this one.
                guard row.share == self.fleet?.shared[name]?.share else {
                    return .finished(.failure(.changedDuringRefresh(AccountName(known: name))))
                }
                if let done = adopt(row, serial: serial) { return .finished(done) }
                if let lease = try await fleet.store.takeLease(name, seconds: fleet.leaseSeconds) {
                    guard lease.row.share == self.fleet?.shared[name]?.share else {
                        await fleet.store.release(name)
                        return .finished(.failure(.changedDuringRefresh(AccountName(known: name))))
                    }
                    // Taking over a lease that ran out (as the database saw it when this one
                    // was taken): the other brokers stopped serving the token at its notice and
                    // did not put it back, so no pause is owed them.
                    let pause = lease.replacedLapsed ? .zero : Self.noticeGrace
                    if let done = adopt(lease.row, serial: serial) {
                        await fleet.store.release(name)
                        return .finished(done)
                    }
                    // The IdP is called after the pause for the others' notices, and has its
                    // timeout to answer: both within the lease.
                    let needed = Duration.milliseconds(Int64(settings.requestTimeout * 1000)) + pause
                    guard lease.remaining > needed else {
                        await fleet.store.release(name)
                        return .failed(.transient("the fleet lease is shorter than an IdP call"))
                    }
                    let leaseEnd = clock.now().addingTimeInterval(Double(lease.remaining.components.seconds))
                    // The IdP may revoke the access token held when it rotates (docs/fleet.md,
                    // "Notifications"): clients here wait for the commit from now on, and the
                    // other brokers, told of the lease, get a moment to do the same.
                    try? updateShared(name) { $0.leaseTaken(until: leaseEnd) }
                    if pause > .zero { await clock.sleep(for: pause) }
                    return .leased(lease.row)
                }
            } catch {
                return .failed(.transient("the fleet's database: \(error)"))
            }
            // Another host holds the lease: its refresh may revoke the token held (a notification
            // of its lease may have been lost), so none is served until its commit.
            let wait = othersLeaseWait
            try? updateShared(name) { $0.othersLease(refreshing: true, wait: wait, now: clock.now()) }
            guard clock.now() < deadline else {
                return .failed(.transient("another host holds the fleet lease and has not committed"))
            }
            await clock.sleep(for: Self.pollPause(after: lastRead))
            guard let machine = accounts[name], serial == nil || machine.refreshSerial == serial else {
                return .finished(.failure(.changedDuringRefresh(AccountName(known: name))))
            }
        }
    }

    /// Takes `row` when it is newer than the version held; returns the refresh's result when
    /// that ends it (the row's token needs no refresh yet), `nil` when the refresh goes on.
    private func adopt(_ row: SharedRow, serial: Int?) -> Result<Void, BrokerFailure>? {
        let name = row.record.name
        guard let serial else {
            adoptCommitted(row)
            return nil
        }
        guard var shared = fleet?.shared[name],
            shared.rowReadInRefresh(share: row.share, version: row.version, by: row.lastRefreshedBy)
        else { return nil }
        fleet?.shared[name] = shared
        guard
            let (finished, effects) = accounts[name]?.sharedRowRead(
                Self.unmarked(row.record), serial: serial, planner: planner, now: clock.now())
        else { return .failure(.changedDuringRefresh(AccountName(known: name))) }
        try? run(effects, for: name)
        guard finished else { return nil }
        logger.info(
            "refreshed by another host",
            metadata: ["account": "\(name)", "version": "\(row.version)", "host": "\(row.lastRefreshedBy ?? "-")"])
        return .success(())
    }

    /// Commits what the IdP gave refresh `serial` of a shared account as the version after
    /// `version`, and only then serves it. When the refresh was overtaken here (new tokens, a
    /// removal), the row still gets the rotated credential, so that it never keeps the one this
    /// refresh consumed. A commit the database does not take is tried again every 0.5 s while
    /// the lease runs, then kept for the next refresh, the old token served meanwhile. A row
    /// another host moved on is taken instead.
    package func commitShared(
        _ name: String, serial: Int, started: AccountRecord, grant: Grant, share: String, over version: Int64,
        idp: Duration
    ) async -> Result<Void, BrokerFailure> {
        guard let store = fleet?.store else { return .failure(.changedDuringRefresh(AccountName(known: name))) }
        var machine = accounts[name]
        var effects: [AccountMachine.Effect] = []
        var record = started
        if case .applied(let applied)? = machine?.refreshSucceeded(
            serial: serial, presented: started.secrets, grant: grant, planner: planner, now: clock.now()),
            let refreshed = machine
        {
            effects = applied
            record = refreshed.record
        } else {
            machine = nil
            record = Self.rotating(started, by: grant)
            record.token = grant.token
        }
        let (committed, failure) = await commitWithinLease(record, share: share, over: version)
        guard let committed else {
            keepPending(record, share: share, over: version)
            let reason = "the fleet's database did not take the refresh: \(failure)"
            return finishRefresh(name, serial: serial, started: started, outcome: .failure(.transient(reason)))
        }
        guard committed else {
            if let row = try? await store.read(name), let done = adopt(row, serial: serial) { return done }
            let reason = "another host committed the account first"
            return finishRefresh(name, serial: serial, started: started, outcome: .failure(.transient(reason)))
        }
        try? updateShared(name) { $0.commitLanded(over: version, by: store.host) }
        guard let machine, accounts[name]?.refreshSerial == serial else {
            return .failure(.changedDuringRefresh(AccountName(known: name)))
        }
        accounts[name] = machine
        try? run(effects.filter { $0 != .persist }, for: name)
        logger.info(
            "refreshed",
            metadata: [
                "account": "\(name)", "version": "\(version + 1)", "idp_us": "\(Self.microseconds(idp))",
            ])
        return .success(())
    }
}

extension Broker {
    /// Commits `record` over `version` under this host's lease, trying again every 0.5 s while
    /// the lease runs: whether the row took it (`false`: it moved on or is gone), or `nil` and
    /// the database's last error when it never answered.
    package func commitWithinLease(_ record: AccountRecord, share: String, over version: Int64) async -> (
        committed: Bool?, failure: String
    ) {
        guard let store = fleet?.store else { return (false, "") }
        var failure = ""
        while true {
            do {
                return (try await store.commit(record, share: share, over: version), "")
            } catch {
                failure = "\(error)"
                guard fleet?.shared[record.name]?.mayRetryCommit(after: 0.5, now: clock.now()) == true else {
                    return (nil, failure)
                }
                await clock.sleep(for: .milliseconds(500))
            }
        }
    }

    /// `record` with the credential `grant` rotated, if it did.
    package static func rotating(_ record: AccountRecord, by grant: Grant) -> AccountRecord {
        var record = record
        if let rotated = grant.refreshToken {
            record.secrets.refreshToken = rotated
            record.secrets.refreshExpiresAt = grant.refreshExpiresAt
        }
        if let rotated = grant.refreshURL { record.secrets.refreshURL = rotated }
        return record
    }
}

extension Broker {
    /// Ends the lease of a refresh the IdP did not grant: a denial is the row's from now on
    /// (committed, so every broker of the fleet shows `needs_login`); any other failure changes
    /// nothing (the lease is released, and its holder's backoff tries again).
    package func settleLease(
        _ name: String, after outcome: Result<Grant, RefreshFailure>, share: String, over version: Int64
    ) async {
        guard let store = fleet?.store else { return }
        if case .failure(let failure) = outcome, failure.kind == .denial, let denied = accounts[name]?.record,
            denied.needsLogin, (try? await store.commit(denied, share: share, over: version)) == true
        {
            try? updateShared(name) { $0.commitLanded(over: version, by: store.host) }
            return
        }
        await store.release(name)
    }
}
