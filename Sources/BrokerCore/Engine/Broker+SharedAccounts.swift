import BrokerProtocol
import FoundationEssentials
import Logging

/// The fleet's shared accounts in the engine (docs/fleet.md): served from the shared store's
/// rows, refreshed by one host at a time under the account's lease, and each rotation committed
/// to the store (compare and swap on the row's version) before any token from it is served.
extension Broker {
    /// The shared store and what this broker knows of its rows.
    struct FleetMembership {
        let store: any SharedAccountStore
        let leaseSeconds: Double
        /// Each shared account's place in the fleet, by name; also a commit the vault kept
        /// across a restart, before its account is served (`FleetAccountMachine.served`).
        var shared: [String: FleetAccountMachine] = [:]
        /// The accounts whose pending commit or unsettled share a task retries now (`retry`).
        var retrying: Set<String> = []

        /// The changes the database missed, by account.
        var pending: [String: FleetAccountMachine.PendingCommit] { shared.compactMapValues(\.pending) }
    }

    /// Whether `name` is a shared account served here from its row.
    func isShared(_ name: String) -> Bool {
        fleet?.shared[name]?.served == true
    }

    /// Applies `transition` to the fleet side of `name`, if it has one, then runs the effects
    /// it returns; a failed save stops the rest and is thrown.
    func updateShared(
        _ name: String, _ transition: (inout FleetAccountMachine) -> [FleetAccountMachine.Effect]
    ) throws(BrokerFailure) {
        guard var machine = fleet?.shared[name] else { return }
        let effects = transition(&machine)
        fleet?.shared[name] = machine
        try run(effects, forShared: name)
    }

    /// Runs a fleet transition's effects in order; a failed save stops the rest and is thrown
    /// (it is tried again as any failed save is, `retryFailedSave`).
    func run(_ effects: [FleetAccountMachine.Effect], forShared name: String) throws(BrokerFailure) {
        for effect in effects {
            switch effect {
            case .persist:
                try persist(changing: [name])
            case .withdraw:
                cache.publish(nil, for: name)
            case .followLease:
                let task = Task {
                    await self.awaitLeaseEnd(name)
                    self.fleet?.shared[name]?.followEnded()
                }
                fleet?.shared[name]?.followStarted(task)
            case .retryCommit:
                retry(name, .commit)
            case .forget:
                fleet?.shared[name] = nil
            }
        }
    }

    /// How long a refresh here, and clients, wait for another host's lease: 3 IdP timeouts (or
    /// the lease, if shorter) and one more.
    var othersLeaseWait: TimeInterval {
        min(fleet?.leaseSeconds ?? 0, 3 * settings.requestTimeout) + settings.requestTimeout
    }

    /// How long a lease holder waits before it calls the IdP, so that the other brokers have
    /// stopped serving the access token the IdP may revoke (the test of three hosts under load
    /// saw notifications handled up to 0.19 s after the lease was taken).
    static let noticeGrace: Duration = .milliseconds(300)

    /// What a shared account's refresh found before calling the IdP.
    enum SharedTurn {
        /// The refresh is over: another host's commit, read from the row, served it.
        case finished(Result<Void, BrokerFailure>)
        /// The lease is this host's (until `FleetAccountMachine.leaseUntil`): refresh from the
        /// row's record, then commit over its version.
        case leased(SharedRow)
        /// No lease could be had (the database does not answer, or another host keeps the lease).
        case failed(RefreshFailure)
    }

    /// Joins the fleet, or once joined reads it again: serves every shared account `store`
    /// holds that this broker does not serve yet (a refused row is logged by name and left out),
    /// each refreshed under a lease of `leaseSeconds`.
    public func joinFleet(_ store: any SharedAccountStore, leaseSeconds: Double) async {
        if fleet == nil { fleet = FleetMembership(store: store, leaseSeconds: leaseSeconds) }
        await readSharedAccounts()
        await settleFleetMarks()
    }

    /// What `status` shows of `name` when it is a shared account.
    func sharedStatus(of name: String) -> SharedAccountStatus? {
        guard let fleet, let shared = fleet.shared[name], shared.served else { return nil }
        return SharedAccountStatus(
            version: shared.version, lastRefreshedBy: shared.committedBy,
            leaseHolder: shared.holdsLease ? fleet.store.host : nil)
    }

    /// Reads every row and serves the shared accounts this broker does not hold yet.
    func readSharedAccounts() async {
        guard let store = fleet?.store, !padlock.isLocked else { return }
        let readings: [SharedReading]
        do {
            readings = try await store.readAll()
        } catch {
            logger.warning("cannot read the shared accounts", metadata: ["reason": "\(error)"])
            return
        }
        guard !padlock.isLocked else { return }
        let now = clock.now()
        // Rows gone (removed or unshared on another host): no longer served here.
        let present = Set(
            readings.map { reading in
                switch reading {
                case .row(let row): row.record.name
                case .refused(let name, _): name
                }
            })
        for (name, shared) in fleet?.shared ?? [:] where shared.served && !present.contains(name) {
            dropShared(name, "shared account removed by another host", now: now)
        }
        for reading in readings {
            switch reading {
            case .refused(let name, let reason):
                logger.error(
                    "shared account refused",
                    metadata: ["account": "\(JSONText.quote(String(name.prefix(128))))", "reason": "\(reason)"])
            case .row(let row):
                let name = row.record.name
                guard (try? AccountName(name)) != nil else { continue }
                if let known = fleet?.shared[name], known.served, known.share != row.share {
                    // Removed and shared again between two reads: another account of that name.
                    dropShared(name, "shared account replaced by a new share of that name", now: now)
                }
                if let shared = fleet?.shared[name], shared.served, accounts[name] != nil {
                    adoptCommitted(row)
                    // Another host's lease, or one run out, whose notice this broker missed.
                    let othersLease = row.leaseHolder != nil && !shared.holdsLease
                    if othersLease || row.leaseLapsed, accounts[name]?.refreshSerial == nil,
                        fleet?.shared[name]?.following == nil
                    {
                        noticeOthersLease(name)
                    }
                    continue
                }
                // A record the vault keeps for the fleet is settled first (`settleFleetMarks`).
                guard heldForFleet[name] == nil, fleet?.shared[name]?.pending == nil else { continue }
                guard accounts[name] == nil else {
                    // A local record marked for a share is settled next (`settleFleetMarks`).
                    if accounts[name]?.record.fleet == nil {
                        logger.warning(
                            "a local account has the name of a shared one; the local one is served",
                            metadata: ["account": "\(name)"])
                    }
                    continue
                }
                let machine = AccountMachine(record: Self.unmarked(row.record), planner: planner, now: now)
                fleet?.shared[name] = FleetAccountMachine(
                    share: row.share, version: row.version, committedBy: row.lastRefreshedBy)
                accounts[name] = machine
                // A lease running or run out (a broker killed while it refreshed, this one's
                // predecessor perhaps) may have revoked the row's token: served once it ends.
                // A local copy just settled into this row may have left its token cached.
                guard row.leaseHolder == nil, !row.leaseLapsed else {
                    noticeOthersLease(name)
                    continue
                }
                republish(machine, as: name)
            }
        }
    }

    /// A row's record without the mark of the share that made it (`FleetMark`).
    static func unmarked(_ record: AccountRecord) -> AccountRecord {
        var record = record
        record.fleet = nil
        return record
    }

    /// Takes another host's commit of a served shared account, newer than the version held,
    /// while no refresh of it runs here (one that runs takes the row itself).
    func adoptCommitted(_ row: SharedRow) {
        let name = row.record.name
        guard !padlock.isLocked, var shared = fleet?.shared[name],
            shared.rowMovedOn(share: row.share, version: row.version, by: row.lastRefreshedBy),
            let effects = accounts[name]?.sharedRowCommitted(
                Self.unmarked(row.record), planner: planner, now: clock.now())
        else { return }
        fleet?.shared[name] = shared
        try? run(effects, for: name)
        logger.info(
            "refreshed by another host",
            metadata: ["account": "\(name)", "version": "\(row.version)", "host": "\(row.lastRefreshedBy ?? "-")"])
    }

    /// Creates `account` as a shared account: its row first (refused when the name is taken in
    /// the store), then the account served here.
    public func addShared(
        _ account: AccountName, provider: ProviderConfig, clientSecret: SecretBytes?, tokens: TokenPush?
    ) async throws(BrokerFailure) -> AccountSnapshot {
        let name = account.rawValue
        guard let store = fleet?.store else { throw .noFleet }
        guard !padlock.isLocked else { throw .locked }
        guard accounts[name] == nil else { throw .accountExists(account) }
        let now = clock.now()
        var record = try Self.newRecord(account, provider: provider, clientSecret: clientSecret)
        if let tokens { apply(tokens, to: &record, now: now) }
        let inserted: Bool
        let share = SharedRecord.newShareID()
        do {
            inserted = try await store.insert(record, share: share)
        } catch {
            throw .fleetUnavailable(reason: "\(error)")
        }
        guard inserted, accounts[name] == nil else { throw .accountExists(account) }
        fleet?.shared[name] = FleetAccountMachine(share: share, version: 1, committedBy: store.host)
        return try serveNew(record, now: now)
    }

    /// Deletes the row of `name` when it is a shared account (nothing otherwise); the other
    /// brokers stop serving it at their next read of the store. The account is forgotten as
    /// shared once it left (`forgetShared`).
    func removeShared(_ name: String) async throws(BrokerFailure) {
        guard let store = fleet?.store, isShared(name) else { return }
        do {
            _ = try await store.delete(name, at: nil)
        } catch {
            throw .fleetUnavailable(reason: "\(error)")
        }
    }

    /// Before a shared account's refresh calls the IdP: reads the row (another host may have
    /// refreshed it already, and then its token is served), then takes the lease, waiting for
    /// another holder's commit or the end of its lease, at most one lease and one IdP timeout.
    /// Under the lease the row is read again; the IdP is called only while the lease has more
    /// than an IdP timeout left. `serial` is the account's own refresh; `nil` for a scoped
    /// token's, which a newer row never ends (it is taken, and the refresh goes on from it).
    func takeSharedTurn(_ name: String, serial: Int?) async -> SharedTurn {
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
    func commitShared(
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
    func commitWithinLease(_ record: AccountRecord, share: String, over version: Int64) async -> (
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
    static func rotating(_ record: AccountRecord, by grant: Grant) -> AccountRecord {
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
    /// Keeps a rotated record the store did not take: in memory and in the vault (marked
    /// `uncommitted`, so that a restart still commits it), and retries its commit until it lands
    /// or the row moves on. A vault that cannot be written leaves it in memory only.
    func keepPending(_ record: AccountRecord, share: String?, over version: Int64) {
        let name = record.name
        logger.warning(
            "the fleet's database did not take a change; kept to commit later", metadata: ["account": "\(name)"])
        try? updateShared(name) { $0.commitFailed(keeping: record, share: share, over: version) }
    }

    /// What `retry` tries again until it is settled.
    enum Unsettled {
        /// A refresh the store did not take (`commitPending`).
        case commit
        /// A share whose insert got no answer (`settleFleetMarks`).
        case share
    }

    /// Tries `what` of `name` again after 1 s, doubling up to every 10 s, until it is settled
    /// (one task per account).
    func retry(_ name: String, _ what: Unsettled) {
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
    func commitPending(_ name: String) async {
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
    func forgetFleetAtLock() {
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
    /// The fleet as this broker sees it now (`fleet_status`): the database's report, or why it
    /// gave none.
    public func fleetStatus() async throws(BrokerFailure) -> FleetStanding {
        guard let fleet else { throw .noFleet }
        let report: Result<FleetReport, FleetError>
        do {
            report = .success(try await fleet.store.report())
        } catch let error as FleetError {
            report = .failure(error)
        } catch {
            report = .failure(FleetError(String(describing: error)))
        }
        return FleetStanding(
            host: fleet.store.host, report: report, sharedAccounts: fleet.shared.values.filter(\.served).count)
    }
}

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
    func republish(_ name: String) {
        guard !padlock.isLocked, let machine = accounts[name], machine.refreshSerial == nil else { return }
        republish(machine, as: name)
    }

    /// Puts `machine`'s servable token in the cache as `name`'s (none when it has none, or no
    /// guarded memory can hold its answer: a request then refreshes).
    func republish(_ machine: AccountMachine, as name: String) {
        cache.publish(
            machine.servableToken.flatMap {
                try? PreparedToken(account: name, token: $0, dpop: machine.record.dpopSigning(http.discovery))
            }, for: name)
    }

    /// Another host took the lease on `name` (its notice, or a row read that shows it): the
    /// token held leaves the cache, and, unless a refresh here reads the row on its own,
    /// clients wait in a task of its own (`awaitLeaseEnd`) for that lease to end; a wait
    /// already running counts this lease too, within its own deadline.
    private func noticeOthersLease(_ name: String) {
        let refreshing = accounts[name]?.refreshSerial != nil
        let wait = othersLeaseWait
        try? updateShared(name) { $0.othersLease(refreshing: refreshing, wait: wait, now: clock.now()) }
    }

    /// Reads the row every 0.2 s (`pollPause`) until it has a newer version (taken), or no
    /// lease running. A lease released puts the held token back; one that lapsed does not (its
    /// holder may have rotated the credential without committing, unless the account never
    /// refreshes), and the next client's refresh takes the lease; so too when the wait runs out.
    /// A refresh under way here reads the row on its own.
    private func awaitLeaseEnd(_ name: String) async {
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
    static func pollPause(after row: SharedRow?) -> Duration {
        let poll = 0.2
        guard let left = row?.leaseRemaining, left.isFinite else { return .milliseconds(Int64(poll * 1000)) }
        return .milliseconds(Int64(min(poll, max(0.02, left + 0.02)) * 1000))
    }

    /// The wait of `name`'s clients for another host's lease (`followLease`), if one runs.
    func leaseFollowed(_ name: String) -> Task<Void, Never>? {
        fleet?.shared[name]?.following?.task
    }
}

extension Broker {
    /// Replaces a shared account's tokens fleet-wide: under its lease, the row's record filled
    /// by `fill` (with no denial, logout or error) is committed as the next version, then served
    /// here; the other brokers take the commit when told of it.
    func replaceSharedTokens(of account: AccountName, filling fill: (inout AccountRecord, Date) -> Void)
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
    /// Ends the lease of a refresh the IdP did not grant: a denial is the row's from now on
    /// (committed, so every broker of the fleet shows `needs_login`); any other failure changes
    /// nothing (the lease is released, and its holder's backoff tries again).
    func settleLease(
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

extension Broker {
    /// The lease a logout of `name` revokes under when it is a shared account; `nil` for a local
    /// one. Throws `fleetUnavailable` when it cannot be had.
    func logoutLease(_ name: String) async throws(BrokerFailure) -> SharedLease? {
        guard isShared(name) else { return nil }
        try await checkNothingPending(name)
        return try await leaseForChange(name)
    }

    /// The lease of the shared account `name` for a change an owner asked for (new tokens, a
    /// logout, an unshare): refused with `fleetUnavailable` when the database does not answer
    /// or another host holds it, never waited for.
    func leaseForChange(_ name: String) async throws(BrokerFailure) -> SharedLease {
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
    func commitLogout(_ record: AccountRecord, share: String, over version: Int64) async {
        guard let store = fleet?.store else { return }
        do {
            guard try await store.commit(record, share: share, over: version) else { return }
            try? updateShared(record.name) { $0.commitLanded(over: version, by: store.host) }
        } catch {
            keepPending(record, share: share, over: version)
        }
    }
}

extension Broker {
    /// Refuses an owner's change to a shared account (`unshare`, `logout`) while a refresh the
    /// database missed is not committed: the row's credential is the one that refresh consumed,
    /// and the live one is only in that pending record. Tries the commit once first.
    func checkNothingPending(_ name: String) async throws(BrokerFailure) {
        guard fleet?.shared[name]?.pending != nil else { return }
        await commitPending(name)
        guard fleet?.shared[name]?.pending == nil else {
            throw .fleetUnavailable(reason: "the last refresh of \(name) is not in the fleet's database yet; try again")
        }
    }
}
