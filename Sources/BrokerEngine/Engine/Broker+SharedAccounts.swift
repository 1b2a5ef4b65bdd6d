import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// The fleet's shared accounts in the engine (docs/fleet.md): served from the shared store's
/// rows, refreshed by one host at a time under the account's lease, and each rotation committed
/// to the store (compare and swap on the row's version) before any token from it is served.
extension Broker {
    /// The shared store and what this broker knows of its rows.
    package struct FleetMembership {
        package let store: any SharedAccountStore
        package let leaseSeconds: Double
        /// Each shared account's place in the fleet, by name; also a commit the vault kept
        /// across a restart, before its account is served (`FleetAccountMachine.served`).
        package var shared: [String: FleetAccountMachine] = [:]
        /// The accounts whose pending commit or unsettled share a task retries now (`retry`).
        package var retrying: Set<String> = []

        /// The changes the database missed, by account.
        package var pending: [String: FleetAccountMachine.PendingCommit] { shared.compactMapValues(\.pending) }
    }

    /// Whether `name` is a shared account served here from its row.
    package func isShared(_ name: String) -> Bool {
        fleet?.shared[name]?.served == true
    }

    /// Applies `transition` to the fleet side of `name`, if it has one, then runs the effects
    /// it returns; a failed save stops the rest and is thrown.
    package func updateShared(
        _ name: String, _ transition: (inout FleetAccountMachine) -> [FleetAccountMachine.Effect]
    ) throws(BrokerFailure) {
        guard var machine = fleet?.shared[name] else { return }
        let effects = transition(&machine)
        fleet?.shared[name] = machine
        try run(effects, forShared: name)
    }

    /// Runs a fleet transition's effects in order; a failed save stops the rest and is thrown
    /// (it is tried again as any failed save is, `retryFailedSave`).
    package func run(_ effects: [FleetAccountMachine.Effect], forShared name: String) throws(BrokerFailure) {
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
    package var othersLeaseWait: TimeInterval {
        min(fleet?.leaseSeconds ?? 0, 3 * settings.requestTimeout) + settings.requestTimeout
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
    package func sharedStatus(of name: String) -> SharedAccountStatus? {
        guard let fleet, let shared = fleet.shared[name], shared.served else { return nil }
        return SharedAccountStatus(
            version: shared.version, lastRefreshedBy: shared.committedBy,
            leaseHolder: shared.holdsLease ? fleet.store.host : nil)
    }

    /// Reads every row and serves the shared accounts this broker does not hold yet.
    package func readSharedAccounts() async {
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
    package static func unmarked(_ record: AccountRecord) -> AccountRecord {
        var record = record
        record.fleet = nil
        return record
    }

    /// Takes another host's commit of a served shared account, newer than the version held,
    /// while no refresh of it runs here (one that runs takes the row itself).
    package func adoptCommitted(_ row: SharedRow) {
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
    package func removeShared(_ name: String) async throws(BrokerFailure) {
        guard let store = fleet?.store, isShared(name) else { return }
        do {
            _ = try await store.delete(name, at: nil)
        } catch {
            throw .fleetUnavailable(reason: "\(error)")
        }
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
