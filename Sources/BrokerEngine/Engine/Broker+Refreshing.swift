import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// The refresh runner: the schedule, single-flight refreshes one at a time per account, and
/// the checks that fail a request fast instead of calling the IdP.
extension Broker {
    /// Starts every refresh that is due and returns when the next one will be. Refreshes found
    /// long overdue (the machine slept, or the wall clock jumped) are spread over the next
    /// `overdueSpread` seconds instead of all hitting the IdPs in the same instant; a client
    /// that needs such an account's token meanwhile gets an on-demand refresh. Only the accounts
    /// whose deadline came are looked at (`AccountTable.names(dueBy:)`).
    public func runDueRefreshes() -> Date? {
        let now = clock.now()
        let (threshold, spread) = (settings.overdueThreshold, settings.overdueSpread)
        let retry = retryFailedSave(now: now)
        for name in accounts.names(dueBy: now) {
            pollSource(name, now: now)
            if accounts[name]?.refreshIsDue(
                now: now, overdueThreshold: threshold, spread: Double.random(in: 0...spread)) == true
            {
                _ = startRefresh(name, forClient: false)
            }
            // A refresh that may not start while a save fails (`refusalWhileUnsaved`) is looked
            // at again when the save is tried again.
            if let retry, let wake = accounts[name]?.wakeAt, wake <= now { accounts.postpone(name, to: retry) }
        }
        return [retry, accounts.nextDeadline].compactMap { $0 }.min()
    }

    /// Tries a failed save again once its backoff is over (`saveTrouble`): the save, never a
    /// new refresh. Returns when to try next while it still fails.
    package func retryFailedSave(now: Date) -> Date? {
        guard let trouble = saveTrouble else { return nil }
        guard trouble.retryAt <= now else { return trouble.retryAt }
        try? persist(changing: [])
        return saveTrouble?.retryAt
    }

    /// The refusal of a refresh of local account `name` while a save failed (`saveTrouble`): a
    /// rotated credential is still unsaved, and another rotation's would not be saved either.
    /// The account's state is left as it is: the save is retried, not the refresh.
    package func refusalWhileUnsaved(_ name: String) -> BrokerFailure? {
        guard !isShared(name), let trouble = saveTrouble else { return nil }
        return .refreshFailing(
            reason: trouble.reason, retryAfter: max(0, trouble.retryAt.timeIntervalSince(clock.now())))
    }

    /// Why a refresh of local account `name` may not call its IdP now, `nil` when it may: the
    /// vault has no room for the record of the credential the refresh may rotate
    /// (`Vault.ensureRoom`, protocol/VAULT.md), or a save failed since the refresh started.
    package func unsavable(_ name: String) -> RefreshFailure? {
        guard !isShared(name) else { return nil }
        if let trouble = saveTrouble { return .transient(trouble.reason) }
        do {
            try vault.ensureRoom()
            return nil
        } catch {
            return .transient("cannot save the vault: \(error); no refresh starts until there is room")
        }
    }

    /// Why a refresh of `record` may not call its IdP for want of guarded memory, `nil` when
    /// the task's `SecretArena.reservation` now holds the slots the answer will need.
    package func unstorable(_ record: AccountRecord) -> RefreshFailure? {
        do {
            try SecretArena.reservation?.fill(sizes: Self.answerSizes(record))
            return nil
        } catch {
            return .transient("the broker is out of guarded memory for secrets; no refresh starts until there is some")
        }
    }

    /// What a refresh of `record` reserves for its answer: a slot for each secret it may bring
    /// (refresh token, access token, id token, and the token's prepared answer), twice the size
    /// of the account's present one and at least 8 KiB, so that a rotation is not lost for
    /// want of memory. A larger secret is stored like any other.
    package static func answerSizes(_ record: AccountRecord) -> [Int] {
        let access = record.token?.value.count ?? 0
        let id = record.token?.idToken?.count ?? 0
        let refresh = record.secrets.refreshToken?.count ?? 0
        return [refresh, access, id, access + id + 512].map { max(8192, 2 * $0) }
    }

    /// Runs a refresh's `body` in a task of its own that holds a `SecretArena.Reservation`
    /// (`unstorable` fills it).
    package func refreshTask(_ body: @escaping @Sendable () async -> Result<Void, BrokerFailure>) -> Task<
        Result<Void, BrokerFailure>, Never
    > {
        Task { await SecretArena.$reservation.withValue(SecretArena.Reservation()) { await body() } }
    }

    /// Asks the provider of an account that watches its source whether the source changed, once
    /// every poll interval, and starts a refresh when it did.
    package func pollSource(_ name: String, now: Date) {
        if accounts[name]?.poll(now: now) == true, let machine = accounts[name], machine.refreshSerial == nil,
            provider(for: machine.record).sourceChanged()
        {
            _ = startRefresh(name, forClient: false)
        }
    }

    /// Waits for refreshes under way, so their vault writes complete before exit.
    public func drain() async {
        for running in refreshTasks.values {
            _ = await running.task.value
        }
        for running in narrowedRefreshes.values {
            _ = await running.value
        }
    }

    /// Refreshes `name` (for a client's request when `forClient`), or joins the refresh under
    /// way (single flight).
    package func refreshShared(_ name: String, forClient: Bool) async -> Result<Void, BrokerFailure> {
        guard accounts[name] != nil else { return .failure(.noSuchAccount(AccountName(known: name))) }
        return await startRefresh(name, forClient: forClient).value
    }

    /// Starts a refresh of `name` and returns its task; joins the one under way, if any. One
    /// started `forClient` (a client's request, not the schedule, new tokens or the owner) holds
    /// off the next client's request for `minimumRefreshInterval` (`tokenInsteadOfRefresh`).
    package func startRefresh(_ name: String, forClient: Bool) -> Task<Result<Void, BrokerFailure>, Never> {
        guard !padlock.isLocked else { return Task { .failure(.locked) } }
        if let serial = accounts[name]?.refreshSerial, let running = refreshTasks[name], running.serial == serial {
            return running.task
        }
        if let refusal = refusalWhileUnsaved(name) { return Task { .failure(refusal) } }
        refreshSerial += 1
        let serial = refreshSerial
        guard accounts[name]?.beginRefresh(serial: serial, forClient: forClient) == true else {
            let refusal = BrokerFailure.refreshNotStarted(AccountName(known: name))
            return Task { .failure(refusal) }
        }
        let task = refreshTask { await self.performRefresh(name, serial: serial) }
        refreshTasks[name] = (serial, task)
        return task
    }

    package func performRefresh(_ name: String, serial: Int) async -> Result<Void, BrokerFailure> {
        defer { if refreshTasks[name]?.serial == serial { refreshTasks[name] = nil } }
        await takeChainTurn(name)
        defer { endChainTurn(name) }
        guard var started = accounts[name]?.record else { return .failure(.noSuchAccount(AccountName(known: name))) }
        // New tokens or a removal came while it waited for its turn: nothing to present.
        guard accounts[name]?.refreshSerial == serial else {
            return .failure(.changedDuringRefresh(AccountName(known: name)))
        }
        if started.fleet?.step == .sharing {
            let reason = BrokerFailure.shareUnsettled(AccountName(known: name)).description
            return finishRefresh(name, serial: serial, started: started, outcome: .failure(.transient(reason)))
        }
        // A shared account refreshes under its lease, from its row's credential (docs/fleet.md).
        let shared = isShared(name) ? await takeSharedTurn(name, serial: serial) : nil
        if case .finished(let result) = shared { return result }
        if case .leased(let row) = shared { started = row.record }
        defer { if case .leased = shared { try? updateShared(name) { $0.leaseLost() } } }
        let provider = provider(for: started)
        let asked = ContinuousClock.now
        let outcome: Result<Grant, RefreshFailure>
        if case .failed(let failure) = shared {
            outcome = .failure(failure)
        } else if let failure = unsavable(name) ?? unstorable(started) {
            outcome = .failure(failure)
        } else {
            // Whatever the IdP or helper wrote is cleaned here, once, before it is stored, logged or sent.
            outcome = await provider.refresh(started, now: clock.now()).mapError(started.outsideText().clean)
        }
        let answered = ContinuousClock.now
        if case .leased(let row) = shared {
            guard case .success(let grant) = outcome else {
                let result = finishRefresh(name, serial: serial, started: started, outcome: outcome)
                await settleLease(name, after: outcome, share: row.share, over: row.version)
                return result
            }
            return await commitShared(
                name, serial: serial, started: started, grant: grant, share: row.share, over: row.version,
                idp: asked.duration(to: answered))
        }
        return finishRefresh(
            name, serial: serial, started: started, outcome: outcome, asked: asked, answered: answered)
    }

    /// Applies what a refresh's provider call gave to the account's machine and runs its effects.
    package func finishRefresh(
        _ name: String, serial: Int, started: AccountRecord, outcome: Result<Grant, RefreshFailure>,
        asked: ContinuousClock.Instant = .now, answered: ContinuousClock.Instant = .now
    ) -> Result<Void, BrokerFailure> {
        let now = clock.now()
        guard accounts[name] != nil else { return .failure(.changedDuringRefresh(AccountName(known: name))) }
        let result: AccountMachine.RefreshResult
        var delay: TimeInterval = 0
        var probeDelay: TimeInterval = 0
        switch outcome {
        case .success(let grant):
            result = accounts[name]!.refreshSucceeded(
                serial: serial, presented: started.secrets, grant: grant, planner: planner, now: now)
        case .failure(let failure) where failure.kind == .denial:
            result = accounts[name]!.refreshDenied(serial: serial, message: failure.message, now: now)
        case .failure(let failure):
            delay = planner.backoff(failures: accounts[name]!.failures + 1, retryAfter: failure.retryAfter)
            probeDelay = planner.probeDelay(backoff: delay, retryAfter: failure.retryAfter)
            result = accounts[name]!.refreshFailed(
                serial: serial, message: failure.message, delay: delay, probeDelay: probeDelay, now: now)
        }
        switch (result, outcome) {
        case (.overtaken(let effects), _):
            try? run(effects, for: name)
            return .failure(.changedDuringRefresh(AccountName(known: name)))
        case (.applied([]), .success):
            return .success(())
        case (.applied(let effects), .success(let grant)):
            do {
                try run(effects, for: name)
            } catch {
                accounts[name]?.saveFailed(holding: Array(effects.drop { $0 != .persist }.dropFirst()))
                return .failure(error)
            }
            // How long the IdP took, and how long a rotated credential then existed only in
            // memory (the IdP's answer to the fsync).
            logger.info(
                "refreshed",
                metadata: [
                    "account": "\(name)", "expires_in": "\(Bounds.wholeSeconds(grant.token.remaining(at: now)))",
                    "idp_us": "\(Self.microseconds(asked.duration(to: answered)))",
                    "saved_after_us": "\(Self.microseconds(answered.duration(to: .now)))",
                ])
            return .success(())
        case (.applied(let effects), .failure(let failure)) where failure.kind == .denial:
            try? run(effects, for: name)
            logger.warning(
                "refresh denied; needs login", metadata: ["account": "\(name)", "reason": "\(failure.message)"])
            return .failure(denial(of: started, reason: failure.message))
        case (.applied(let effects), .failure(let failure)):
            try? run(effects, for: name)
            logger.warning(
                "refresh failed; will retry",
                metadata: [
                    "account": "\(name)", "reason": "\(failure.message)",
                    "retry_in_s": "\(Bounds.wholeSeconds(delay.rounded(.up)))",
                ])
            return .failure(.refreshFailing(reason: failure.message, retryAfter: probeDelay))
        }
    }

    /// Fails fast for accounts that cannot be refreshed now, instead of calling the IdP.
    package func checkRefreshable(_ machine: AccountMachine) throws(BrokerFailure) {
        try checkCredentialUsable(machine)
        try checkShareSettled(machine)
        if let refusal = refusalWhileUnsaved(machine.record.name) { throw refusal }
        guard machine.refreshesOnItsOwn else {
            throw .noTokenLongEnough(AccountName(known: machine.record.name), kind: machine.record.provider.kind)
        }
        if let wait = machine.probeWait(now: clock.now()) {
            throw .refreshFailing(
                reason: machine.record.lastError?.message ?? "the IdP is failing; retrying", retryAfter: wait)
        }
    }

    /// Refuses accounts whose credential was denied, discarded, or is being revoked.
    package func checkCredentialUsable(_ machine: AccountMachine) throws(BrokerFailure) {
        let name = AccountName(known: machine.record.name)
        switch machine.refusal {
        case .loggedOut: throw .loggedOut(name, restore: restoration(of: machine.record))
        case .denied: throw denial(of: machine.record, reason: machine.record.lastError?.message)
        case .loggingOut: throw .loggingOut(name)
        case nil: break
        }
    }

    /// Why an account held as denied serves no token: a credential it never held (no IdP was
    /// asked), a client the IdP does not accept, or a credential the IdP refused. `reason` is
    /// the denial's message.
    package func denial(of record: AccountRecord, reason: String?) -> BrokerFailure {
        let name = AccountName(known: record.name)
        if let credential = record.provider.missingCredential(in: record.secrets) {
            return .noCredential(name, credential: credential, restore: restoration(of: record))
        }
        if let reason, OAuth2Provider.rejectsClient(reason) {
            return .clientRejected(name, reason: reason, declared: record.declared == true)
        }
        return .denied(name, reason: reason, restore: restoration(of: record))
    }

    /// What brings back the account of `record` while it serves no token (`Restoration`): a
    /// client the IdP refuses is corrected in place, which keeps the refresh token; otherwise
    /// what its kind and its IdP's endpoints allow, from the discovery document when one was read.
    package func restoration(of record: AccountRecord) -> Restoration {
        if record.needsLogin, record.loggedOut != true, record.secrets.refreshToken != nil,
            let reason = record.lastError?.message, OAuth2Provider.rejectsClient(reason)
        {
            return .correctClient(declared: record.declared == true)
        }
        let settings = record.provider.settings
        let issuer = (settings as? OAuth2Settings)?.issuer
        return settings.restoration(discovered: issuer.flatMap(http.discovery.known))
    }

    /// Refuses a change to an account being logged out, or whose share is not settled.
    package func checkChangeable(_ machine: AccountMachine) throws(BrokerFailure) {
        if machine.isLoggingOut { throw .loggingOut(AccountName(known: machine.record.name)) }
        try checkShareSettled(machine)
    }

    /// Refuses an account whose share is not settled (`settleFleetMarks`): its row may hold
    /// its credential already, so a refresh here would consume it, and a change here (tokens,
    /// a removal, a logout) would be lost to the row.
    package func checkShareSettled(_ machine: AccountMachine) throws(BrokerFailure) {
        if machine.record.fleet?.step == .sharing { throw .shareUnsettled(AccountName(known: machine.record.name)) }
    }

    /// Refuses, without calling the IdP, a `minTTL` longer than the lifetime the IdP grants,
    /// while the current token is not yet due for refresh (a refresh could not help).
    package func checkLifetime(_ machine: AccountMachine, covers minTTL: TimeInterval) throws(BrokerFailure) {
        guard machine.record.provider.renewal == .refreshes, let token = machine.record.token, token.pushed != true,
            token.expiresAt > clock.now(),
            let due = machine.nextRefreshAt, due > clock.now(),
            token.expiresAt.timeIntervalSince(token.obtainedAt) < minTTL
        else { return }
        throw .lifetimeTooShort(lifetime: token.expiresAt.timeIntervalSince(token.obtainedAt), minTTL: minTTL)
    }

    package static func microseconds(_ duration: Duration) -> Int64 {
        duration.components.seconds * 1_000_000 + duration.components.attoseconds / 1_000_000_000_000
    }
}
