import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// Moving an account between this broker's vault and the fleet's shared store (docs/fleet.md,
/// "Moving an account"), so that a crash at any step leaves it in exactly one usable place:
/// before the step that could leave it in two places or none, the vault holds the record with
/// a `FleetMark`, and `settleFleetMarks` finishes or undoes that step when the broker joins
/// the fleet again.
extension Broker {
    /// The steps of `share` and `unshare`, each durable when it returns; a test stops a move
    /// after any of them (as a crash would) to check where the account ends.
    public enum FleetMoveStep: String, Sendable, CaseIterable {
        /// The vault holds the record with its mark.
        case marked
        /// The store took the move: the row is inserted (`share`) or deleted (`unshare`).
        case stored
        /// The vault no longer holds the local copy (`share`) or its mark (`unshare`).
        case settled
    }

    /// Moves the local account `account` into the shared store; from then on every broker of
    /// the fleet serves it. The row is inserted before the local copy is removed.
    public func share(_ account: AccountName, after step: (FleetMoveStep) throws(BrokerFailure) -> Void = { _ in })
        async throws(BrokerFailure) -> AccountSnapshot
    {
        let name = account.rawValue
        guard let store = fleet?.store else { throw .noFleet }
        guard !isShared(name) else { throw .invalid("the account \(name) is shared already") }
        let machine = try self.machine(name)
        guard machine.record.declared != true else {
            throw .invalid("the account \(name) is declared in broker.toml: it stays on this host")
        }
        try checkChangeable(machine)
        await takeChainTurn(name)
        defer { endChainTurn(name) }
        // Checked again after the wait: a logout or another share may have come meanwhile.
        guard let current = accounts[name], !isShared(name) else { throw .noSuchAccount(account) }
        try checkChangeable(current)
        let share = SharedRecord.newShareID()
        let mark = FleetMark(step: .sharing, version: 1, id: share)
        // From here the account is neither refreshed nor changed (`checkShareSettled`): the
        // row may take its credential at any moment.
        accounts[name]?.markForFleet(mark)
        do {
            try persist(changing: [name])
        } catch {
            accounts[name]?.markForFleet(nil)
            throw error
        }
        guard let record = accounts[name]?.record else { throw .noSuchAccount(account) }
        try step(.marked)
        let inserted: Bool
        do {
            inserted = try await store.insert(record, share: share)
        } catch {
            if (error as? FleetError)?.refusedByServer == true {
                accounts[name]?.markForFleet(nil)
                try? persist(changing: [name])
                throw .fleetUnavailable(reason: "\(error)")
            }
            // The insert may land yet (the query given up on may still reach the database): the
            // account keeps its mark, serves its token, and the share is finished once the
            // database answers.
            retry(name, .share)
            throw .fleetUnavailable(reason: "\(error); the share completes once the fleet's database answers")
        }
        accounts[name]?.markForFleet(nil)
        guard inserted else {
            try persist(changing: [name])
            throw .invalid("the fleet has an account named \(name) already")
        }
        fleet?.shared[name] = FleetAccountMachine(share: share, version: 1, committedBy: store.host)
        try step(.stored)
        // The vault keeps nothing of a shared account: its local copy goes.
        try persist(changing: [name])
        try step(.settled)
        logger.info("account shared with the fleet", metadata: ["account": "\(name)"])
        return describe(try self.machine(name), now: clock.now())
    }

    /// Moves the shared account `account` out of the store into this broker's vault, under the
    /// account's lease so that no host refreshes it meanwhile: the record is kept in the vault
    /// (marked) before its row is deleted. The other brokers stop serving it at their next read
    /// of the store.
    public func unshare(_ account: AccountName, after step: (FleetMoveStep) throws(BrokerFailure) -> Void = { _ in })
        async throws(BrokerFailure) -> AccountSnapshot
    {
        let name = account.rawValue
        guard let store = fleet?.store else { throw .noFleet }
        guard isShared(name) else { throw .invalid("the account \(name) is not shared") }
        try checkChangeable(try machine(name))
        await takeChainTurn(name)
        defer { endChainTurn(name) }
        try await checkNothingPending(name)
        let lease = try await leaseForChange(name)
        do {
            try updateShared(name) { $0.unsharing(lease.row.record, at: lease.row.version) }
        } catch {
            try? updateShared(name) { $0.unsharingAbandoned() }
            await store.release(name)
            throw error
        }
        try step(.marked)
        let deleted: Bool
        do {
            deleted = try await store.delete(name, at: lease.row.version)
        } catch {
            await store.release(name)
            throw .fleetUnavailable(reason: "\(error)")
        }
        guard deleted else {
            try? updateShared(name) { $0.unsharingAbandoned() }
            throw .fleetUnavailable(reason: "\(name) changed on another host meanwhile; try again")
        }
        try? updateShared(name) { $0.unshared() }
        try step(.stored)
        // The local account replaces the vault's marked copy.
        serveLocal(Self.unmarked(lease.row.record))
        try persist(changing: [name])
        try step(.settled)
        logger.info("account moved out of the fleet", metadata: ["account": "\(name)"])
        return describe(try self.machine(name), now: clock.now())
    }

    /// Finishes or undoes what a crash interrupted, from the marks the vault holds: a share is
    /// finished (its row inserted now, unless there already) and the local copy dropped, unless
    /// the store has another account of its name, and then it stays local; an unshare whose row
    /// is still at the version read deletes it and the account stays local, while a row another
    /// host moved on wins; a refresh the store has not taken is committed (`commitPending`).
    /// Runs at each read of the store until every mark is settled.
    package func settleFleetMarks() async {
        guard let store = fleet?.store, !padlock.isLocked else { return }
        for name in accounts.machines.keys.sorted() where accounts[name]?.record.fleet?.step == .sharing {
            // Under the account's chain, so that no share of it runs meanwhile.
            await takeChainTurn(name)
            await settleShare(name, store: store)
            endChainTurn(name)
        }
        for (name, held) in heldForFleet.sorted(by: { $0.key < $1.key }) {
            guard let mark = held.fleet else { continue }
            switch mark.step {
            case .unsharing:
                await settleUnshare(held, mark: mark, store: store)
            case .uncommitted:
                fleet?.shared[name] = FleetAccountMachine(keptCommit: held, mark: mark)
                heldForFleet[name] = nil
                retry(name, .commit)
            case .sharing:
                heldForFleet[name] = nil
            }
        }
        for name in fleet?.pending.keys.sorted() ?? [] {
            await commitPending(name)
        }
    }

    /// A share not settled: finished rather than undone, since an insert that was sent may land
    /// at any time (a row missing now proves nothing). The record is the one marked, which
    /// nothing changed since (`checkShareSettled`). The row is the share's own when it carries
    /// the mark's id as its share (commits keep it); a share that landed and was since removed
    /// or unshared on another host drops the copy here, since the account lives elsewhere or
    /// nowhere now. Left for the next try while the database does not answer, or the row of
    /// that name is gone between the insert and the read.
    private func settleShare(_ name: String, store: any SharedAccountStore) async {
        guard let marked = accounts[name]?.record, let mark = marked.fleet, mark.step == .sharing,
            let share = mark.id
        else { return }
        let inserted: Bool
        let row: SharedRow?
        let ended: Bool
        do {
            inserted = try await store.insert(marked, share: share)
            row = inserted ? nil : try await store.read(name)
            ended = inserted || row?.share == share ? false : try await store.shareEnded(share)
        } catch {
            return
        }
        guard accounts[name]?.record.fleet == mark else { return }
        if inserted || row?.share == share || ended {
            if ended {
                stopServing(
                    name, "dropped an account whose share was removed or unshared on another host", now: clock.now())
            } else {
                accounts[name] = nil
                logger.notice("finished sharing an account", metadata: ["account": "\(name)"])
            }
            // The local copy leaves the vault (once it can be written, `retryFailedSave`).
            try? persist(changing: [name])
            await readSharedAccounts()
        } else if row != nil {
            accounts[name]?.markForFleet(nil)
            try? persist(changing: [name])
            logger.warning(
                "the fleet has another account of this name; it stays local", metadata: ["account": "\(name)"])
        }
    }

    /// An unshare a crash interrupted: its row deleted, or deleted now if still at the version
    /// read (the account is local), or moved on by another host (the row wins).
    private func settleUnshare(_ held: AccountRecord, mark: FleetMark, store: any SharedAccountStore) async {
        let name = held.name
        let row: SharedRow?
        do {
            row = try await store.read(name)
            if let row, row.version == mark.version, try await !store.delete(name, at: mark.version) { return }
        } catch {
            return
        }
        heldForFleet[name] = nil
        if let row, row.version != mark.version {
            try? persist(changing: [name])
            logger.notice(
                "dropped an unshare a crash interrupted: another host refreshed the account",
                metadata: ["account": "\(name)"])
            await readSharedAccounts()
            return
        }
        forgetShared(name)
        serveLocal(Self.unmarked(held))
        try? persist(changing: [name])
        logger.notice("finished unsharing an account a crash interrupted", metadata: ["account": "\(name)"])
    }

    /// Stops serving `name` here (its row is gone, or its copy here is not the live one): says
    /// why in the log and tells subscribers it was removed.
    package func stopServing(_ name: String, _ why: String, now: Date) {
        guard accounts.removeValue(forKey: name) != nil else { return }
        tokenProviders[name] = nil
        cache.publish(nil, for: name)
        logger.info("\(why)", metadata: ["account": "\(name)"])
        events.publish(AccountEvent(kind: .removed, account: AccountName(known: name), at: now))
    }

    /// Stops serving shared account `name` here (its row is gone, or replaced by another
    /// share), unless a refresh of it runs here, which reads the row on its own.
    package func dropShared(_ name: String, _ why: String, now: Date) {
        let refreshing = accounts[name]?.refreshSerial != nil
        guard let effects = fleet?.shared[name]?.removed(refreshing: refreshing), !effects.isEmpty else { return }
        stopServing(name, why, now: now)
        try? run(effects, forShared: name)
    }

    /// Stops treating `name` as shared (its row is gone, and its account left or is local
    /// now): a commit kept for it leaves the vault too, since no row will take it.
    package func forgetShared(_ name: String) {
        try? updateShared(name) { $0.removed(refreshing: false) }
    }

    /// Serves `record` as a local account, replacing what was served under its name.
    private func serveLocal(_ record: AccountRecord) {
        let now = clock.now()
        let machine = AccountMachine(record: record, planner: planner, now: now)
        accounts[record.name] = machine
        tokenProviders[record.name] = nil
        republish(machine, as: record.name)
    }
}
