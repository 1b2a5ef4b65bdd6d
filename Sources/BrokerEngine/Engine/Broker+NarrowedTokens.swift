import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// Tokens narrowed to other scopes (RFC 6749 section 6) and bound to a resource (RFC 8707):
/// each `TokenKey` of an account has its own token, cached in memory only, refreshed once for
/// all its concurrent callers. Every refresh of an account, its own or a narrowed one, presents
/// the one refresh token the account holds, so they take turns (`takeChainTurn`): each saves
/// the credential the IdP rotated before the next starts. The refreshes a caller starts draw on
/// its budget on the account (`NarrowedRefreshBudget`).
extension Broker {
    /// One account's token for one key.
    package struct NarrowedRefresh: Hashable, Sendable {
        package let account: String
        package let key: TokenKey
    }

    /// A token of `account` for `key`, valid for `minTTL` seconds: the cached one, or one a
    /// refresh narrowed to `key` brings (one refresh, shared by every caller of the key), within
    /// the budget of the caller of uid `caller` (`chargeNarrowedRefresh`). The
    /// account's own token, schedule and state are untouched; a refusal by the IdP is
    /// `targetRefused`.
    public nonisolated func token(for account: AccountName, key: TokenKey, minTTL: TimeInterval, caller: UInt32)
        async throws(BrokerFailure) -> PreparedToken
    {
        guard !key.isAccount else { return try await token(for: account, minTTL: minTTL) }
        let name = account.rawValue
        if let token = cache.token(for: name, key: key, minTTL: minTTL, now: clock.now()) { return token }
        switch try await narrowedRefreshForToken(name, key: key, minTTL: minTTL, caller: caller) {
        case .ready(let token):
            return token
        case .refreshing(let refresh, let source):
            let outcome = await refresh.value
            if let token = cache.token(for: name, key: key, minTTL: minTTL, now: clock.now()) { return token }
            if case .failure(let error) = outcome { throw error }
            throw .tokenTooShort(heldBy: source, minTTL: minTTL)
        }
    }

    /// Handles a token for `key` that a resource server refused: when the cache still holds
    /// it, drops it and refreshes the key once (within the caller's budget); then answers the
    /// key's token.
    public func reject(
        _ accessToken: SecretBytes, of account: AccountName, key: TokenKey, minTTL: TimeInterval, caller: UInt32
    ) async throws(BrokerFailure) -> PreparedToken {
        guard !key.isAccount else { return try await reject(accessToken, of: account, minTTL: minTTL) }
        let name = account.rawValue
        let machine = try self.machine(name)
        try checkNarrowable(machine)
        let refresh = NarrowedRefresh(account: name, key: key)
        if narrowedRefreshes[refresh] == nil, cache.holds(accessToken, for: name, key: key) {
            try checkRefreshable(machine)
            try chargeNarrowedRefresh(refresh, caller: caller)
            _ = cache.withdraw(accessToken, for: name, key: key)
            if case .failure(let error) = await startNarrowedRefresh(name, key: key).value { throw error }
        }
        return try await token(for: account, key: key, minTTL: minTTL, caller: caller)
    }

    /// The token, or the refresh a `token` call for `key` waits for. Looks at the cache again
    /// first, on the actor, so a call that missed it just before a refresh ended starts none.
    private func narrowedRefreshForToken(_ name: String, key: TokenKey, minTTL: TimeInterval, caller: UInt32)
        throws(BrokerFailure) -> TokenWait
    {
        if let token = cache.token(for: name, key: key, minTTL: minTTL, now: clock.now()) { return .ready(token) }
        let machine = try self.machine(name)
        try checkNarrowable(machine)
        try checkRefreshable(machine)
        try checkLifetime(machine, covers: minTTL)
        let now = clock.now()
        let refresh = NarrowedRefresh(account: name, key: key)
        if let backoff = narrowedBackoffs[refresh], backoff.until > now {
            throw .refreshFailing(reason: backoff.reason, retryAfter: backoff.until.timeIntervalSince(now))
        }
        if narrowedRefreshes[refresh] == nil { try chargeNarrowedRefresh(refresh, caller: caller) }
        return .refreshing(startNarrowedRefresh(name, key: key), .issued)
    }

    /// Takes the refresh a request of uid `caller` would start, narrowed to `key`, from that
    /// caller's budget on the account (`NarrowedRefreshBudget`); refuses it when none is left.
    private func chargeNarrowedRefresh(_ refresh: NarrowedRefresh, caller: UInt32) throws(BrokerFailure) {
        if let wait = narrowedBudget.take(account: refresh.account, uid: caller, now: clock.now()) {
            throw .narrowedRefreshesSpent(AccountName(known: refresh.account), retryAfter: wait)
        }
    }

    /// Refuses accounts whose kind cannot narrow a token (only `oauth2` can).
    private func checkNarrowable(_ machine: AccountMachine) throws(BrokerFailure) {
        guard provider(for: machine.record) is any NarrowingTokenProvider else {
            throw .invalid(
                "\(machine.record.name) is a \(machine.record.provider.kind) account; "
                    + "\"scope\" and \"resource\" apply only to oauth2 accounts")
        }
    }

    /// Starts the refresh of `name` narrowed to `key`, or joins the one under way.
    private func startNarrowedRefresh(_ name: String, key: TokenKey) -> Task<Result<Void, BrokerFailure>, Never> {
        let refresh = NarrowedRefresh(account: name, key: key)
        if let running = narrowedRefreshes[refresh] { return running }
        let task = refreshTask { await self.performNarrowedRefresh(refresh) }
        narrowedRefreshes[refresh] = task
        return task
    }

    private func performNarrowedRefresh(_ refresh: NarrowedRefresh) async -> Result<Void, BrokerFailure> {
        defer { narrowedRefreshes[refresh] = nil }
        let name = refresh.account
        let account = AccountName(known: name)
        await takeChainTurn(name)
        defer { endChainTurn(name) }
        // Checked again after the wait: a logout, a denial or a removal may have come meanwhile.
        var started: AccountRecord
        let provider: any NarrowingTokenProvider
        do throws(BrokerFailure) {
            let machine = try self.machine(name)
            try checkRefreshable(machine)
            guard let narrowing = self.provider(for: machine.record) as? any NarrowingTokenProvider else {
                return .failure(.changedDuringRefresh(account))
            }
            started = machine.record
            provider = narrowing
        } catch {
            return .failure(error)
        }
        if let failure = unstorable(started) { return narrowedRefreshFailed(refresh, failure, now: clock.now()) }
        // A shared account's scoped refresh presents the row's credential under the account's
        // lease, as its own refresh does (docs/fleet.md, "One refresher").
        var lease: SharedRow?
        if isShared(name) {
            switch await takeSharedTurn(name, serial: nil) {
            case .leased(let row):
                // The row's state is the account's: a denial or a logout committed elsewhere.
                guard !row.record.needsLogin, row.record.loggedOut != true else {
                    await fleet?.store.release(name)
                    return .failure(.changedDuringRefresh(account))
                }
                started = row.record
                lease = row
            case .failed(let failure):
                return narrowedRefreshFailed(refresh, failure, now: clock.now())
            case .finished(let result):
                return result
            }
        }
        defer { if lease != nil { try? updateShared(name) { $0.leaseLost() } } }
        if lease == nil, let failure = unsavable(name) {
            return narrowedRefreshFailed(refresh, failure, now: clock.now())
        }
        let outcome = await provider.refresh(started, for: refresh.key, now: clock.now())
            .mapError(started.outsideText().clean)
        if lease != nil, case .failure(let failure) = outcome {
            await fleet?.store.release(name)
            // Refused by the IdP: nothing rotated, so the account's own token, withdrawn here
            // when the lease was taken, is served again (a transient failure may hide a
            // rotation, and leaves it to the account's own refresh, as that refresh's does).
            if failure.kind != .transient { republish(name) }
        }
        let now = clock.now()
        switch outcome {
        case .success(let grant):
            if let lease {
                // Committed before the token is served anywhere; the account takes the row.
                let rotated = Self.rotating(started, by: grant)
                if let failure = await commitNarrowed(rotated, over: lease) {
                    return narrowedRefreshFailed(refresh, failure, now: now)
                }
            } else {
                // The rotated credential is the account's: saved before the next turn starts.
                guard let effects = accounts[name]?.narrowedRefreshSucceeded(presented: started.secrets, grant: grant)
                else { return .failure(.changedDuringRefresh(account)) }
                do {
                    try run(effects, for: name)
                } catch {
                    return .failure(error)
                }
            }
            let prepared: PreparedToken
            do {
                prepared = try PreparedToken(
                    account: name, token: grant.token, dpop: started.dpopSigning(http.discovery))
            } catch {
                return .failure(error)
            }
            narrowedBackoffs[refresh] = nil
            guard !padlock.isLocked else { return .failure(.locked) }
            cache.publish(prepared, for: name, key: refresh.key, now: now)
            logger.info(
                "refreshed a narrowed token",
                metadata: [
                    "account": "\(name)", "scope": "\(refresh.key.scopeText ?? "")",
                    "resource": "\(refresh.key.resource ?? "")",
                    "expires_in": "\(Bounds.wholeSeconds(grant.token.remaining(at: now)))",
                ])
            return .success(())
        case .failure(let failure) where failure.kind == .transient:
            return narrowedRefreshFailed(refresh, failure, now: now)
        case .failure(let failure):
            // A refusal of a narrowed refresh leaves the account as it is: its own refresh,
            // which asks for nothing new, tells whether the credential itself is still good.
            logger.notice(
                "the IdP refused a narrowed token", metadata: ["account": "\(name)", "reason": "\(failure.message)"])
            return .failure(.targetRefused(account, reason: failure.message))
        }
    }

    /// A narrowed refresh that failed for a reason that may pass: the key waits (the IdP's
    /// Retry-After, or a jittered backoff); the account does not.
    private func narrowedRefreshFailed(_ refresh: NarrowedRefresh, _ failure: RefreshFailure, now: Date) -> Result<
        Void, BrokerFailure
    > {
        let delay = planner.backoff(failures: 1, retryAfter: failure.retryAfter)
        narrowedBackoffs = narrowedBackoffs.filter { $0.value.until > now }
        narrowedBackoffs[refresh] = (now.addingTimeInterval(delay), failure.message)
        logger.warning(
            "narrowed refresh failed",
            metadata: [
                "account": "\(refresh.account)", "reason": "\(failure.message)",
                "retry_in_s": "\(Bounds.wholeSeconds(delay.rounded(.up)))",
            ])
        return .failure(.refreshFailing(reason: failure.message, retryAfter: delay))
    }

    /// Commits the credential a shared account's narrowed refresh rotated (`record`, the row's
    /// with it) over the leased `row`, and the account takes the new row; `nil` then. One the
    /// database did not answer is kept to commit later (`keepPending`); short of a commit, the
    /// narrowed token is not served, and why comes back.
    private func commitNarrowed(_ record: AccountRecord, over row: SharedRow) async -> RefreshFailure? {
        let (committed, failure) = await commitWithinLease(record, share: row.share, over: row.version)
        guard let committed else {
            keepPending(record, share: row.share, over: row.version)
            return .transient("the fleet's database did not take the refresh: \(failure)")
        }
        guard committed else {
            if let moved = try? await fleet?.store.read(record.name) { adoptCommitted(moved) }
            return .transient("another host committed the account first")
        }
        guard let host = fleet?.store.host else { return nil }
        adoptCommitted(
            SharedRow(
                record: record, share: row.share, version: row.version + 1, leaseHolder: nil, lastRefreshedBy: host))
        return nil
    }

    // MARK: The refresh-token chain

    /// Waits until no other refresh of `name` runs, then holds the account's chain until
    /// `endChainTurn`. Turns are given in the order they were asked for.
    package func takeChainTurn(_ name: String) async {
        guard chainQueues[name] != nil else {
            chainQueues[name] = []
            return
        }
        await withCheckedContinuation { chainQueues[name, default: []].append($0) }
    }

    /// Hands the chain of `name` to the next refresh waiting, if any.
    package func endChainTurn(_ name: String) {
        guard var waiting = chainQueues[name] else { return }
        guard !waiting.isEmpty else {
            chainQueues[name] = nil
            return
        }
        let next = waiting.removeFirst()
        chainQueues[name] = waiting
        next.resume()
    }
}
